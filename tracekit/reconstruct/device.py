"""The device timeline: what each GPU did, tied to the host call that launched it.

On a GPU the host only launches kernels, asynchronously, and runs ahead of the device;
NCCL's sends and receives do not block it. So wherever a trace records device work, the
pipeline is measured on the device:

- **Device ops** (:func:`device_ops`): every kernel, memcpy and memset, joined to the CUDA
  API call that launched it (``runtime`` row, same rank and ``correlation`` id). The
  launch says which host thread asked for it and when, so an op belongs to the step (and
  the action) whose host span holds its launch, however late the device ran it: work
  launched inside ``ProfilerStep#N`` is step N's even when it runs after that span ends.
  Kinds: ``p2p`` (an NCCL kernel launched for point-to-point host ops), ``collective``
  (any other NCCL/RCCL kernel) and ``compute`` (the rest).
- **Device actions** (:func:`device_actions`): an action's device span runs from the first
  to the last compute or collective op launched inside its host label (any thread of the
  rank: on GPUs the autograd engine launches backward kernels from its own thread).
- **Device messages** (:func:`device_messages`): each matched send and receive's SendRecv
  kernel. A kernel that starts before its peer's spins until the peer arrives; then both
  move the data and end together. ``wait_ns`` = later start - earlier start (on the side
  that started first), ``transfer_ns`` = earlier end - later start.
- **Clocks** (:func:`device_clock_offsets`): the two kernels of one message end together,
  which bounds each rank's clock against its peer's far tighter than host-side timing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tracekit.model.intervals import union_length
from tracekit.model.run import DEVICE_OP_COLUMNS, DEVICE_PAIR_COLUMNS
from tracekit.reconstruct.device_columns import op_columns, op_kind
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.p2p import host_p2p_ops

_P2P_KERNEL = re.compile(r"SendRecv", re.IGNORECASE)

MESSAGE_DEVICE_COLUMNS = [
    "send_kernel",
    "recv_kernel",
    "send_start_ns",
    "send_end_ns",
    "recv_start_ns",
    "recv_end_ns",
    "waiting_rank",
    "wait_ns",
    "transfer_ns",
    "recv_queued",
    "leave_ns",
]


def device_ops(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per device op (see :data:`tracekit.model.run.DEVICE_OP_COLUMNS`), sorted by
    rank and start; ``action_id`` is -1 until :func:`device_actions` fills it."""
    return device_table([op_columns(EventArrays.of(events), steps)])


def device_table(parts: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The device-op table of sets of ops (:func:`~.device_columns.op_columns` of each file,
    in file order): sorted by rank, start and end, stably (file order, then row order, where
    those tie), numbered ``op_id``; names a categorical of the ops' own names. Built a
    column at a time: 256 GPU ranks hold ~700k ops."""
    names = sorted({name for part in parts for name in part["names"]})
    position = {name: i for i, name in enumerate(names)}

    def joined(column: str) -> np.ndarray:
        return np.concatenate([np.asarray(part[column], dtype=np.int64) for part in parts])

    rank, start, end = joined("rank"), joined("start_ns"), joined("end_ns")
    order = np.lexsort((end, start, rank))  # stable
    # each part's name codes, onto the run's sorted names
    recoded = [
        np.array([position[n] for n in part["names"]], dtype=np.int64)[np.asarray(part["name_code"], dtype=np.int64)]
        for part in parts
    ]
    codes = np.concatenate(recoded)[order]
    n = len(order)
    # decided once per distinct name (a few hundred) rather than per op (tens of thousands)
    kinds = np.array([op_kind(name) for name in names], dtype=object)
    columns: dict[str, Any] = {"op_id": np.arange(n, dtype=np.int64), "rank": rank[order]}
    del rank
    columns["step"] = joined("step")[order]
    columns["kind"] = kinds[codes]
    columns["start_ns"], columns["end_ns"] = start[order], end[order]
    del start, end
    for column in ("stream", "launch_ns", "launch_end_ns", "launch_tid"):
        columns[column] = joined(column)[order]
    columns["action_id"] = np.full(n, -1, dtype=np.int64)
    # categorical: a long kernel name is held once, not once per op
    columns["name"] = pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype=object))
    columns["name"] = columns["name"].remove_unused_categories()
    columns["file_id"], columns["source_index"] = joined("file_id")[order], joined("source_index")[order]
    # copy=False: the columns become the table's (not stacked into one more copy of them)
    return pd.DataFrame({c: columns[c] for c in DEVICE_OP_COLUMNS}, copy=False)


def link_p2p_kernels(ops: pd.DataFrame, host_p2p: pd.DataFrame) -> np.ndarray:
    """For each host P2P side, the device op it launched (``op_id``, -1 if none): the first
    NCCL kernel its thread launched at or after the call began. ``batch_isend_irecv`` posts
    several sides and launches one fused kernel when the group closes: all of them map to
    it. Marks those kernels ``p2p`` in ``ops`` (in place)."""
    out = np.full(len(host_p2p), -1, dtype=np.int64)
    comm = ops[(ops["kind"] != "compute").to_numpy() & (ops["launch_ns"].to_numpy() >= 0)]
    if comm.empty or host_p2p.empty:
        return out
    comm = comm.sort_values("launch_ns")
    by_thread = {
        key: (g["launch_ns"].to_numpy(np.int64), g["op_id"].to_numpy(np.int64))
        for key, g in comm.groupby(["rank", "launch_tid"])
    }
    ranks, tids = host_p2p["rank"].to_numpy(), host_p2p["tid"].to_numpy()
    starts = host_p2p["start_ns"].to_numpy(np.int64)
    for i in range(len(host_p2p)):
        found = by_thread.get((int(ranks[i]), int(tids[i])))
        if found is None:
            continue
        times, op_ids = found
        k = int(np.searchsorted(times, starts[i], side="left"))
        if k < len(times):
            out[i] = op_ids[k]
    linked = np.unique(out[out >= 0])
    if len(linked):
        names = ops["name"].to_numpy()
        position = pd.Index(ops["op_id"]).get_indexer(linked)
        # (Nsight Systems' "nccl:SendRecv|..." names say SendRecv too)
        sendrecv = np.array([bool(_P2P_KERNEL.search(str(names[p]))) for p in position], dtype=bool)
        ops.loc[ops.index[position[sendrecv]], "kind"] = "p2p"
        out = np.where(np.isin(out, linked[sendrecv]), out, -1)
    return out


def device_actions(actions: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Each action's device span, and ``ops.action_id`` for the ops it launched (in place).

    An op is the action's when its launch falls inside the action's host label span on the
    same rank and step. Returns ``actions`` with ``start_ns``/``end_ns`` on the device and
    the host span kept as ``host_start_ns``/``host_end_ns``. An action that launched nothing
    is given an empty span where its rank's device was when it ran (after its previous
    action), so the order stays whole.
    """
    actions = actions.copy()
    actions["host_start_ns"] = actions["start_ns"]
    actions["host_end_ns"] = actions["end_ns"]
    if actions.empty:
        return actions
    launched = ops[(ops["kind"] != "p2p").to_numpy() & (ops["launch_ns"].to_numpy() >= 0)]
    owner = np.full(len(ops), -1, dtype=np.int64)
    position = pd.Series(np.arange(len(ops)), index=ops.index)
    for (rank, step), acts in actions.groupby(["rank", "step"], sort=False):
        mine = launched[(launched["rank"].to_numpy() == rank) & (launched["step"].to_numpy() == step)]
        if mine.empty:
            continue
        acts = acts.sort_values("label_start_ns")
        lo, hi = acts["label_start_ns"].to_numpy(np.int64), acts["label_end_ns"].to_numpy(np.int64)
        t = mine["launch_ns"].to_numpy(np.int64)
        k = np.searchsorted(lo, t, side="right") - 1
        inside = (k >= 0) & (t <= hi[np.clip(k, 0, None)])
        owner[position[mine.index[inside]].to_numpy()] = acts["action_id"].to_numpy()[k[inside]]
    ops["action_id"] = owner
    owned = ops[owner >= 0]
    spans = owned.groupby("action_id").agg(dev_start=("start_ns", "min"), dev_end=("end_ns", "max"))
    start = actions["action_id"].map(spans["dev_start"])
    end = actions["action_id"].map(spans["dev_end"])
    actions["start_ns"] = start.fillna(-1).astype("int64")
    actions["end_ns"] = end.fillna(-1).astype("int64")
    actions["busy_ns"] = actions["action_id"].map(_union_per_group(owned, "action_id")).fillna(0).astype("int64")
    _fill_empty(actions)
    return actions


def _union_per_group(ops: pd.DataFrame, key: str) -> pd.Series:
    """Length of the union of the ops' [start, end) intervals, per value of ``key``."""
    return pd.Series(
        {
            k: union_length(
                g["start_ns"].to_numpy(np.int64),
                g["end_ns"].to_numpy(np.int64),
                int(g["start_ns"].min()),
                int(g["end_ns"].max()),
            )
            for k, g in ops.groupby(key, sort=False)
        },
        dtype="int64",
    )


def _fill_empty(actions: pd.DataFrame) -> None:
    """Empty device spans for actions that launched nothing: at their rank's device time."""
    missing = actions["start_ns"].to_numpy() < 0
    if not missing.any():
        return
    for _, group in actions.groupby("rank", sort=False):
        group = group.sort_values(["step", "order"])
        last = -1
        pending: list = []
        for idx, start, end in zip(group.index, group["start_ns"], group["end_ns"]):
            if start < 0:
                if last >= 0:
                    actions.at[idx, "start_ns"] = actions.at[idx, "end_ns"] = last
                else:
                    pending.append(idx)
                continue
            for p in pending:
                actions.at[p, "start_ns"] = actions.at[p, "end_ns"] = int(start)
            pending = []
            last = max(last, int(end))
        for p in pending:  # a rank that launched nothing at all: its host span
            actions.at[p, "start_ns"] = actions.at[p, "host_start_ns"]
            actions.at[p, "end_ns"] = actions.at[p, "host_start_ns"]


def device_messages(messages: pd.DataFrame, ops: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Each matched message's SendRecv kernels on both sides, and its wait and transfer.

    ``messages`` holds the host's (file_id, source_index) of both calls; their kernels come
    from :func:`link_p2p_kernels`. A message whose kernels are both known gets its device
    times: posted when the send kernel started, there when the receive kernel ended.
    """
    out = messages.copy()
    for col in MESSAGE_DEVICE_COLUMNS:
        out[col] = -1
    if out.empty:
        return out
    host = host_p2p_ops(events)
    kernels = link_p2p_kernels(ops, host)
    side = pd.Series(
        kernels, index=pd.MultiIndex.from_arrays([host["file_id"].to_numpy(), host["source_index"].to_numpy()])
    )
    side = side[~side.index.duplicated()]
    send_k = side.reindex(pd.MultiIndex.from_arrays([out["src_file_id"], out["src_source_index"]])).to_numpy()
    recv_k = side.reindex(pd.MultiIndex.from_arrays([out["dst_file_id"], out["dst_source_index"]])).to_numpy()
    send_k = np.where(np.isnan(send_k.astype(float)), -1, send_k).astype(np.int64)
    recv_k = np.where(np.isnan(recv_k.astype(float)), -1, recv_k).astype(np.int64)
    known = (send_k >= 0) & (recv_k >= 0)
    out["send_kernel"], out["recv_kernel"] = np.where(known, send_k, -1), np.where(known, recv_k, -1)
    out = kernel_times(out, ops)
    out["recv_queued"] = _queued_behind_p2p(ops, out["recv_kernel"].to_numpy())
    out["leave_ns"] = -1
    return out


def kernel_times(messages: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Messages with the times of their linked kernels (``send_kernel``/``recv_kernel``),
    and the wait and transfer those give; -1 where a side has no kernel."""
    out = messages.copy()
    send_k, recv_k = out["send_kernel"].to_numpy(np.int64), out["recv_kernel"].to_numpy(np.int64)
    known = (send_k >= 0) & (recv_k >= 0)
    by_id = ops.set_index("op_id")
    times = {}
    for side, ids in (("send", send_k), ("recv", recv_k)):
        for edge in ("start", "end"):
            column = np.full(len(out), -1, dtype=np.int64)
            column[known] = by_id.loc[ids[known], f"{edge}_ns"].to_numpy(np.int64)
            times[f"{side}_{edge}_ns"] = out[f"{side}_{edge}_ns"] = column
    waiting, wait, transfer = wait_and_transfer(
        times["send_start_ns"],
        times["send_end_ns"],
        times["recv_start_ns"],
        times["recv_end_ns"],
        out["src_rank"].to_numpy(),
        out["dst_rank"].to_numpy(),
    )
    out["waiting_rank"] = np.where(known, waiting, -1)
    out["wait_ns"] = np.where(known, wait, -1)
    out["transfer_ns"] = np.where(known, transfer, -1)
    return out


def wait_and_transfer(a_start, a_end, b_start, b_end, a_rank, b_rank) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For pairs of kernels (one on rank a, its peer's on rank b): the rank that waited (the
    one whose kernel started first, -1 for neither), the wait (later start - earlier start)
    and the transfer (earlier end - later start, at least 0)."""
    a_start, a_end, b_start, b_end = (np.asarray(x, dtype=np.int64) for x in (a_start, a_end, b_start, b_end))
    later = np.maximum(a_start, b_start)
    waiting = np.where(a_start < b_start, a_rank, np.where(b_start < a_start, b_rank, -1))
    return (
        waiting.astype(np.int64),
        later - np.minimum(a_start, b_start),
        np.maximum(np.minimum(a_end, b_end) - later, 0),
    )


# A kernel that starts within this of the previous kernel's end on its stream waited for it.
_QUEUE_SLACK_NS = 2_000


def _queued_behind_p2p(ops: pd.DataFrame, op_ids: np.ndarray) -> np.ndarray:
    """Whether each op (by ``op_id``, -1 for none) started only when the P2P kernel before it
    on its stream ended: a receive queued behind the link's earlier traffic was held up by
    the link, not by its own rank."""
    out = np.zeros(len(op_ids), dtype=bool)
    if not len(op_ids) or ops.empty:
        return out
    ordered = ops.sort_values(["rank", "stream", "start_ns"])
    same_stream = (ordered["rank"].to_numpy()[1:] == ordered["rank"].to_numpy()[:-1]) & (
        ordered["stream"].to_numpy()[1:] == ordered["stream"].to_numpy()[:-1]
    )
    prev_end = np.full(len(ordered), -1, dtype=np.int64)
    prev_p2p = np.zeros(len(ordered), dtype=bool)
    prev_end[1:] = np.where(same_stream, ordered["end_ns"].to_numpy(np.int64)[:-1], -1)
    prev_p2p[1:] = same_stream & (ordered["kind"].to_numpy()[:-1] == "p2p")
    queued = prev_p2p & (ordered["start_ns"].to_numpy(np.int64) <= prev_end + _QUEUE_SLACK_NS)
    by_id = pd.Series(queued, index=ordered["op_id"].to_numpy())
    known = op_ids >= 0
    out[known] = by_id.reindex(op_ids[known]).fillna(False).to_numpy(dtype=bool)
    return out


def apply_device_times(messages: pd.DataFrame) -> pd.DataFrame:
    """Messages with their device kernels take device times: posted at the send kernel's
    start, there (``arrival_ns``) at the receive kernel's end, ``leave_ns`` when the data could
    leave (see below); the receiver waited while its kernel spun."""
    out = messages.copy()
    known = out["send_kernel"].to_numpy() >= 0
    if not known.any():
        return out
    for col, src in (
        ("send_post_ns", "send_start_ns"),
        ("recv_post_ns", "recv_start_ns"),
        ("recv_done_ns", "recv_end_ns"),
    ):
        out.loc[known, col] = out.loc[known, src]
    # The data could be there one transfer after the send kernel began: what the receiver's
    # kernel spent spinning past that, it spent waiting for its own rank to post the receive
    # (the receiver was late, not the link).
    out.loc[known, "arrival_ns"] = out.loc[known, "recv_end_ns"]
    # The data leaves when the send kernel starts, and moves once the receive kernel runs too
    # (rendezvous: the replay adds ``transfer_ns`` from the later of the two). A receive queued
    # behind the link's earlier messages on its stream was held by the link, not its rank: the
    # data could leave only when that queue let it.
    leave = out["send_start_ns"].where(
        ~out["recv_queued"].astype(bool), np.maximum(out["send_start_ns"], out["recv_start_ns"])
    )
    out["leave_ns"] = np.where(known, leave, -1)
    spin = np.where(out["waiting_rank"].to_numpy() == out["dst_rank"].to_numpy(), out["wait_ns"].to_numpy(), 0)
    out.loc[known, "recv_wait_ns"] = spin[known]
    return out


def device_clock_offsets(messages: pd.DataFrame, hosts: dict[int, str]) -> tuple[dict[int, int], list[str]]:
    """ns to subtract from each rank's times to put it on the lowest rank's clock, from the
    device P2P kernels of matched messages (a send and its receive end together).

    Ranks on one named host share its clock; a rank of unknown host is its own clock only
    when a message to or from it arrives before it was sent (the older GPU traces name no
    host, so the host name cannot be the test). Offsets come from the median end difference
    of each pair of clocks, walked outwards from the lowest rank."""
    known = messages[messages["send_kernel"] >= 0] if "send_kernel" in messages else messages.iloc[0:0]
    if known.empty:
        return {}, []
    src, dst = known["src_rank"].to_numpy(np.int64), known["dst_rank"].to_numpy(np.int64)
    acausal = known["recv_end_ns"].to_numpy() < known["send_start_ns"].to_numpy()
    ranks = sorted(set(src.tolist()) | set(dst.tolist()))
    named = {r: hosts.get(r) for r in ranks if hosts.get(r) not in (None, "unknown-host")}
    separate = {int(r) for r in np.concatenate((src[acausal], dst[acausal]))}
    clock = {}
    for r in ranks:
        clock[r] = (
            f"host:{named[r]}" if r in named and r not in separate else (f"rank:{r}" if r in separate else "shared")
        )
    if len(set(clock.values())) <= 1:
        return {}, []
    diff = known["recv_end_ns"].to_numpy(np.int64) - known["send_end_ns"].to_numpy(np.int64)
    pair_offsets: dict[tuple[str, str], list[int]] = {}
    for s, d, x in zip(src, dst, diff):
        a, b = clock[int(s)], clock[int(d)]
        if a != b:
            pair_offsets.setdefault((a, b), []).append(int(x))
            pair_offsets.setdefault((b, a), []).append(-int(x))
    reference = clock[ranks[0]]
    offset = {reference: 0}
    queue = [reference]
    while queue:
        a = queue.pop(0)
        for (here, there), values in sorted(pair_offsets.items()):
            if here == a and there not in offset:
                offset[there] = offset[a] + int(np.median(values))
                queue.append(there)
    shifts = {r: offset[c] for r, c in clock.items() if offset.get(c, 0)}
    notes = []
    unreached = sorted({c for c in clock.values() if c not in offset})
    if unreached:
        notes.append(f"clocks {', '.join(unreached)} exchanged no device message with the others: not aligned")
    if shifts:
        why = (
            f"{len(separate)} rank(s) received messages before they were sent"
            if separate
            else "ranks are on different hosts"
        )
        notes.append(
            "aligned clocks from device P2P kernels (a send and its receive end together; "
            + why
            + "): "
            + ", ".join(f"rank {r} {s / 1e3:+.1f} us" for r, s in sorted(shifts.items()))
        )
    return shifts, notes


def pairs_from_messages(messages: pd.DataFrame) -> pd.DataFrame:
    """The device P2P pairs of matched messages whose kernels are known on both sides."""
    known = messages[messages["send_kernel"] >= 0]
    return (
        known[DEVICE_PAIR_COLUMNS].reset_index(drop=True) if len(known) else pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    )


def pair_p2p_kernels(ops: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Device P2P pairs of a run without matched messages: each rank's P2P kernels for a
    peer, in start order, paired one-to-one with the peer's for that rank (NCCL runs a send
    and its receive as one kernel on each side). Sides come from the host calls that
    launched them (send or recv, with the peer), else from the kernel's own peer (Nsight
    Systems names it from the NCCL range around the launch; with two ranks the peer is the
    other one) with the direction unknown."""
    host = host_p2p_ops(events)
    linked = link_p2p_kernels(ops, host)
    p2p = ops[ops["kind"] == "p2p"]
    if p2p.empty:
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    sides = []
    seen: set[int] = set()
    for op_id, rank, peer, direction in zip(linked, host["rank"], host["peer"], host["direction"]):
        if op_id >= 0 and peer >= 0:
            sides.append((int(op_id), int(rank), int(peer), str(direction)))
            seen.add(int(op_id))
    peer_of = events.set_index(["file_id", "source_index"])["peer"]
    peer_of = peer_of[~peer_of.index.duplicated()]
    ranks = sorted(int(r) for r in ops["rank"].unique())
    for row in p2p[~p2p["op_id"].isin(seen)].itertuples(index=False):
        peer = int(peer_of.get((row.file_id, row.source_index), -1))
        if peer < 0 and len(ranks) == 2:
            peer = ranks[1] if row.rank == ranks[0] else ranks[0]
        if peer >= 0:
            sides.append((int(row.op_id), int(row.rank), peer, "?"))
    if not sides:
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    table = (
        pd.DataFrame(sides, columns=["op_id", "rank", "peer", "direction"])
        .merge(ops[["op_id", "start_ns", "end_ns", "step"]], on="op_id")
        .sort_values("start_ns", kind="stable")
    )
    groups = {k: g for k, g in table.groupby(["rank", "peer", "direction"])}
    rows = []
    for (a, b, direction), side_a in sorted(groups.items()):
        if direction == "send":
            side_b = groups.get((b, a, "recv"))
        elif direction == "?" and a < b:
            side_b = groups.get((b, a, "?"))
        else:
            continue
        if side_b is None:
            continue
        rows += [
            _pair_row(a, b, s, r, "?") for s, r in zip(side_a.itertuples(index=False), side_b.itertuples(index=False))
        ]
    return pd.DataFrame(rows, columns=DEVICE_PAIR_COLUMNS)


def _pair_row(a: int, b: int, s, r, direction: str) -> tuple:
    """One pair of kernels (``s`` on rank a, ``r`` on rank b) as a DEVICE_PAIR_COLUMNS row."""
    waiting, wait, transfer = wait_and_transfer(s.start_ns, s.end_ns, r.start_ns, r.end_ns, a, b)
    return (
        -1,
        int(s.step),
        a,
        b,
        direction,
        int(s.start_ns),
        int(s.end_ns),
        int(r.start_ns),
        int(r.end_ns),
        int(waiting),
        int(wait),
        int(transfer),
    )


def pair_collective_sendrecv(ops: pd.DataFrame) -> pd.DataFrame:
    """SendRecv-named kernels that ran collectives (all_to_all launches them too), paired
    between the two ranks of a two-rank run in start order: they spin for each other like
    P2P kernels do, so wait and transfer mean the same, but they are collectives, never
    pipeline messages (``direction`` "collective"). Runs of other sizes: none (which rank's
    kernel meets which is not in the trace)."""
    ranks = sorted(int(r) for r in ops["rank"].unique())
    if len(ranks) != 2:
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    collective = ops[(ops["kind"] == "collective").to_numpy()]
    names = collective["name"].astype(str)
    # decided once per distinct name, not per kernel
    sendrecv = collective[names.isin([n for n in names.unique() if _P2P_KERNEL.search(n)]).to_numpy()]
    if sendrecv.empty:
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    a, b = ranks
    side_a = sendrecv[sendrecv["rank"] == a].sort_values("start_ns")
    side_b = sendrecv[sendrecv["rank"] == b].sort_values("start_ns")
    rows = [
        _pair_row(a, b, s, r, "collective")
        for s, r in zip(side_a.itertuples(index=False), side_b.itertuples(index=False))
    ]
    return pd.DataFrame(rows, columns=DEVICE_PAIR_COLUMNS)
