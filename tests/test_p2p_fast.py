"""The vectorised message matching of ``tracekit.reconstruct.p2p`` (receive done times,
producer/consumer links, arrivals) equals the per-message loops it replaced
(``tests/p2p_reference.py``), on every sample run and on generated edge cases: actions
that start together (the order a sort gives ties), actions that end out of start order,
receives of two threads sharing candidate annotations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

import p2p_reference as ref
from conftest import sample_runs
from tracekit.reconstruct import p2p


def _both(monkeypatch, call):
    """``call()`` with the vectorised functions, then with the reference loops."""
    fast = call()
    with monkeypatch.context() as m:
        m.setattr(p2p, "_recv_done_times", ref._recv_done_times)
        m.setattr(p2p, "_link_actions", ref._link_actions)
        m.setattr(p2p, "estimate_arrivals", ref.estimate_arrivals)
        m.setattr(p2p, "host_p2p_ops", ref.host_p2p_ops)
        slow = call()
    return fast, slow


@pytest.fixture(scope="module")
def runs():
    from tracekit import load

    return {run_dir.name: load(run_dir) for run_dir in sample_runs()}


@pytest.mark.parametrize("name", [p.name for p in sample_runs()])
@pytest.mark.parametrize("by_kind", [False, True])
def test_matching_equals_the_per_message_loops_on_every_sample(runs, monkeypatch, name, by_kind):
    run = runs[name]
    if run.actions.empty:
        pytest.skip(f"{name}: no actions")

    def call():
        messages, warnings = p2p.match_messages(run.events, run.steps, run.actions, consumer_by_kind=by_kind)
        if messages.empty:
            return messages, warnings, messages
        return messages, warnings, p2p.estimate_arrivals(messages, run.actions, run.events)

    (fast, fast_warnings, fast_arrivals), (slow, slow_warnings, slow_arrivals) = _both(monkeypatch, call)
    assert fast_warnings == slow_warnings
    pdt.assert_frame_equal(fast, slow)
    pdt.assert_frame_equal(fast_arrivals, slow_arrivals)
    if len(fast):
        assert (fast["producer_action"] >= 0).any() and (fast["consumer_action"] >= 0).any()


def generated_actions(rng: np.random.Generator, n: int, ranks: int, steps: int) -> pd.DataFrame:
    """Generated (not captured) actions: few distinct start times, so many start together;
    durations at random, so ends come out of start order; kinds F, B, I and W."""
    start = rng.integers(0, max(2, n // 3), n) * 10_000
    return pd.DataFrame(
        {
            "action_id": rng.permutation(n).astype(np.int64),
            "rank": rng.integers(0, ranks, n),
            "step": rng.integers(-1, steps, n),
            "kind": rng.choice(["F", "B", "I", "W"], n),
            "start_ns": start.astype(np.int64),
            "end_ns": (start + rng.integers(0, 200_000, n)).astype(np.int64),
        }
    )


def generated_messages(rng: np.random.Generator, n: int, ranks: int, steps: int, span_ns: int) -> pd.DataFrame:
    """Generated (not captured) messages between random ranks at random times."""
    post = rng.integers(0, span_ns, n)
    step = rng.integers(-1, steps, n)
    return pd.DataFrame(
        {
            "src_rank": rng.integers(0, ranks, n),
            "dst_rank": rng.integers(0, ranks, n),
            "step": step,
            "dst_step": step + rng.integers(0, 2, n),
            "send_post_ns": post,
            "recv_post_ns": post + rng.integers(-50_000, 50_000, n),
            "recv_done_ns": post + rng.integers(0, 300_000, n),
            "dst_tid": rng.integers(1, 4, n),
        }
    ).astype("int64")


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("by_kind", [False, True])
def test_generated_links_equal_the_loops_with_ties_and_ends_out_of_order(seed, by_kind):
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(1, 6))
    actions = generated_actions(rng, int(rng.integers(0, 120)), ranks, 3)
    messages = generated_messages(rng, int(rng.integers(1, 80)), ranks + 1, 3, 500_000)
    if seed % 4 == 0:
        messages = messages.drop(columns="dst_step")
    fast, slow = messages.copy(), messages.copy()
    p2p._link_actions(fast, actions, by_kind)
    ref._link_actions(slow, actions, by_kind)
    pdt.assert_frame_equal(fast, slow)


def test_generated_ties_are_ordered_as_the_groups_sort_gives_them():
    # 40 actions of one rank and step, starting at 3 distinct times: which of those that start
    # together is first or last is the order numpy's quicksort gives the group's rows.
    rng = np.random.default_rng(7)
    actions = generated_actions(rng, 40, 1, 1).assign(step=0, start_ns=lambda f: f["start_ns"] % 30_000)
    order = p2p._by_rank_step(actions)
    expected = actions.sort_values("start_ns").index.to_numpy()
    assert order.tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_generated_done_times_equal_the_loop_with_threads_sharing_annotations(seed):
    rng = np.random.default_rng(seed)
    n, ranks = int(rng.integers(1, 60)), int(rng.integers(1, 4))
    start = rng.integers(0, 400_000, n)
    recvs = pd.DataFrame(
        {"rank": rng.integers(0, ranks, n), "start_ns": start, "end_ns": start + rng.integers(0, 100_000, n)}
    ).sort_values("start_ns")
    k = int(rng.integers(0, 80))
    a_start = rng.integers(0, 500_000, k)
    events = pd.DataFrame(
        {
            "name": rng.choice(["gloo:recv", "gloo:send", "c10d::recv_"], k),
            "on_gpu": rng.random(k) < 0.1,
            "rank": rng.integers(0, ranks + 1, k),
            "start_ns": a_start,
            "end_ns": a_start + rng.integers(0, 150_000, k),
        }
    )
    assert p2p._recv_done_times(events, recvs).tolist() == ref._recv_done_times(events, recvs).tolist()


def test_generated_receives_sharing_an_annotation_take_them_in_turn():
    # Two threads of rank 0 receive at once: both recv_ ops hold both annotations. The first
    # receive in table order takes the first annotation, the second the next one.
    recvs = pd.DataFrame({"rank": [0, 0, 1], "start_ns": [0, 10, 0], "end_ns": [100, 100, 50]})
    events = pd.DataFrame(
        {
            "name": ["gloo:recv"] * 3,
            "on_gpu": [False] * 3,
            "rank": [0, 0, 1],
            "start_ns": [20, 30, 5],
            "end_ns": [150, 120, 70],
        }
    )
    assert p2p._recv_done_times(events, recvs).tolist() == [150, 120, 70]


@pytest.mark.parametrize("seed", range(40))
def test_generated_arrivals_equal_the_loop(seed):
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(1, 5))
    actions = generated_actions(rng, int(rng.integers(0, 100)), ranks, 2)
    if len(actions) > 2 and seed % 3 == 0:  # an id twice: its last row's end counts
        actions.loc[actions.index[-1], "action_id"] = actions["action_id"].iloc[0]
    messages = generated_messages(rng, int(rng.integers(1, 60)), ranks + 1, 2, 400_000)
    messages = messages.assign(
        msg_id=np.arange(len(messages)),
        tag=0,
        nbytes=8,
        direction="fwd",
        recv_wait_ns=0,
        arrival_ns=messages["recv_done_ns"],
        producer_action=rng.integers(-1, len(actions) + 3, len(messages)),
        consumer_action=-1,
        src_file_id=0,
        src_source_index=0,
        dst_file_id=0,
        dst_source_index=0,
    )
    k = int(rng.integers(0, 100))
    c_start = rng.integers(0, 500_000, k)
    events = pd.DataFrame(
        {
            "name": rng.choice(["c10d::recv_", "record_param_comms", "aten::mm", "c10d::send"], k),
            "on_gpu": rng.random(k) < 0.1,
            "rank": rng.integers(0, ranks + 1, k),
            "tid": rng.integers(1, 4, k),
            "start_ns": c_start,
            "end_ns": c_start + rng.integers(0, 150_000, k),
        }
    )
    pdt.assert_frame_equal(
        p2p.estimate_arrivals(messages, actions, events), ref.estimate_arrivals(messages, actions, events)
    )


@pytest.mark.parametrize("seed", range(40))
def test_generated_nested_p2p_ranges_fold_as_the_loop_folds_them(seed):
    # Generated (not captured): NCCL-style nested and overlapping send/recv ranges on a few
    # threads, sends and receives interleaved, peers and sizes known on some ranges only.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    start = rng.integers(0, 50, n) * 100
    names = rng.choice(
        [
            "c10d::send",
            "record_param_comms:send",
            "c10d::recv_",
            "record_param_comms:recv",
            "nccl:send 0->1",
            "nccl:recv 1<-0",
            "aten::mm",
        ],
        n,
    )
    events = pd.DataFrame(
        {
            "name": names,
            "on_gpu": rng.random(n) < 0.1,
            "rank": rng.integers(0, 2, n),
            "tid": rng.integers(1, 3, n),
            "start_ns": start,
            "end_ns": start + rng.integers(0, 8, n) * 100,
            "peer": np.where(rng.random(n) < 0.5, -1, rng.integers(0, 2, n)),
            "nbytes": np.where(rng.random(n) < 0.5, -1, rng.integers(1, 9, n) * 1024),
        }
    )
    pdt.assert_frame_equal(p2p.host_p2p_ops(events), ref.host_p2p_ops(events))
