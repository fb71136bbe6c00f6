"""The measured step graphs, built from every message and action at once, equal the
message-by-message build they replaced (``tests/replay_reference.py``) on every step of
every sample run (per-rank windows for the flush-free one) and on generated messages:
several messages for one (producer, consumer), messages that arrive after their consumer
started, inputs from outside the step, actions that share a (kind, stage, microbatch)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pandas as pd
import pytest

import replay_reference as ref
from conftest import sample_runs
from tracekit.analyze.bubbles import continuous_windows
from tracekit.analyze.replay import StepGraph, dependency_pairs, graph_from_run
from tracekit.model.run import Run


def _same(fast: StepGraph, slow: StepGraph) -> None:
    for f in fields(StepGraph):
        if f.name == "level_plan":
            continue
        a, b = getattr(fast, f.name), getattr(slow, f.name)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert np.asarray(a).tolist() == np.asarray(b).tolist(), f.name
            assert np.asarray(a).dtype == np.asarray(b).dtype, f.name
        else:
            assert a == b, f.name


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_step_graphs_equal_the_message_by_message_build_on_every_sample(loaded_runs, run_dir):
    run, _ = loaded_runs(run_dir)
    if not run.is_pipeline:
        pytest.skip(f"{run_dir.name}: not a pipeline")
    windows = None
    if run.schedule is not None and run.schedule.flush_free:
        windows = continuous_windows(run.actions[run.actions["step"] >= 0], run.steps)
    for step in sorted(set(run.actions["step"].tolist()) - {-1}):
        starts = None
        if windows is not None:
            mine = windows[windows["step"] == step]
            starts = {int(r): int(t) for r, t in zip(mine["rank"], mine["window_start_ns"])}
        _same(graph_from_run(run, step, rank_start=starts), ref.graph_from_run(run, step, rank_start=starts))


@pytest.mark.parametrize("seed", range(40))
def test_generated_messages_build_the_same_graph(seed):
    # Generated (not captured): 3 ranks' actions of one step at random times, and messages
    # between random actions, some repeated, some from actions outside the step.
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 40)), int(rng.integers(0, 60))
    start = rng.integers(0, 10, n) * 1_000 + rng.integers(0, 3, n)
    actions = pd.DataFrame(
        {
            "action_id": rng.permutation(n) + 5,
            "rank": rng.integers(0, 3, n),
            "step": 0,
            "kind": rng.choice(["F", "B", "I", "W"], n),
            "stage": rng.integers(0, 3, n),
            "microbatch": rng.integers(0, 3, n),
            "start_ns": start,
            "end_ns": start + rng.integers(0, 3_000, n),
        }
    )
    producer = rng.integers(0, n + 8, m)
    device = seed % 3 == 0
    messages = pd.DataFrame(
        {
            "msg_id": np.arange(m),
            "step": 0,
            "producer_action": producer,
            "consumer_action": rng.integers(3, n + 6, m),
            "arrival_ns": rng.integers(0, 12_000, m),
        }
    )
    if device:
        messages["leave_ns"] = np.where(rng.random(m) < 0.3, -1, rng.integers(0, 12_000, m))
        messages["transfer_ns"] = np.where(rng.random(m) < 0.3, -1, rng.integers(0, 500, m))
        messages["recv_post_ns"] = rng.integers(0, 12_000, m)  # where the receive was posted
    run = Run(source="generated", files=[], events=pd.DataFrame(), actions=actions, messages=messages)
    starts = {r: -int(rng.integers(0, 900)) for r in range(3)} if seed % 2 else None
    _same(graph_from_run(run, 0, rank_start=starts), ref.graph_from_run(run, 0, rank_start=starts))
    arrays = (actions["rank"].to_numpy(), actions["stage"].to_numpy(), actions["kind"].to_numpy())
    assert dependency_pairs(*arrays, actions["microbatch"].to_numpy()) == ref.dependency_pairs(
        *arrays, actions["microbatch"].to_numpy()
    )
