"""``held_back_ns``, every message searched among its sender thread's receive completions
at once, equals the message-by-message version it replaced (kept below as it was at
tracekit 1b5124f) on every sample run (DeepSpeed's holds sends back) and on generated
messages (threads that receive and send, unknown threads)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import sample_runs
from tracekit.analyze.costs import held_back_ns
from tracekit.model.run import Run


def reference_held_back_ns(run: Run) -> dict[int, int]:
    """msg_id -> how long the sender held the send back after its producer ended, for sends
    posted behind a receive of the sender's own: on the thread of a receive that completed
    between the producer's end and the send's post. DeepSpeed's TrainSchedule posts a
    forward's activation in the next schedule step, behind that step's RecvGrad (the last
    warm-up activation leaves only once gradient 0 is back: 27-87 ms on sample_traces/
    deepspeed_1f1b); pooled as link latency, that wait landed on other messages in the
    replay and put the model 12 points high. torch's and Megatron's schedules post right
    after the producer (none held back on any sample); a send posted late by another thread
    (``--p2p-delay-ms``'s sender) is link latency as the receiver sees it and is kept."""
    msgs = run.messages[(run.messages["producer_action"] >= 0) & (run.messages["consumer_action"] >= 0)]
    needed = ("send_post_ns", "recv_done_ns", "src_file_id", "src_source_index", "dst_file_id", "dst_source_index")
    if msgs.empty or any(c not in msgs for c in needed):
        return {}
    events = run.events
    tid = pd.Series(
        events["tid"].to_numpy(), index=pd.MultiIndex.from_arrays([events["file_id"], events["source_index"]])
    )
    tid = tid[~tid.index.duplicated()]
    send_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["src_file_id"], msgs["src_source_index"]])).tolist()
    recv_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["dst_file_id"], msgs["dst_source_index"]])).tolist()
    produced = run.actions.set_index("action_id")["end_ns"].reindex(msgs["producer_action"]).tolist()
    done: dict[tuple[int, object], list[int]] = {}  # (rank, thread) -> its receives' completions
    for rank, thread, t in zip(msgs["dst_rank"].tolist(), recv_tid, msgs["recv_done_ns"].tolist()):
        done.setdefault((int(rank), thread), []).append(int(t))
    completions = {key: np.sort(np.array(times, dtype=np.int64)) for key, times in done.items()}
    out: dict[int, int] = {}
    for msg, rank, thread, end, post in zip(
        msgs["msg_id"].tolist(), msgs["src_rank"].tolist(), send_tid, produced, msgs["send_post_ns"].tolist()
    ):
        times = completions.get((int(rank), thread))
        if times is None or not post > end:
            continue
        if np.searchsorted(times, post, side="right") > np.searchsorted(times, end, side="right"):
            out[int(msg)] = int(post - end)
    return out


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_held_back_sends_equal_the_loop_on_every_sample(loaded_runs, run_dir):
    run, _ = loaded_runs(run_dir)
    assert held_back_ns(run) == reference_held_back_ns(run)


def test_deepspeed_holds_sends_back():
    from tracekit import load

    run = load(sample_runs()[0].parent / "deepspeed_1f1b")
    assert held_back_ns(run)


@pytest.mark.parametrize("seed", range(40))
def test_generated_held_back_sends_equal_the_loop(seed):
    # Generated (not captured): 3 ranks, events on 3 threads each, messages between them
    # whose sides point at random events (some at none: an unknown thread).
    rng = np.random.default_rng(seed)
    k, m, n = int(rng.integers(1, 60)), int(rng.integers(1, 50)), int(rng.integers(1, 20))
    events = pd.DataFrame(
        {"file_id": rng.integers(0, 3, k), "source_index": rng.integers(0, 20, k), "tid": rng.integers(1, 4, k)}
    )
    end = rng.integers(0, 1_000, n)
    actions = pd.DataFrame({"action_id": np.arange(n), "end_ns": end})
    messages = pd.DataFrame(
        {
            "msg_id": np.arange(m) + 100,
            "src_rank": rng.integers(0, 3, m),
            "dst_rank": rng.integers(0, 3, m),
            "producer_action": rng.integers(0, n, m),
            "consumer_action": rng.integers(-1, n, m),
            "send_post_ns": rng.integers(0, 1_200, m),
            "recv_done_ns": rng.integers(0, 1_200, m),
            "src_file_id": rng.integers(0, 3, m),
            "src_source_index": rng.integers(0, 24, m),
            "dst_file_id": rng.integers(0, 3, m),
            "dst_source_index": rng.integers(0, 24, m),
        }
    )
    run = Run(source="generated", files=[], events=events, actions=actions, messages=messages)
    assert held_back_ns(run) == reference_held_back_ns(run)
