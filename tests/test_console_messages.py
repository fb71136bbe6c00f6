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


# --- the console's short words, each spelt out once where it appears ----------------------


def test_the_rank_tables_cut_short_headings_are_spelt_out(documents):
    lines = console.render(documents("1f1b")).splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("rank  busy ms"))
    assert "imbal" in lines[heading].split() and "ovhd" in lines[heading].split()
    legend = lines[heading + 7]  # heading, rule, four ranks, "all", then the legend
    assert legend.startswith("  (idle ms per cause") and legend.endswith(
        "imbal: stage imbalance, ovhd: overhead/other)"
    )


def test_the_critical_path_says_what_its_short_names_are(documents):
    lines = console.render(documents("1f1b")).splitlines()
    chain = next(i for i, line in enumerate(lines) if line.startswith("  r0:F0.0 > r1:F1.0"))
    assert lines[chain + 1] == "  (r0:F0.0 = rank 0's forward of stage 0, microbatch 0; B = backward)"
    # a zero-bubble schedule's path holds input-grad and weight-grad actions too
    zbv = console.render(documents("zbv"))
    assert "  (r0:F0.0 = rank 0's forward of stage 0, microbatch 0; I = input-grad; W = weight-grad)" in zbv


def test_replay_residual_and_placement_are_said_plainly(documents):
    text = console.render(documents("1f1b"))
    assert "  schedule: 1F1B  p=4 v=1 m=8  (loop placement: stage s on rank s mod p)\n" in text
    assert (
        "replay fidelity: 3 step(s) replayed, largest residual 0.0 ms "
        "(measured minus replayed step time; the causes rest on the replay)\n"
    ) in text
    zbv = console.render(documents("zbv"))
    assert "(v placement: rank r holds stages r and 2p-1-r; split backward)" in zbv
