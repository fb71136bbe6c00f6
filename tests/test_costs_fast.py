"""What-if's cost model, its pools made from every step's actions and edges at once, and
``held_back_ns``, every message searched among its sender thread's receive completions at
once, equal the loops they replaced (kept below as they were at tracekit 1b5124f) on every
sample run (DeepSpeed's holds sends back; DualPipeV fuses labels) and on generated
messages (threads that receive and send, unknown threads). The references are
``cost_model`` and ``held_back_ns`` of 1b5124f whole (their opening checks did not change,
but they are inside the rewritten functions); what the fast version left unchanged
(``CostModel``, ``LinkKey``, ``_fused``, ``_split_costs``) is imported from
``tracekit.analyze.costs``. Since then each pool's fixed share is pooled too (the loop here;
each action's fixed part, ``op_fixed_ns``, and ``_share`` imported)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import sample_runs
from tracekit.analyze.costs import (
    CostModel,
    LinkKey,
    StepGraph,
    _fused,
    _share,
    _split_costs,
    cost_model,
    held_back_ns,
    op_fixed_ns,
    step_graphs,
)
from tracekit.errors import TracekitError
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


def reference_cost_model(run: Run, graphs: list[StepGraph] | None = None) -> CostModel:
    """The cost samples of a reconstructed pipeline run (from its step ``graphs`` when the
    caller has them already)."""
    if run.completeness is not None and run.completeness.single_rank:
        raise TracekitError(
            f"{run.source}: one rank: no pipeline to vary; what-if needs every rank of a pipeline-parallel run"
        )
    sched = run.schedule
    if sched is None or not run.is_pipeline:
        raise TracekitError(
            f"{run.source}: no pipeline actions found, so there is no schedule to vary; "
            "what-if needs a pipeline-parallel run"
        )
    if run.completeness is not None and not run.completeness.complete:
        raise TracekitError(
            f"{run.source}: incomplete run: {run.completeness.gaps_text()}; what-if "
            "replays the whole pipeline, so it needs every rank's trace"
        )
    if sched.flush_free:
        # the targets are flushed schedules replayed step by step; a flush-free run's steps
        # hold microbatches of its neighbours' steps, so its "measured step" is no such thing
        raise TracekitError(
            f"{run.source}: {sched.name} has no flush: what-if replays flushed steps, and "
            "this run's steps overlap by design; compare it with a flushed capture instead"
        )
    graphs = list(step_graphs(run).values()) if graphs is None else list(graphs)
    per_kind: dict[tuple[int, str], list[int]] = {}
    fixed_kind: dict[tuple[int, str], list[int]] = {}
    fixed_of = op_fixed_ns(run).to_dict()
    later_iw: dict[tuple[int, str], list[int]] = {}  # I and W of stages past the first
    overhead: dict[int, list[int]] = {}
    fused_overhead: dict[int, list[int]] = {}
    per_stage: dict[tuple[int, str], list[int]] = {}
    latency: dict[LinkKey, list[int]] = {}
    transfer: dict[LinkKey, list[int]] = {}
    labels = run.actions.set_index("action_id")[["label", "label_start_ns"]]
    fused_of_graph = [_fused(labels, g) for g in graphs]
    held = held_back_ns(run)
    for g, fused in zip(graphs, fused_of_graph):
        for r, k, d, o, f, a in zip(
            g.rank.tolist(), g.kind.tolist(), g.dur.tolist(), g.ovh.tolist(), fused.tolist(), g.action_id.tolist()
        ):
            per_kind.setdefault((r, k), []).append(d * sched.v)
            fixed_kind.setdefault((r, k), []).append(min(fixed_of.get(a, 0), d) * sched.v)
            (fused_overhead if f else overhead).setdefault(r, []).append(o)
        for r, s, k, d in zip(g.rank.tolist(), g.stage.tolist(), g.kind.tolist(), g.dur.tolist()):
            per_stage.setdefault((s, k), []).append(d)
            if k in ("I", "W") and s > 0:
                later_iw.setdefault((r, k), []).append(d * sched.v)
        for s, d, lat, xfer, msg in zip(g.edge_src, g.edge_dst, g.edge_lat, g.edge_xfer, g.edge_msg):
            if msg >= 0:  # into the second half of a fused label: its own pool (see _fused)
                key: LinkKey = (
                    (int(g.rank[s]), int(g.rank[d])) if not fused[d] else (int(g.rank[s]), int(g.rank[d]), "fused")
                )
                latency.setdefault(key, []).append(max(0, int(lat) - held.get(int(msg), 0)))
                transfer.setdefault(key, []).append(int(xfer))
    # Generated orders place stages on the first replica's ranks (the others repeat it).
    ranks = sorted(sched.pipelines[0]) if sched.pipelines else sorted(set(overhead) | set(fused_overhead))
    for r in ranks:  # a rank whose every action continues a fused label: use those
        if r not in overhead and r in fused_overhead:
            overhead[r] = list(fused_overhead[r])
    work: dict[tuple[int, str], np.ndarray] = {}
    rng = np.random.default_rng(0)
    share: dict[tuple[int, str], float] = {}
    for (r, k), samples in per_kind.items():
        work[(r, k)] = np.array(samples, dtype=np.int64)
        share[(r, k)] = _share(np.array(fixed_kind[(r, k)]), work[(r, k)])
    for r in ranks:
        if (r, "B") not in work and (r, "I") in work and (r, "W") in work:
            i_s, w_s = work[(r, "I")], work[(r, "W")]
            n = max(len(i_s), len(w_s))
            i_at, w_at = rng.integers(0, len(i_s), n), rng.integers(0, len(w_s), n)
            pairs = [(i_s[i] + w_s[w], fixed_kind[(r, "I")][i] + fixed_kind[(r, "W")][w]) for i, w in zip(i_at, w_at)]
            once = [fixed // 2 for _, fixed in pairs]  # the walk's fixed part, paid once
            work[(r, "B")] = np.array([b - o for (b, _), o in zip(pairs, once)], dtype=np.int64)
            share[(r, "B")] = _share(np.array([f - o for (_, f), o in zip(pairs, once)]), work[(r, "B")])
        for kind, name in (("F", "forward"), ("B", "backward")):
            if (r, kind) not in work:
                raise TracekitError(f"{run.source}: rank {r} has no {name} actions; what-if needs both on every rank")
    stage_work = {k: np.array(v, dtype=np.int64) for k, v in per_stage.items()}
    split = any(k in ("I", "W") for _, k in per_kind)
    iw_source = _split_costs(work, later_iw, stage_work, ranks, sched.v, split, share)
    all_latency = np.array([x for k, v in latency.items() if len(k) == 2 for x in v] or [0], dtype=np.int64)
    return CostModel(
        schedule=sched.name,
        p=sched.p,
        v=sched.v,
        m=sched.m,
        ranks=ranks,
        work=work,
        overhead={r: np.array(v, dtype=np.int64) for r, v in overhead.items()},
        fused_overhead={r: np.array(v, dtype=np.int64) for r, v in fused_overhead.items()},
        fused=fused_of_graph,
        stage_work=stage_work,
        latency={k: np.array(v, dtype=np.int64) for k, v in latency.items()},
        all_latency=all_latency,
        held_back=len(held),
        graphs=graphs,
        transfer={k: np.array(v, dtype=np.int64) for k, v in transfer.items() if any(v)},
        all_transfer=np.array([x for k, v in transfer.items() if len(k) == 2 for x in v] or [0], dtype=np.int64),
        n_actions=sum(len(g.action_id) for g in graphs),
        n_messages=int(sum((g.edge_msg >= 0).sum() for g in graphs)),
        split_backward=split,
        iw_source=iw_source,
        fixed_share=share,
    )


def _same_pools(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert np.asarray(a[key]).tolist() == np.asarray(b[key]).tolist(), key


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_cost_model_equals_the_loops_on_every_sample(loaded_runs, run_dir):
    run, analysis = loaded_runs(run_dir)
    graphs = list(analysis.attribution.graphs.values()) if analysis.attribution else None
    try:
        slow = reference_cost_model(run, graphs)
    except TracekitError as err:
        with pytest.raises(TracekitError, match="."):
            cost_model(run, graphs)
        pytest.skip(f"{run_dir.name}: {err}")
    fast = cost_model(run, graphs)
    for name in ("work", "overhead", "fused_overhead", "stage_work", "latency", "transfer"):
        _same_pools(getattr(fast, name), getattr(slow, name))
    for name in ("all_latency", "all_transfer"):
        assert getattr(fast, name).tolist() == getattr(slow, name).tolist()
    for name in (
        "schedule",
        "p",
        "v",
        "m",
        "ranks",
        "held_back",
        "n_actions",
        "n_messages",
        "split_backward",
        "iw_source",
        "fixed_share",
    ):
        assert getattr(fast, name) == getattr(slow, name), name
    assert [f.tolist() for f in fast.fused] == [f.tolist() for f in slow.fused]


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
