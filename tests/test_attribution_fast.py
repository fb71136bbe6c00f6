"""``attribute_step``, its per-rank work laid out as matrix rows, equals the rank-by-rank
version it replaced (``tests/attribution_reference.py``) on every step of every sample run
and on generated schedules: random durations, latencies and overheads, several pipeline
replicas, per-rank windows, and few blame replays (so that ranks fall back to their
replica's links)."""

from __future__ import annotations

from dataclasses import replace

import attribution_reference as ref
import numpy as np
import pandas.testing as pdt
import pytest

from conftest import sample_runs
from tracekit.analyze import attribution
from tracekit.analyze.replay import StepGraph, idle_per_rank, replay
from tracekit.analyze.schedules import GENERATORS, graph_from_orders


def _same(fast, slow) -> None:
    pdt.assert_frame_equal(fast.table, slow.table)
    pdt.assert_frame_equal(fast.stage_blame, slow.stage_blame)
    pdt.assert_frame_equal(fast.link_blame, slow.link_blame)
    assert fast.signed_shapley == slow.signed_shapley
    assert fast.ideal_idle_ns == slow.ideal_idle_ns
    assert fast.critical_path == slow.critical_path
    assert (fast.replay_makespan_ns, fast.measured_makespan_ns, fast.ideal_makespan_ns) == (
        slow.replay_makespan_ns,
        slow.measured_makespan_ns,
        slow.ideal_makespan_ns,
    )
    assert fast.notes == slow.notes


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_attribution_equals_the_rank_by_rank_version_on_every_sample(loaded_runs, run_dir):
    _, analysis = loaded_runs(run_dir)
    if analysis.attribution is None:
        pytest.skip(f"{run_dir.name}: no attribution")
    bubbles = analysis.bubbles
    for step, graph in analysis.attribution.graphs.items():
        rows = bubbles[bubbles["step"] == step]
        idle = {int(r): int(i) for r, i in zip(rows["rank"], rows["idle_ns"])}
        makespan = int(rows["window_ns"].max())
        _same(attribution.attribute_step(graph, idle, makespan), ref.attribute_step(graph, idle, makespan))


def generated_replicas(rng: np.random.Generator, schedule: str, p: int, v: int, m: int, replicas: int) -> StepGraph:
    """Generated (not captured): ``replicas`` copies of one schedule side by side on ranks
    of their own, each action's duration, overhead and each message's latency at random."""
    parts = [
        graph_from_orders(GENERATORS[schedule](p, v, m), {"F": 100, "B": 200, "I": 120, "W": 80})
        for _ in range(replicas)
    ]
    offset, fields = 0, {k: [] for k in ("rank", "stage", "kind", "microbatch", "prev", "edge_src", "edge_dst")}
    for k, g in enumerate(parts):
        fields["rank"].append(g.rank + k * p)
        fields["stage"].append(g.stage)
        fields["kind"].append(g.kind)
        fields["microbatch"].append(g.microbatch)
        fields["prev"].append(np.where(g.prev >= 0, g.prev + offset, -1))
        fields["edge_src"].append(g.edge_src + offset)
        fields["edge_dst"].append(g.edge_dst + offset)
        offset += len(g.rank)
    joined = {k: np.concatenate(v) for k, v in fields.items()}
    n, e = len(joined["rank"]), len(joined["edge_src"])
    slow = np.where(joined["stage"] == rng.integers(0, p), rng.integers(1, 4), 1)
    return StepGraph(
        step=0,
        t0=0,
        action_id=np.arange(n),
        dur=(np.where(joined["kind"] == "F", 100, 200) * slow + rng.integers(0, 40, n)).astype(np.int64),
        ovh=(rng.integers(0, 3, n) * rng.integers(0, 30, n)).astype(np.int64),
        edge_lat=(rng.integers(0, 2, e) * rng.integers(0, 60, e)).astype(np.int64),
        edge_msg=np.arange(e),
        **joined,
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("blame_replays", [1, 3, 32])
def test_generated_replicas_attribute_as_rank_by_rank(monkeypatch, seed, blame_replays):
    rng = np.random.default_rng(seed)
    schedule = ["GPipe", "1F1B", "Interleaved1F1B", "ZB-H1"][seed % 4]
    p = int(rng.integers(1, 5))  # one stage: a step with no links
    v = 2 if schedule == "Interleaved1F1B" else 1
    graph = generated_replicas(rng, schedule, p, v, 2 * p, int(rng.integers(1, 4)))
    if seed % 3 == 0:  # per-rank windows, as a flush-free pipeline's
        graph = replace(graph, rank_start={int(r): -int(rng.integers(0, 500)) for r in np.unique(graph.rank)})
    result = replay(graph)
    idle = idle_per_rank(graph, result)
    makespan = max(graph.window_ns(result).values())
    monkeypatch.setattr(attribution, "MAX_BLAME_REPLAYS", blame_replays)
    monkeypatch.setattr(ref, "MAX_BLAME_REPLAYS", blame_replays)
    fast, slow = attribution.attribute_step(graph, idle, makespan), ref.attribute_step(graph, idle, makespan)
    _same(fast, slow)
    assert fast.table["idle_ns"].sum() > 0


@pytest.mark.parametrize("seed", range(30))
def test_generated_rows_apportion_as_one_row_at_a_time(seed):
    rng = np.random.default_rng(seed)
    parts = int(rng.integers(1, 40))
    weights = rng.random((20, parts)) * rng.choice([1e-3, 1.0, 1e6, 1e12], (20, parts))
    weights[rng.random((20, parts)) < 0.3] = 0.0
    weights[0] = 0.0
    weights[1] = -weights[1]  # negative weights count as 0
    totals = rng.integers(-5, 10**9, 20)
    expected = [ref._apportioned(int(t), w).tolist() for t, w in zip(totals, weights)]
    assert attribution._apportioned_rows(totals, weights).tolist() == expected


def test_attribute_replays_steps_side_by_side_and_gives_each_step_what_it_gives_alone():
    """attribute() replays the run's steps together (replay_steps); each step's attribution
    is the one attribute_step gives the step alone, on a real capture of 3 steps."""
    from conftest import SAMPLES
    from tracekit import load
    from tracekit.analyze.bubbles import measure_pipeline

    run = load(SAMPLES / "1f1b_slow_stage2")
    bubbles = measure_pipeline(run.actions[run.actions["step"] >= 0])
    together = attribution.attribute(run, bubbles)
    assert len(together.steps) == 3
    for step in together.steps:
        graph = together.graphs[step.step]
        rows = bubbles[bubbles["step"] == step.step]
        idle = {int(r): int(i) for r, i in zip(rows["rank"], rows["idle_ns"])}
        _same(step, attribution.attribute_step(graph, idle, int(rows["window_ns"].max())))
