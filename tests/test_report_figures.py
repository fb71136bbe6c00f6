"""The figures the HTML report shows (tracekit.analyze.report_figures): computed from the
analysis, so the page only formats them; each adds up to the analysis it came from."""

from __future__ import annotations

import pytest

from conftest import SAMPLES
from tracekit.analyze.diagnosis import message_latencies
from tracekit.analyze.report_figures import (
    busy_per_step_ns,
    collective_idle,
    culprits,
    link_figures,
    place_means,
    rank_causes_ns,
    slowest_critical_path,
    stage_figures,
    step_figures,
)
from tracekit.vocab import CATEGORIES


def test_each_ranks_causes_add_up_to_its_attributed_idle(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "1f1b_slow_stage2")
    causes = rank_causes_ns(analysis)
    table = analysis.attribution.table
    assert list(causes) == list(analysis.summary.per_rank)
    for rank, by_cause in causes.items():
        assert list(by_cause) == list(CATEGORIES)
        assert sum(by_cause.values()) == int(table.loc[table["rank"] == rank, "idle_ns"].sum())
    assert causes[1]["imbalance"] > 0  # the ranks after the slow stage wait for it


def test_stage_and_link_blame_add_up_and_come_most_blamed_first(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "1f1b_slow_stage2")
    stages = stage_figures(analysis)
    blame = analysis.attribution.stage_blame
    assert sorted(s.stage for s in stages) == [0, 1, 2, 3]
    assert [s.blamed_ns for s in stages] == sorted((s.blamed_ns for s in stages), reverse=True)
    assert stages[0].stage == 2 and stages[0].rank == 2 and stages[0].vs_median > 1
    assert sum(s.blamed_ns for s in stages) == pytest.approx(blame["imbalance_ns"].sum())
    assert stages[0].idle_share == pytest.approx(stages[0].blamed_ns / analysis.summary.idle_ns)
    links = link_figures(analysis)
    assert [link.blamed_ns for link in links] == sorted((link.blamed_ns for link in links), reverse=True)
    assert sum(link.n_messages for link in links) == len(message_latencies(analysis))
    assert sum(link.blamed_ns for link in links) == pytest.approx(analysis.attribution.link_blame["comm_ns"].sum())


def test_the_critical_path_is_the_slowest_steps(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "1f1b")
    critical = slowest_critical_path(analysis)
    steps = analysis.attribution.steps
    slowest = max(steps, key=lambda s: s.measured_makespan_ns)
    assert critical.step == slowest.step and critical.makespan_ns == slowest.measured_makespan_ns
    assert critical.path == slowest.critical_path[::-1]
    assert critical.compute_ns == sum(p["compute_ns"] for p in slowest.critical_path) > 0
    assert 0 <= critical.comm_ns < critical.makespan_ns


def test_a_pipeline_spends_no_idle_in_collective_kernels_it_does_not_run(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "1f1b")
    found = collective_idle(analysis)
    assert found.per_rank == {} and found.total_ns == 0


def test_place_means_over_replicas_add_up_to_the_ranks(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "dp2_pp2")
    rollup = analysis.replicas
    per_rank = analysis.summary.per_rank
    places = place_means(analysis)
    n = rollup.n_replicas
    assert n == 2 and len(places) == len(rollup.places)
    assert sum(p.busy_ns for p in places) * n == pytest.approx(sum(per_rank[r].busy_ns for r in per_rank))
    assert sum(p.idle_ns for p in places) * n == pytest.approx(sum(per_rank[r].idle_ns for r in per_rank))
    for place, rolled in zip(places, rollup.places):
        assert sum(place.causes_ns.values()) * n == pytest.approx(sum(rolled.causes_ns.values()))
    per_step = busy_per_step_ns(analysis)
    assert per_step[0] * rollup.n_steps == pytest.approx(per_rank[0].busy_ns)


def test_each_steps_window_and_bubble_are_over_every_rank(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "dp2_pp2")
    steps = step_figures(analysis)
    bubbles = analysis.bubbles
    assert sorted(steps) == sorted(int(s) for s in bubbles["step"].unique())
    for step, figures in steps.items():
        rows = bubbles[bubbles["step"] == step]
        assert figures.start_ns == rows["window_start_ns"].min() and figures.end_ns == rows["window_end_ns"].max()
        assert figures.bubble_ratio == pytest.approx(rows["idle_ns"].sum() / rows["window_ns"].sum())


def test_idle_is_blamed_on_the_slow_stage_first(loaded_runs):
    _, analysis = loaded_runs(SAMPLES / "1f1b_slow_stage2")
    found = culprits(analysis)
    step = analysis.attribution.steps[-1]
    blamed = found[(1, step.step, "imbalance")]
    assert [c.blamed_ns for c in blamed] == sorted((c.blamed_ns for c in blamed), reverse=True)
    assert blamed[0].stage == 2 and blamed[0].stage_rank == 2 and blamed[0].link is None
    rows = step.stage_blame[step.stage_blame["rank"] == 1]
    assert sum(c.blamed_ns for c in blamed) == pytest.approx(rows["imbalance_ns"].sum())
    links = [c for (rank, s, cause), cs in found.items() if cause == "comm" for c in cs]
    assert all(c.link is not None and c.stage is None for c in links)
