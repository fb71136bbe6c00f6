"""model.run: a Run's tables it was not given are empty tables of their columns, each its own
(copied from one made once per column list: filling one run's must not fill another's)."""

from __future__ import annotations

import pandas as pd

from tracekit.model.run import ACTION_COLUMNS, MESSAGE_COLUMNS, STEP_COLUMNS, Run


def _run() -> Run:
    return Run(source="generated", files=[], events=pd.DataFrame())


def test_default_tables_are_empty_with_their_columns():
    run = _run()
    for table, columns in ((run.actions, ACTION_COLUMNS), (run.messages, MESSAGE_COLUMNS), (run.steps, STEP_COLUMNS)):
        assert list(table.columns) == columns and len(table) == 0


def test_each_run_gets_its_own_default_tables():
    first = _run()
    first.steps.loc[0] = list(range(len(STEP_COLUMNS)))
    first.actions["extra"] = []
    second = _run()
    assert len(second.steps) == 0 and list(second.actions.columns) == ACTION_COLUMNS
    assert first.steps is not second.steps
