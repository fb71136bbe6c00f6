"""The device timeline: what each GPU did, tied to the host call that launched it.

On a GPU the host only launches kernels, asynchronously, and runs ahead of the device;
NCCL's sends and receives do not block it. So wherever a trace records device work, the
pipeline is measured on the device:

- **Device ops** (:func:`device_ops`): every kernel, memcpy and memset, joined to the CUDA
  API call that launched it (``runtime`` row, same rank and ``correlation`` id). The
  launch says which host thread asked for it and when, so an op belongs to the step (and
  the action) whose host span holds its launch, however late the device ran it: work
  launched inside ``ProfilerStep#N`` is step N's even when it runs after that span ends.
  Kinds: ``p2p`` (an NCCL SendRecv or RCCL kernel launched for point-to-point host ops),
  ``collective`` (any other NCCL/RCCL kernel) and ``compute`` (the rest). The table is held
  only where the working sets were read (outputs that draw ops); :func:`summarise_table`
  reduces it rank by rank with the code that reduces a GPU rank where its file is parsed
  (:mod:`.device_rank`), so the analyses read one :class:`~tracekit.model.device.DeviceSummary`
  either way.
- **Device actions** (:func:`device_actions`): an action's device span runs from the first
  to the last compute or collective op launched inside its host label (any thread of the
  rank: on GPUs the autograd engine launches backward kernels from its own thread).
- **Device messages** (:func:`device_messages`): each matched send and receive's P2P
  kernel. A kernel that starts before its peer's spins until the peer arrives; then both
  move the data and end together. ``wait_ns`` = later start - earlier start (on the side
  that started first), ``transfer_ns`` = earlier end - later start.
- **Clocks** (:func:`device_clock_offsets`): the two kernels of one message end together,
  which bounds each rank's clock against its peer's far tighter than host-side timing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from tracekit.model.device import DeviceSummary
from tracekit.model.groups import SortedGroups, pair_codes
from tracekit.model.run import DEVICE_OP_COLUMNS, DEVICE_PAIR_COLUMNS
from tracekit.reconstruct.device_columns import NUMBER_COLUMNS, op_columns, op_kind
from tracekit.reconstruct.device_rank import DEVICE_ACTION_COLUMNS, KINDS, QUEUE_SLACK_NS, join_ranks, reduce_ranks
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.p2p_sides import DIRECTIONS

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
    "send_queued",
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
    for column in ("file_id", "source_index", "peer"):
        columns[column] = joined(column)[order]
    # copy=False: the columns become the table's (not stacked into one more copy of them)
    return pd.DataFrame({c: columns[c] for c in DEVICE_OP_COLUMNS}, copy=False)


def summarise_table(
    device: pd.DataFrame, host_events: pd.DataFrame, actions: pd.DataFrame, world_size: Mapping[int, int]
) -> tuple[DeviceSummary, pd.DataFrame]:
    """The device timeline of a run whose device-op table is held (its working sets were
    read), reduced rank by rank as where files are parsed (:mod:`.device_rank`): the summary,
    and ``actions`` with their device spans (:data:`~.device_rank.DEVICE_ACTION_COLUMNS`).
    Marks the table's P2P kernels and each op's ``action_id`` (in place)."""
    columns = {c: device[c].to_numpy() for c in NUMBER_COLUMNS if c in device}
    columns["rank"] = device["rank"].to_numpy(np.int64)
    columns["name_code"] = device["name"].cat.codes.to_numpy().astype(np.int64)
    names = [str(n) for n in device["name"].cat.categories]
    action_columns = {
        c: actions[c].to_numpy(np.int64)
        for c in ("rank", "step", "order", "label_start_ns", "label_end_ns", "start_ns")
    }
    action_columns["forward"] = (actions["kind"] == "F").to_numpy(np.int64)
    found = reduce_ranks(columns, names, EventArrays.of(host_events), action_columns, world_size)
    device["kind"] = np.array(KINDS, dtype=object)[found.op_kind]
    owner = np.full(len(device), -1, dtype=np.int64)
    owned = found.op_action >= 0
    owner[owned] = actions["action_id"].to_numpy(np.int64)[found.op_action[owned]]
    device["action_id"] = owner
    return join_ranks([found.part]), actions.assign(**found.action_columns)


def without_device_spans(actions: pd.DataFrame) -> pd.DataFrame:
    """The actions without the device columns the reduce gave them (a run read on the host's
    timeline, or not measured as a pipeline)."""
    return actions.drop(columns=[c for c in DEVICE_ACTION_COLUMNS if c in actions])


def device_actions(actions: pd.DataFrame) -> pd.DataFrame:
    """Actions on the device timeline: ``start_ns`` / ``end_ns`` their device spans (first to
    last op each launched; :mod:`.device_rank`), ``busy_ns`` the union of those ops, the
    host spans kept as ``host_start_ns`` / ``host_end_ns``."""
    out = actions.assign(host_start_ns=actions["start_ns"], host_end_ns=actions["end_ns"])
    if out.empty:
        return without_device_spans(out)
    return out.assign(start_ns=out["dev_start_ns"], end_ns=out["dev_end_ns"]).drop(
        columns=["dev_start_ns", "dev_end_ns"]
    )


def device_messages(messages: pd.DataFrame, summary: DeviceSummary) -> pd.DataFrame:
    """Each matched message's P2P kernels on both sides, and its wait and transfer.

    ``messages`` holds the host's (file_id, source_index) of both calls; the kernel each call
    launched comes from the summary's ``sides`` (:mod:`.device_rank`). A message whose kernels
    are both known gets its device times: posted when the send kernel started, there when the
    receive kernel ended.
    """
    out = messages.copy()
    for col in MESSAGE_DEVICE_COLUMNS:
        out[col] = -1
    if out.empty:
        return out
    send_k = _side_kernels(summary, out["src_file_id"], out["src_source_index"])
    recv_k = _side_kernels(summary, out["dst_file_id"], out["dst_source_index"])
    known = (send_k >= 0) & (recv_k >= 0)
    out["send_kernel"], out["recv_kernel"] = np.where(known, send_k, -1), np.where(known, recv_k, -1)
    kernels = _kernels(summary)
    out = _with_kernel_times(out, kernels)
    for side in ("recv", "send"):
        kernel = out[f"{side}_kernel"].to_numpy(np.int64)
        queued = np.zeros(len(out), dtype=bool)
        queued[kernel >= 0] = kernels.loc[kernel[kernel >= 0], "queued"].to_numpy() > 0
        out[f"{side}_queued"] = queued
    out["leave_ns"] = -1
    return out


def _side_kernels(summary: DeviceSummary, file_id: pd.Series, source_index: pd.Series) -> np.ndarray:
    """The kernel each P2P call (its file and row) launched: its number in the run's
    device-op order, -1 where it launched none."""
    sides = summary["sides"]
    side = pd.Series(sides["kernel"], index=pd.MultiIndex.from_arrays([sides["file_id"], sides["source_index"]]))
    side = side[~side.index.duplicated()]
    found = side.reindex(pd.MultiIndex.from_arrays([file_id, source_index])).to_numpy()
    return np.where(np.isnan(found.astype(float)), -1, found).astype(np.int64)


def receives_on_device(messages: pd.DataFrame, summary: DeviceSummary) -> np.ndarray:
    """Whether each message's receive launched a device kernel (NCCL): such a call only
    queues the receive on the GPU and returns, so its host never waited for the data."""
    if messages.empty or "dst_file_id" not in messages or not len(summary["sides"]["kernel"]):
        return np.zeros(len(messages), dtype=bool)
    return _side_kernels(summary, messages["dst_file_id"], messages["dst_source_index"]) >= 0


def _kernels(summary: DeviceSummary) -> pd.DataFrame:
    """The P2P calls' kernels by number: when each ran and whether it queued."""
    sides = summary["sides"]
    tied = sides["kernel"] >= 0
    table = pd.DataFrame(
        {
            "start_ns": sides["kernel_start_ns"][tied],
            "end_ns": sides["kernel_end_ns"][tied],
            "queued": sides["queued"][tied],
        },
        index=pd.Index(sides["kernel"][tied], name="kernel"),
    )
    return table[~table.index.duplicated()]


def kernel_times(messages: pd.DataFrame, summary: DeviceSummary) -> pd.DataFrame:
    """Messages with the times of their linked kernels (``send_kernel``/``recv_kernel``),
    and the wait and transfer those give; -1 where a side has no kernel."""
    return _with_kernel_times(messages, _kernels(summary))


def _with_kernel_times(messages: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """:func:`kernel_times` with the kernels' table (:func:`_kernels`) at hand."""
    out = messages.copy()
    send_k, recv_k = out["send_kernel"].to_numpy(np.int64), out["recv_kernel"].to_numpy(np.int64)
    known = (send_k >= 0) & (recv_k >= 0)
    times = {}
    for side, ids in (("send", send_k), ("recv", recv_k)):
        for edge in ("start", "end"):
            column = np.full(len(out), -1, dtype=np.int64)
            column[known] = kernels.loc[ids[known], f"{edge}_ns"].to_numpy(np.int64)
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
    out["transfer_ns"] = np.where(known, fused_transfer(out, transfer, known), -1)
    return out


def fused_transfer(messages: pd.DataFrame, transfer: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each message's transfer where a kernel moves several messages (a batch_isend_irecv
    group's one fused kernel; Megatron sends and receives up to four at a time).

    A message moves once both its kernels run (from the later start) and a kernel ends when
    the last of its messages is done, so earlier end - later start is only a bound: the
    kernels may end with another message, one whose peer came later or whose link is slower.
    Where a message is the one whose peer came last in one of its kernels (the latest
    "later start" of the kernel's messages, no tie), that kernel ended with it: the kernel's
    end - its later start is its transfer. A link moves a message of one size in about the
    same time, so every message of the link takes the median of those readings, never more
    than its own bound. A link with no reading (each of its messages always fused with one
    whose peer came later: the wrap link of an interleaved pipeline) takes the median reading
    of the run's messages of its size, a link like the others, again never more than its
    own bound."""
    send_k, recv_k = messages["send_kernel"].to_numpy(np.int64), messages["recv_kernel"].to_numpy(np.int64)
    kernels, counts = np.unique(np.concatenate((send_k[known], recv_k[known])), return_counts=True)
    if not len(kernels) or counts.max() < 2:
        return transfer
    later = np.maximum(messages["send_start_ns"].to_numpy(np.int64), messages["recv_start_ns"].to_numpy(np.int64))
    ends = {"send": messages["send_end_ns"].to_numpy(np.int64), "recv": messages["recv_end_ns"].to_numpy(np.int64)}
    # each kernel's messages' later starts: its latest and whether two share it
    latest: dict[int, int] = {}
    ties: dict[int, int] = {}
    for i in np.flatnonzero(known).tolist():
        for k in (int(send_k[i]), int(recv_k[i])):
            if k not in latest or later[i] > latest[k]:
                latest[k], ties[k] = int(later[i]), 1
            elif later[i] == latest[k]:
                ties[k] += 1
    link = list(zip(*(messages[c].to_numpy(np.int64).tolist() for c in ("src_rank", "dst_rank", "nbytes"))))
    readings: dict[tuple[int, int, int], list[int]] = {}
    bounds: dict[tuple[int, int, int], list[int]] = {}
    for i in np.flatnonzero(known).tolist():
        bounds.setdefault(link[i], []).append(int(transfer[i]))
        for side, k in (("send", int(send_k[i])), ("recv", int(recv_k[i]))):
            if later[i] == latest[k] and ties[k] == 1:
                readings.setdefault(link[i], []).append(int(ends[side][i] - later[i]))
    by_size: dict[int, list[int]] = {}
    for (_, _, nbytes), seen in readings.items():
        by_size.setdefault(nbytes, []).extend(seen)
    out = transfer.copy()
    for i in np.flatnonzero(known).tolist():
        sample = readings.get(link[i]) or by_size.get(link[i][2])
        typical = int(np.median(sample)) if sample else min(bounds[link[i]])
        out[i] = max(0, min(int(transfer[i]), typical))
    return out


def wait_and_transfer(
    a_start: ArrayLike, a_end: ArrayLike, b_start: ArrayLike, b_end: ArrayLike, a_rank: ArrayLike, b_rank: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    leave_unheld = out["send_start_ns"].where(
        ~out["recv_queued"].astype(bool), np.maximum(out["send_start_ns"], out["recv_start_ns"])
    )
    # A send queued behind a receive from its own receiver that spun for that receiver (a
    # rank's single P2P ops with one peer share one NCCL stream) was held by the receiver,
    # not by the link or its sender: a host-bound receiver posts its own send late, its
    # peer's receive spins for it, and the peer's send to it waits behind. Had that receive
    # not spun it would have ended one transfer after it began, and the data could leave
    # then, or when the send was posted if later.
    behind = _receive_ahead(messages)
    held = behind >= 0
    leave: pd.Series[Any] | np.ndarray = leave_unheld
    if held.any():
        at = behind[held]
        unblocked = out["recv_start_ns"].to_numpy()[at] + out["transfer_ns"].to_numpy()[at]
        leave = leave_unheld.to_numpy().copy()
        leave[held] = np.maximum(messages["send_post_ns"].to_numpy()[held], unblocked)
    out["leave_ns"] = np.where(known, leave, -1)
    spin = np.where(out["waiting_rank"].to_numpy() == out["dst_rank"].to_numpy(), out["wait_ns"].to_numpy(), 0)
    out.loc[known, "recv_wait_ns"] = spin[known]
    return out


def _receive_ahead(messages: pd.DataFrame) -> np.ndarray:
    """For each message whose send kernel queued behind the P2P kernel before it on its
    stream: the message (row position) its sender was receiving from the same peer in a
    kernel that ended as the send began (within ``QUEUE_SLACK_NS``) after spinning for that
    peer; -1 for the others. The receive is found by its end, not its stream (the sides do
    not say which kernel a queued one waited behind): where sends to a peer have a stream of
    their own, such a receive means the peer posted its side of both late, and the queued
    send waited on the peer all the same."""
    src, dst = messages["src_rank"].to_numpy(np.int64), messages["dst_rank"].to_numpy(np.int64)
    out = np.full(len(messages), -1, dtype=np.int64)
    asking = np.flatnonzero(messages["send_queued"].to_numpy(bool) & (messages["send_kernel"].to_numpy() >= 0))
    spun = np.flatnonzero((messages["waiting_rank"].to_numpy() == dst) & (messages["recv_kernel"].to_numpy() >= 0))
    if not len(asking) or not len(spun):
        return out
    # a receive on rank a from rank b, and a send on rank a to rank b: the same (a, b) code
    receiving, sending = pair_codes(dst[spun], src[spun], (src[asking], dst[asking]))
    ends = messages["recv_end_ns"].to_numpy(np.int64)[spun]
    order = np.lexsort((ends, receiving))
    found = SortedGroups(receiving[order], ends[order]).last_at_most(
        sending, messages["send_start_ns"].to_numpy(np.int64)[asking]
    )
    hit = found >= 0
    candidate = spun[order][np.maximum(found, 0)]
    close = messages["send_start_ns"].to_numpy()[asking] - messages["recv_end_ns"].to_numpy()[candidate]
    other = messages["recv_kernel"].to_numpy()[candidate] != messages["send_kernel"].to_numpy()[asking]
    take = hit & (close <= QUEUE_SLACK_NS) & other
    out[asking[take]] = candidate[take]
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


def pair_p2p_kernels(summary: DeviceSummary) -> pd.DataFrame:
    """Device P2P pairs of a run without matched messages: each rank's P2P kernels for a
    peer, in start order, paired one-to-one with the peer's for that rank (NCCL runs a send
    and its receive as one kernel on each side). Sides come from the host calls that
    launched them (send or recv, with the peer), else from the kernel's own peer (Nsight
    Systems names it from the NCCL range around the launch; with two ranks the peer is the
    other one) with the direction unknown."""
    kernels = summary["p2p_kernels"]
    if not len(kernels["kernel"]):
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    sides_table = summary["sides"]
    sides = []
    seen: set[int] = set()
    for kernel, rank, peer, direction in zip(
        sides_table["kernel"].tolist(),
        sides_table["rank"].tolist(),
        sides_table["peer"].tolist(),
        sides_table["direction"].tolist(),
    ):
        if kernel >= 0 and peer >= 0:
            sides.append((kernel, rank, peer, DIRECTIONS[direction]))
            seen.add(kernel)
    ranks = sorted(r for r, n in summary.n_ops.items() if n)
    for kernel, rank, peer in zip(kernels["kernel"].tolist(), kernels["rank"].tolist(), kernels["peer"].tolist()):
        if kernel in seen:
            continue
        if peer < 0 and len(ranks) == 2:
            peer = ranks[1] if rank == ranks[0] else ranks[0]
        if peer >= 0:
            sides.append((kernel, rank, peer, "?"))
    if not sides:
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    times = pd.DataFrame({c: kernels[c] for c in ("kernel", "start_ns", "end_ns", "step")})
    table = (
        pd.DataFrame(sides, columns=["kernel", "rank", "peer", "direction"])
        .merge(times, on="kernel")
        .sort_values("start_ns", kind="stable")
    )
    # the keys are (rank, peer, direction): pandas-stubs type a groupby key as Hashable
    groups = cast(
        dict[tuple[int, int, str], pd.DataFrame], {k: g for k, g in table.groupby(["rank", "peer", "direction"])}
    )
    rows: list[tuple[Any, ...]] = []
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


def _pair_row(a: int, b: int, s: Any, r: Any, direction: str) -> tuple[Any, ...]:
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


def pair_collective_sendrecv(summary: DeviceSummary) -> pd.DataFrame:
    """SendRecv-named kernels that ran collectives (all_to_all launches them too), paired
    between the two ranks of a two-rank run in start order: they spin for each other like
    P2P kernels do, so wait and transfer mean the same, but they are collectives, never
    pipeline messages (``direction`` "collective"). Runs of other sizes: none (which rank's
    kernel meets which is not in the trace)."""
    ranks = sorted(r for r, n in summary.n_ops.items() if n)
    sendrecv = summary["sendrecv"]
    if len(ranks) != 2 or not len(sendrecv["rank"]):
        return pd.DataFrame(columns=DEVICE_PAIR_COLUMNS)
    a, b = ranks

    def side(rank: int) -> pd.DataFrame:
        mine = sendrecv["rank"] == rank
        table = pd.DataFrame({c: sendrecv[c][mine] for c in ("step", "start_ns", "end_ns")})
        return table.iloc[np.argsort(table["start_ns"].to_numpy(), kind="quicksort")]

    rows = [
        _pair_row(a, b, s, r, "collective")
        for s, r in zip(side(a).itertuples(index=False), side(b).itertuples(index=False))
    ]
    return pd.DataFrame(rows, columns=DEVICE_PAIR_COLUMNS)
