"""Unlabelled runs (native Schedule1F1B, and what Megatron-core and DeepSpeed leave): every
action found, in the order the schedule ran, from op runs and P2P alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import SAMPLES, capture_of
from tracekit.ingest import read_run
from tracekit.reconstruct.whole_run import reconstruct

UNLABELLED_1F1B = ["1f1b", "1f1b_slow_stage2", "1f1b_p2p_delay5ms", "1f1b_real", "nsys_1f1b"]


def one_f_one_b(rank: int, p: int, m: int) -> list[tuple[str, int]]:
    """What torch's Schedule1F1B executes on ``rank`` (as the traces show it: see
    sample_traces/README.md on the off-by-one in its _get_pipeline_order)."""
    warmup = min(p - 1 - rank, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def _orders(run) -> dict[tuple[int, int], list[tuple[str, int]]]:
    return {
        (int(r), int(s)): [(k, int(mb)) for k, mb in zip(g["kind"], g["microbatch"])]
        for (r, s), g in run.actions.sort_values("start_ns").groupby(["rank", "step"])
    }


def _check_every_action(run, p: int, m: int, name: str) -> None:
    assert run.actions_from == "segmentation"
    assert (run.schedule.name, run.schedule.p, run.schedule.v, run.schedule.m) == ("1F1B", p, 1, m), name
    orders = _orders(run)
    steps = sorted({s for _, s in orders})
    assert len(steps) == 3, name
    for rank in range(p):
        for step in steps:
            assert orders[(rank, step)] == one_f_one_b(rank, p, m), f"{name}: rank {rank} step {step}"
    assert (run.actions["stage"] == run.actions["rank"]).all()


@pytest.mark.parametrize("name", UNLABELLED_1F1B)
def test_every_action_of_an_unlabelled_capture_is_found_in_order(loaded_runs, name):
    run, _ = loaded_runs(SAMPLES / name)
    manifest = capture_of(SAMPLES / name)
    _check_every_action(run, manifest["p"], manifest["m"], name)


def test_sends_from_a_sender_thread_never_merge_neighbouring_actions():
    """1f1b_p2p_delay5ms posts every send from a sender thread; the main thread leaves a
    `tracekit:p2p_delay` marker where the send was requested. Without the markers (dropped
    here from the real trace before reconstruction, as a framework with an async sender
    would leave it) nothing on the main thread separates rank 0's warm-up forwards: the
    autograd numbers must."""
    run = read_run(SAMPLES / "1f1b_p2p_delay5ms")
    markers = run.events["name"] == "tracekit:p2p_delay"
    assert markers.sum() > 0
    run = reconstruct(replace(run, events=run.events[~markers].reset_index(drop=True)))
    _check_every_action(run, 4, 8, "1f1b_p2p_delay5ms without markers")
