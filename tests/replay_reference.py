"""``graph_from_run`` and ``dependency_pairs`` as they were before they took every message
and action at once (tracekit 1b5124f, kept as they were): ``tests/test_replay_fast.py``
holds the new ones equal to them. Message by message: a dict of edges keeping each
(producer, consumer)'s first message of the largest latency, then the overheads action
by action. Both functions were rewritten whole (their unchanged lines, such as the closing
``StepGraph(...)``, stand inside them); ``StepGraph`` itself is imported from
``tracekit.analyze.replay``.

Rules added since, each stated here on its own: the parts of a fused range (one label of
one rank, same label span, parts of different kinds: DualPipeV's OVERLAP_F_B) run as one
range, so a message from any part leaves from the part that ends last, a message to any
part goes to the part that starts first, and a dependency between two parts' fused ranges
is carried by such a message (issue #28). On the host's timeline a message whose receive
launched a device kernel (NCCL) is no edge and no note, and it carries its dependency
(issue #29). A device message's rendezvous transfer starts no earlier than the end of the
last action of the receiver's rank that had ended when the receive kernel started (its
receive was posted then: Megatron receives a unit's inputs before the unit runs), not the
end of the consumer's previous action (issue #29).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.analyze.replay import StepGraph
from tracekit.model.run import Run, compute_ns


def dependency_pairs(
    rank: np.ndarray, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, replica: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """Cross-rank data dependencies implied by stage adjacency: activations flow from
    stage s to s+1, gradients from s+1 to s (through I when backward is split), inside one
    data-parallel ``replica`` (all one pipeline when not given)."""
    group = np.zeros(len(kind), dtype=np.int64) if replica is None else replica
    index = {(int(g), str(k), int(s), int(m)): i for i, (g, k, s, m) in enumerate(zip(group, kind, stage, microbatch))}
    pairs = []
    for i, (g, k, s, m) in enumerate(zip(group, kind, stage, microbatch)):
        g, k, s, m = int(g), str(k), int(s), int(m)
        if k == "F":
            j = index.get((g, "F", s - 1, m))
        elif k in ("B", "I"):
            j = index.get((g, "B", s + 1, m), index.get((g, "I", s + 1, m)))
        else:
            j = None
        if j is not None and rank[j] != rank[i]:
            pairs.append((j, i))
    return pairs


def graph_from_run(
    run: Run,
    step: int,
    acts: pd.DataFrame | None = None,
    msgs: pd.DataFrame | None = None,
    rank_start: dict[int, int] | None = None,
) -> StepGraph:
    """The measured dependency graph of one step of a reconstructed run (``acts`` and
    ``msgs``: that step's actions and linked messages, when already split out;
    ``rank_start``: per-rank window starts of a flush-free pipeline, see step_graphs)."""
    if acts is None:
        acts = run.actions[run.actions["step"] == step]
    acts = acts.sort_values(["start_ns", "end_ns"])
    n = len(acts)
    ids = acts["action_id"].to_numpy(dtype=np.int64)
    pos = {int(a): i for i, a in enumerate(ids)}
    rank = acts["rank"].to_numpy(dtype=np.int64)
    start = acts["start_ns"].to_numpy(dtype=np.int64)
    end = acts["end_ns"].to_numpy(dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    last_on_rank: dict[int, int] = {}
    for i, r in enumerate(rank):
        prev[i] = last_on_rank.get(int(r), -1)
        last_on_rank[int(r)] = i
    notes: list[str] = []
    fused: dict[tuple, list[int]] = {}
    kinds_of = acts["kind"].tolist()
    for i, key in enumerate(
        zip(
            acts["rank"].tolist(),
            acts["label"].tolist(),
            acts["label_start_ns"].tolist(),
            acts["label_end_ns"].tolist(),
        )
        if "label_start_ns" in acts
        else []
    ):
        if key[1]:
            fused.setdefault(key, []).append(i)
    first_of, last_of = list(range(n)), list(range(n))
    for members in fused.values():
        if len({kinds_of[i] for i in members}) > 1:
            first = min(members, key=lambda i: (start[i], i))
            last = max(members, key=lambda i: (end[i], -i))
            for i in members:
                first_of[i], last_of[i] = first, last
    if msgs is None:
        msgs = run.messages[
            (run.messages["step"] == step)
            & (run.messages["producer_action"] >= 0)
            & (run.messages["consumer_action"] >= 0)
        ]
    edges: dict[tuple[int, int], tuple[int, int, int]] = {}  # (src, dst) -> (lat, msg_id, xfer)
    anchors: dict[tuple[int, int], int] = {}  # (src, dst) -> the receiver's action before its post
    posts = msgs["recv_post_ns"].tolist() if "recv_post_ns" in msgs else [None] * len(msgs)
    # Device messages: the data leaves at ``leave_ns`` and moves for ``transfer_ns`` once
    # both sides run (rendezvous); host messages: all latency up to ``arrival_ns``.
    rendezvous = "leave_ns" in msgs
    leaves = msgs["leave_ns"].tolist() if rendezvous else [-1] * len(msgs)
    transfers = msgs["transfer_ns"].tolist() if rendezvous else [-1] * len(msgs)
    release = np.zeros(n, dtype=np.int64) if rank_start is not None else None
    sides = run.device_summary["sides"]
    on_device = (
        {(int(f), int(i)) for f, i, k in zip(sides["file_id"], sides["source_index"], sides["kernel"]) if k >= 0}
        if run.timeline == "host"
        else set()
    )
    receives = (
        list(zip(msgs["dst_file_id"].tolist(), msgs["dst_source_index"].tolist()))
        if "dst_file_id" in msgs
        else [None] * len(msgs)
    )
    carried: set[tuple[int, int]] = set()  # (producer, consumer) of messages that bind no host span
    for msg_id, producer, consumer, arrival, leave, transfer, post, receive in zip(
        msgs["msg_id"].tolist(),
        msgs["producer_action"].tolist(),
        msgs["consumer_action"].tolist(),
        msgs["arrival_ns"].tolist(),
        leaves,
        transfers,
        posts,
        receives,
    ):
        s, d = pos.get(int(producer)), pos.get(int(consumer))
        s = None if s is None else last_of[s]
        d = None if d is None else first_of[d]
        if s is None and d is not None and release is not None:
            release[d] = max(release[d], min(int(arrival), int(start[d])))
            continue
        if s is None or d is None or rank[s] == rank[d]:
            continue
        if receive in on_device:
            carried.add((s, d))
            continue
        if end[s] > start[d]:
            notes.append(f"message {msg_id} arrives after its consumer started; ignored")
            continue
        room = int(start[d] - end[s])
        if leave >= 0 and transfer >= 0:
            lat = int(min(max(leave - end[s], 0), room))
            xfer = int(min(transfer, room - lat))
        else:
            lat, xfer = int(min(max(arrival - end[s], 0), room)), 0
        if (s, d) not in edges or lat + xfer > edges[(s, d)][0] + edges[(s, d)][2]:
            edges[(s, d)] = (lat, int(msg_id), xfer)
            anchor = int(prev[d])
            if leave >= 0 and transfer >= 0 and post is not None:
                # the last one on the rank's chain before the consumer that ended by the post
                a = int(prev[d])
                while a >= 0 and end[a] > post:
                    a = int(prev[a])
                anchor = a
            anchors[(s, d)] = anchor
    kind = acts["kind"].to_numpy()
    stage = acts["stage"].to_numpy(dtype=np.int64)
    mb = acts["microbatch"].to_numpy(dtype=np.int64)
    unmessaged = 0
    replica_of = {r: i for i, group in enumerate(run.schedule.pipelines if run.schedule else []) for r in group}
    replica = np.array([replica_of.get(int(r), 0) for r in rank], dtype=np.int64)
    for s, d in dependency_pairs(rank, stage, kind, mb, replica):
        if (
            (last_of[s], first_of[d]) not in edges
            and (last_of[s], first_of[d]) not in carried
            and (s, d) not in edges
            and end[s] <= start[d]
        ):
            edges[(s, d)] = (0, -1, 0)
            unmessaged += 1
    if unmessaged:
        notes.append(f"{unmessaged} cross-rank dependencies have no matched message; their wait counts as overhead")
    edge_keys = sorted(edges)
    edge_src = np.array([k[0] for k in edge_keys], dtype=np.int64)
    edge_dst = np.array([k[1] for k in edge_keys], dtype=np.int64)
    edge_lat = np.array([edges[k][0] for k in edge_keys], dtype=np.int64)
    edge_msg = np.array([edges[k][1] for k in edge_keys], dtype=np.int64)
    edge_xfer = np.array([edges[k][2] for k in edge_keys], dtype=np.int64)
    edge_anchor = np.array([anchors.get(k, int(prev[k[1]])) for k in edge_keys], dtype=np.int64)
    t0 = int(start.min()) if n else 0
    if rank_start is not None:
        t0 = min([t0, *rank_start.values()])
    # Compute time (on the device: the union of the action's kernels); an action's idle
    # stretches between its kernels fall, in the replay, into the overhead of what follows.
    dur = np.minimum(compute_ns(acts).to_numpy(dtype=np.int64), end - start)
    done = start + dur
    ovh = np.zeros(n, dtype=np.int64)
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, d in enumerate(edge_dst):
        in_edges[d].append(e)
    for i in range(n):
        origin = t0 if rank_start is None else rank_start.get(int(rank[i]), t0)
        ready = origin if prev[i] < 0 else done[prev[i]]
        if release is not None:
            ready = max(ready, int(release[i]))
        for e in in_edges[i]:
            arrival = done[edge_src[e]] + edge_lat[e]
            if edge_xfer[e]:
                partner = origin if edge_anchor[e] < 0 else done[edge_anchor[e]]
                arrival = max(arrival, partner) + edge_xfer[e]
            ready = max(ready, arrival)
        ovh[i] = max(0, start[i] - ready)
    return StepGraph(
        step=step,
        t0=t0,
        action_id=ids,
        rank=rank,
        stage=stage,
        kind=kind,
        microbatch=mb,
        prev=prev,
        dur=dur,
        ovh=ovh,
        edge_src=edge_src,
        edge_dst=edge_dst,
        edge_lat=edge_lat,
        edge_msg=edge_msg,
        measured_start=start,
        measured_end=end,
        notes=notes,
        edge_xfer=edge_xfer,
        edge_anchor=edge_anchor,
        rank_start=rank_start,
        release=release,
    )
