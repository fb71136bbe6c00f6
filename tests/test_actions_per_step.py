"""reconstruct.whole_run._actions_per_step counts each step row's actions by (rank, step) codes;
the groupby and MultiIndex reindex it replaced is kept here as the reference."""

from __future__ import annotations

import random

import pandas as pd

from tracekit.reconstruct.whole_run import _actions_per_step


def _reference(steps: pd.DataFrame, actions: pd.DataFrame) -> list[int]:
    """REFERENCE: the pandas way."""
    counts = actions.groupby(["rank", "step"]).size()
    wanted = pd.MultiIndex.from_arrays([steps["rank"], steps["step"]])
    return [int(n) for n in counts.reindex(wanted, fill_value=0).tolist()]


def test_counts_equal_the_groupby_on_drawn_tables():
    rnd = random.Random(3)
    for _ in range(300):
        n_steps, n_actions = rnd.randint(0, 12), rnd.randint(0, 40)
        steps = pd.DataFrame(
            {"rank": [rnd.randint(-1, 3) for _ in range(n_steps)], "step": [rnd.randint(-1, 5) for _ in range(n_steps)]}
        ).astype("int64")
        actions = pd.DataFrame(
            {
                "rank": [rnd.randint(-1, 3) for _ in range(n_actions)],
                "step": [rnd.randint(-1, 5) for _ in range(n_actions)],
            }
        ).astype(rnd.choice(["int64", "int32"]))
        got = _actions_per_step(steps, actions)
        assert got == _reference(steps, actions), (steps, actions)
        assert all(type(n) is int for n in got)


def test_tables_without_integer_columns_take_the_groupby():
    steps = pd.DataFrame({"rank": [0, 1], "step": [3, 3]})
    actions = pd.DataFrame({"rank": pd.Series([], dtype=object), "step": pd.Series([], dtype=object)})
    assert _actions_per_step(steps, actions) == [0, 0]
    actions = pd.DataFrame({"rank": [0.0, 0.0, 1.0], "step": [3.0, 3.0, 3.0]})
    assert _actions_per_step(steps, actions) == _reference(steps, actions) == [2, 1]
