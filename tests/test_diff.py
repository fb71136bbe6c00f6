"""tracekit diff: what changed between two runs, the change that matters most first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit.analyze.compare import Measures, compare, measure
from tracekit.cli import main


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cached(monkeypatch, loaded_runs):
    """The command reads runs from the session's cache: loading is most of its time."""
    monkeypatch.setattr("tracekit.commands.diff.load_with_progress", lambda path, *_: loaded_runs(Path(path))[0])


def test_a_slow_stage_is_what_matters_most():
    # the real command end to end, no cache
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b_slow_stage2", "--no-progress")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("matters most: stage imbalance +") and "stage 2 (rank 2)" in first
    assert "by cause (share of the step window)" in result.output and "by rank (bubble ratio)" in result.output


def test_a_late_send_is_comm_latency(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("matters most: comm latency +") and "link " in first


def test_json_ranks_the_deltas_and_they_add_up(cached, loaded_runs):
    a, b = SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms"
    result = cli("diff", a, b, "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    causes = doc["causes"]
    assert [abs(c["delta"]) for c in causes] == sorted((abs(c["delta"]) for c in causes), reverse=True)
    assert doc["matters_most"]["key"] == causes[0]["key"] == "comm"
    # cause shares add up to the bubble ratio, so their changes add up to its change
    assert sum(c["delta"] for c in causes) == pytest.approx(doc["bubble_ratio"]["delta"], abs=1e-5)
    expected = measure(loaded_runs(b)[1]).bubble_ratio - measure(loaded_runs(a)[1]).bubble_ratio
    assert doc["bubble_ratio"]["delta"] == pytest.approx(expected, abs=1e-6)
    assert len(doc["ranks"]) == 4 and doc["same_schedule"] and doc["headline"].startswith("matters most: comm")


def test_different_schedules_compare_by_share_of_the_window(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "interleaved1f1b", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["same_schedule"] is False
    assert any(n.startswith("schedules differ (1F1B p=4 v=1 m=8 vs Interleaved1F1B p=4 v=2 m=8)") for n in doc["notes"])
    assert len(doc["causes"]) == 6 and doc["stages"] == []     # stage numbers mean other things
    console = cli("diff", SAMPLES / "1f1b", SAMPLES / "interleaved1f1b")
    assert "note: schedules differ" in console.output


def test_a_run_against_itself_changes_nothing(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b", "--json")
    doc = json.loads(result.stdout)
    assert doc["matters_most"] is None and doc["headline"].startswith("matters most: nothing")
    assert all(c["delta"] == 0 for c in doc["causes"] + doc["ranks"] + doc["links"])


def test_across_formats_kineto_against_nsys(cached):
    nsys = shared_or_skip("nsys", "nsysai_mfu_2gpu_before.sqlite")
    result = cli("diff", SAMPLES / "1f1b", nsys)
    assert result.exit_code == 0, result.output
    assert "trace formats differ (kineto vs nsys-sqlite)" in result.output
    assert "no per-rank comparison" in result.output and "no per-cause comparison" in result.output
    assert result.output.startswith("matters most: bubble ratio")


def _measures(ranks: dict[int, float], causes: dict[str, float] | None = None, name="1F1B", p=2) -> Measures:
    return Measures(source=f"{name}-{len(ranks)}", formats=["kineto"], schedule={"name": name, "p": p, "v": 1, "m": 4},
                    n_steps=1, step_ns=1e8, bubble_ratio=sum(ranks.values()) / len(ranks), rank_bubble=ranks,
                    cause_share=causes or {})


def test_different_pipeline_sizes_have_no_per_rank_rows():
    shares = {"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.0, "overhead": 0.0}
    more_comm = {**shares, "comm": 0.08}
    c = compare(_measures({0: 0.2, 1: 0.2}, shares), _measures({0: 0.3, 1: 0.3, 2: 0.25, 3: 0.25}, more_comm, p=4))
    assert c.ranks == [] and c.rank_causes == {}
    assert any("ranks differ (2 vs 4)" in n for n in c.notes) and any("schedules differ" in n for n in c.notes)
    assert c.headline().startswith("matters most: comm latency +8.0 points")


def test_small_changes_are_noise():
    shares = {"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.05, "overhead": 0.0}
    nudged = {**shares, "comm": 0.053}
    c = compare(_measures({0: 0.25, 1: 0.25}, shares), _measures({0: 0.253, 1: 0.253}, nudged))
    assert c.matters_most() is None
    moved = compare(_measures({0: 0.25, 1: 0.25}, shares), _measures({0: 0.26, 1: 0.26}, {**shares, "comm": 0.06}))
    assert moved.matters_most().key == "comm"
