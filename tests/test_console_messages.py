"""What the console says besides its figures: that findings were left out, and what its
short words mean (issue #28: every figure a user reads is right, complete and plainly said).

Inputs: the real sample captures in sample_traces/, analysed once per session."""

from __future__ import annotations

import copy

import pytest

from conftest import SAMPLES
from tracekit.render import console
from tracekit.render.json import to_document


@pytest.fixture(scope="module")
def documents():
    """Each sample's analysis document, made once for the module."""
    from tracekit import load
    from tracekit.analyze import analyze

    made: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in made:
            made[name] = to_document(analyze(load(SAMPLES / name)))
        return copy.deepcopy(made[name])

    return get


def _actionable(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] != "info"]


def test_findings_left_out_are_counted(documents):
    doc = documents("1f1b")
    assert len(_actionable(doc)) == 4  # fill/drain, comm, overhead, imbalance
    text = console.render(doc)
    shown = [line for line in text.splitlines() if line.startswith("  [")]
    assert len(shown) == 3
    assert "  +1 more (--json, report)" in text.splitlines()
    # the line sits under the last finding shown, before the causes
    assert text.index(shown[-1]) < text.index("+1 more") < text.index("where the idle time goes:")


def test_no_count_when_every_finding_is_shown(documents):
    doc = documents("1f1b")
    actionable = _actionable(doc)
    info = {**actionable[-1], "severity": "info", "headline": "an info finding"}
    doc["findings"] = actionable[:3] + [info]  # info findings are never on the console
    text = console.render(doc)
    assert "more (--json, report)" not in text and "an info finding" not in text
