"""Idle-time attribution: exact sums, theory on ideal schedules, and the injected faults."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLES, capture_of, sample_runs
from tracekit.analyze.attribution import CATEGORIES, apportion, attribute_step
from tracekit.analyze.replay import graph_from_run, idle_per_rank, replay
from tracekit.analyze.schedules import GENERATORS, graph_from_orders, one_f_one_b
from tracekit.analyze.theory import theoretical_bubble

RUNS = sample_runs()
IDS = [p.name for p in RUNS]


# --- exactness on every sample run -----------------------------------------------------


@pytest.mark.parametrize("run_dir", RUNS, ids=IDS)
def test_categories_sum_exactly_to_measured_idle(run_dir: Path, loaded_runs):
    _, analysis = loaded_runs(run_dir)
    table = analysis.attribution.table
    cats = table[[f"{c}_ns" for c in CATEGORIES]]
    assert len(table) == len(analysis.bubbles)
    assert (cats >= 0).all().all()
    assert (cats.sum(axis=1) == table["idle_ns"]).all()
    merged = table.merge(analysis.bubbles, on=["rank", "step"], suffixes=("", "_measured"))
    assert (merged["idle_ns"] == merged["idle_ns_measured"]).all()


@pytest.mark.parametrize("run_dir", RUNS, ids=IDS)
def test_replay_with_measured_inputs_reproduces_each_step(run_dir: Path, loaded_runs):
    run, analysis = loaded_runs(run_dir)
    for step in analysis.attribution.steps:
        assert abs(step.residual_ns) <= 0.001 * step.measured_makespan_ns, step.step
        graph = graph_from_run(run, step.step)
        result = replay(graph)
        assert np.array_equal(result.start, graph.measured_start)
        assert np.array_equal(result.end, graph.measured_end)


@pytest.mark.parametrize("run_dir", RUNS, ids=IDS)
def test_blame_adds_up_to_the_shares_it_explains(run_dir: Path, loaded_runs):
    _, analysis = loaded_runs(run_dir)
    att = analysis.attribution
    table = att.table.set_index(["rank", "step"])
    stages = att.stage_blame.groupby(["rank", "step"])["imbalance_ns"].sum()
    links = att.link_blame.groupby(["rank", "step"])["comm_ns"].sum()
    for key, row in table.iterrows():
        assert stages.get(key, 0) == row["imbalance_ns"]
        assert links.get(key, 0) == row["comm_ns"]


# --- theory: closed forms equal dependency-driven replays of ideal schedules ------------


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B", "Interleaved1F1B"])
@pytest.mark.parametrize("p, v, m", [(2, 1, 4), (4, 1, 8), (4, 2, 8), (4, 4, 8), (8, 2, 16), (3, 3, 9)])
def test_closed_form_bubble_equals_ideal_replay(schedule, p, v, m):
    if schedule != "Interleaved1F1B" and v > 1:
        v = 1
    chunk_f, chunk_b = 60 // v, 120 // v
    graph = graph_from_orders(GENERATORS[schedule](p, v, m), {"F": chunk_f, "B": chunk_b})
    result = replay(graph)
    makespan = result.makespan(0)
    idle = idle_per_rank(graph, result)
    theory = theoretical_bubble(schedule, p, v, m, chunk_f, chunk_b)
    expected = Fraction(p - 1, v * m + p - 1)
    assert theory.bubble_ratio == pytest.approx(float(expected), abs=1e-12)
    for r in range(p):
        assert Fraction(idle[r], makespan) == expected


def test_theory_numbers_from_the_docs():
    # pipeline-theory.md: p=4, m=8 gives 27.3% (v=1), 15.8% (v=2), 8.6% (v=4)
    assert round(theoretical_bubble("1F1B", 4, 1, 8).bubble_ratio, 3) == 0.273
    assert round(theoretical_bubble("Interleaved1F1B", 4, 2, 8).bubble_ratio, 3) == 0.158
    assert round(theoretical_bubble("Interleaved1F1B", 4, 4, 8).bubble_ratio, 3) == 0.086


# --- attribution on synthetic (generated) schedules with known faults --------------------


def _attribute_synthetic(graph):
    result = replay(graph)
    idle = idle_per_rank(graph, result)
    return attribute_step(graph, idle, result.makespan(graph.t0))


def test_synthetic_balanced_schedule_is_all_warmup_and_drain():
    att = _attribute_synthetic(graph_from_orders(one_f_one_b(4, 8), {"F": 100, "B": 200}))
    t = att.table
    assert (t["imbalance_ns"] == 0).all() and (t["comm_ns"] == 0).all() and (t["overhead_ns"] == 0).all()
    assert (t["warmup_ns"] + t["drain_ns"] == t["idle_ns"]).all()
    assert t["idle_ns"].tolist() == [900] * 4  # (p-1)(t_f+t_b)


def test_synthetic_slow_stage_is_blamed_for_the_others_idle():
    graph = graph_from_orders(one_f_one_b(4, 8), {"F": 100, "B": 200})
    graph.dur = np.where(graph.stage == 2, graph.dur * 2, graph.dur)
    att = _attribute_synthetic(graph)
    t = att.table.set_index("rank")
    for r in (0, 1, 3):
        non_fill = t.loc[r, "idle_ns"] - t.loc[r, "warmup_ns"] - t.loc[r, "drain_ns"]
        assert t.loc[r, "imbalance_ns"] >= 0.9 * non_fill > 0
    assert t.loc[2, "imbalance_ns"] == 0
    blamed = att.stage_blame.groupby("stage")["imbalance_ns"].sum()
    assert blamed.idxmax() == 2 and blamed[2] == blamed.sum()


def test_synthetic_slow_link_is_blamed_on_that_link():
    graph = graph_from_orders(one_f_one_b(4, 8), {"F": 100, "B": 200})
    links = graph.edge_links()
    graph.edge_lat = np.array([50 if link == (1, 2) else 0 for link in links], dtype=np.int64)
    att = _attribute_synthetic(graph)
    assert att.table["comm_ns"].sum() > 0
    blamed = att.link_blame.groupby(["src_rank", "dst_rank"])["comm_ns"].sum()
    assert list(blamed.index) == [(1, 2)]


def test_shapley_does_not_depend_on_removal_order():
    # Two interacting causes: latency on every link and a slow stage. The Shapley split is
    # symmetric by construction; check efficiency (sum) and that swapping which cause is
    # larger swaps the shares accordingly.
    base = graph_from_orders(one_f_one_b(4, 8), {"F": 100, "B": 200}, latency_ns=40)
    base.dur = np.where(base.stage == 1, base.dur + 60, base.dur)
    att = _attribute_synthetic(base)
    for r, signed in att.signed_shapley.items():
        ideal = att.ideal_idle_ns[r]
        total = att.table.set_index("rank").loc[r, "idle_ns"]
        assert sum(signed.values()) == pytest.approx(total - ideal, abs=1e-6)


def test_apportion_is_exact_and_proportional():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3] or sum(apportion(10, [1, 1, 1])) == 10
    assert apportion(0, [1, 2]) == [0, 0]
    assert apportion(7, [0, 0]) == [0, 7]
    assert apportion(100, [3, -5, 1]) == [75, 0, 25]


# --- the captured runs with injected faults ---------------------------------------------


def _fault_run(name, loaded_runs):
    run_dir = SAMPLES / name
    if not (run_dir / "capture.json").exists():
        pytest.fail(f"sample run {name} is missing")
    return loaded_runs(run_dir)


def test_captured_slow_stage_is_blamed(loaded_runs):
    run, analysis = _fault_run("1f1b_slow_stage2", loaded_runs)
    slow = capture_of(SAMPLES / "1f1b_slow_stage2")["faults"]["slow_stage"]
    t = analysis.attribution.table.groupby("rank").sum()
    for r in t.index:
        non_fill = t.loc[r, "idle_ns"] - t.loc[r, "warmup_ns"] - t.loc[r, "drain_ns"] - t.loc[r, "schedule_gaps_ns"]
        if r == slow:
            assert t.loc[r, "imbalance_ns"] <= 0.05 * t.loc[r, "idle_ns"]
        else:
            assert t.loc[r, "imbalance_ns"] >= 0.6 * non_fill
    blamed = analysis.attribution.stage_blame.groupby("stage")["imbalance_ns"].sum()
    assert blamed.idxmax() == slow and blamed[slow] >= 0.9 * blamed.sum()


def test_captured_p2p_delay_shows_as_comm_on_the_delayed_links(loaded_runs):
    _, base = _fault_run("1f1b", loaded_runs)
    _, delayed = _fault_run("1f1b_p2p_delay5ms", loaded_runs)
    comm_growth = delayed.attribution.table["comm_ns"].sum() - base.attribution.table["comm_ns"].sum()
    window_growth = delayed.summary.window_ns - base.summary.window_ns  # summed over ranks
    assert 0.6 * window_growth <= comm_growth <= 1.2 * window_growth
    links = delayed.attribution.link_blame.groupby(["src_rank", "dst_rank"])["comm_ns"].sum()
    # every send was delayed: every pipeline link carries blame
    assert set(links.index) == {(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)}


def test_captured_balanced_run_is_mostly_fill_and_drain(loaded_runs):
    _, analysis = _fault_run("1f1b", loaded_runs)
    t = analysis.attribution.table.sum()
    idle = t["idle_ns"]
    assert (t["warmup_ns"] + t["drain_ns"]) / idle >= 0.75
    assert t["imbalance_ns"] / idle <= 0.1
    measured = analysis.summary.bubble_ratio
    assert abs(measured - analysis.theory.bubble_ratio) <= 0.06


@pytest.mark.parametrize("run_dir", RUNS, ids=IDS)
def test_shaded_idle_intervals_match_the_attribution_exactly(run_dir: Path, loaded_runs):
    from tracekit.analyze.intervals import idle_intervals

    _, analysis = loaded_runs(run_dir)
    shaded = idle_intervals(analysis)
    shaded["length"] = shaded["end_ns"] - shaded["start_ns"]
    drawn = shaded.groupby(["rank", "step", "cause"])["length"].sum()
    for row in analysis.attribution.table.itertuples(index=False):
        for cause in CATEGORIES:
            assert drawn.get((row.rank, row.step, cause), 0) == getattr(row, f"{cause}_ns"), (row.rank, row.step, cause)
