"""The per-message loops that ``tracekit.reconstruct.p2p`` ran before it searched all
messages at once (tracekit 1b5124f, kept as they were): ``tests/test_p2p_fast.py`` holds
the vectorised functions equal to them on every sample and on generated edge cases.

Each walks the receives or messages one at a time: for each, the rank's (or the rank
and step's) annotations or actions, sorted by start with ``DataFrame.sort_values``, and a
searchsorted or a mask over them.

Only the functions the fast version rewrote stand here, as they were in 1b5124f
(``_recv_done_times``, ``_link_actions`` with its ``_way_by_rank``, ``estimate_arrivals``,
``host_p2p_ops``); the constants it left unchanged (``_TOLERANCE_NS``, ``_NCCL_TITLE``) are
imported from ``tracekit.reconstruct.p2p`` and ``tracekit.reconstruct.p2p_sides``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.model.names import RECV_NAMES, SEND_NAMES
from tracekit.model.run import MESSAGE_COLUMNS
from tracekit.reconstruct.p2p import _TOLERANCE_NS
from tracekit.reconstruct.p2p_sides import NCCL_TITLE as _NCCL_TITLE


def _recv_done_times(events: pd.DataFrame, recvs: pd.DataFrame) -> np.ndarray:
    """When each receive's wait returned: the end of its gloo:recv annotation."""
    done = recvs["end_ns"].to_numpy().copy()
    annotations = events[(events["name"] == "gloo:recv") & ~events["on_gpu"]]
    # Sorted by (rank, start) once: each rank's annotations are then a slice, not a filter of
    # the whole table per rank (quadratic in ranks).
    annotations = annotations.sort_values(["rank", "start_ns"], kind="stable")
    a_rank = annotations["rank"].to_numpy()
    a_start = annotations["start_ns"].to_numpy()
    a_end = annotations["end_ns"].to_numpy()
    used = np.zeros(len(annotations), dtype=bool)
    r_rank = recvs["rank"].to_numpy()
    r_start, r_end = recvs["start_ns"].to_numpy(), recvs["end_ns"].to_numpy()
    # each rank's receives in table order, as the per-rank groups were
    for i in np.argsort(r_rank, kind="stable").tolist():
        first = np.searchsorted(a_rank, r_rank[i], side="left")
        last = np.searchsorted(a_rank, r_rank[i], side="right")
        # the annotation posted inside this recv_ op
        lo = first + np.searchsorted(a_start[first:last], r_start[i], side="left")
        hi = first + np.searchsorted(a_start[first:last], r_end[i], side="right")
        for k in range(lo, hi):
            if not used[k]:
                used[k] = True
                done[i] = max(r_end[i], a_end[k])
                break
    return done


def _link_actions(messages: pd.DataFrame, actions: pd.DataFrame, consumer_by_kind: bool) -> None:
    """Fill producer/consumer action ids and direction: the producer is the last action on
    the sender that ended before the send was posted (its kind gives the direction), the
    consumer the first action on the receiver once the data was there. With
    ``consumer_by_kind`` (segmented runs) both are of the kind the message's way needs."""
    n = len(messages)
    producer = np.full(n, -1, dtype=np.int64)
    consumer = np.full(n, -1, dtype=np.int64)
    direction = np.array(["?"] * n, dtype=object)
    by_rank_step = {}
    for key, group in actions.groupby(["rank", "step"]):
        group = group.sort_values("start_ns")
        by_rank_step[key] = (
            group["start_ns"].to_numpy(),
            group["end_ns"].to_numpy(),
            group["action_id"].to_numpy(),
            group["kind"].to_numpy(),
        )
    src, dst, step = (messages[c].tolist() for c in ("src_rank", "dst_rank", "step"))
    dst_step = messages["dst_step"].tolist() if "dst_step" in messages else step
    posted, done = messages["send_post_ns"].to_numpy(), messages["recv_done_ns"].to_numpy()
    last_rank = int(actions["rank"].max()) if len(actions) else -1
    for i in range(n):
        found = by_rank_step.get((src[i], step[i]))
        if found is not None:
            _, ends, ids, kinds = found
            ended = ends <= posted[i] + _TOLERANCE_NS
            way = _way_by_rank(src[i], dst[i], last_rank) if consumer_by_kind else None
            if way == "fwd":
                ended &= kinds == "F"
            elif way == "bwd":
                ended &= (kinds == "B") | (kinds == "I")
            before = np.flatnonzero(ended)
            if len(before):
                k = before[-1]
                producer[i] = ids[k]
                direction[i] = "fwd" if kinds[k] == "F" else "bwd"
        found = by_rank_step.get((dst[i], dst_step[i]))
        if found is not None:
            starts, _, ids, kinds = found
            fits = starts >= done[i] - _TOLERANCE_NS
            # An activation feeds a forward, a gradient a backward (B or I), whatever runs
            # first on the receiver (a schedule may receive ahead of its next use).
            if consumer_by_kind and direction[i] == "fwd":
                fits &= kinds == "F"
            elif consumer_by_kind and direction[i] == "bwd":
                fits &= (kinds == "B") | (kinds == "I")
            after = np.flatnonzero(fits)
            if len(after):
                consumer[i] = ids[after[0]]
    messages["producer_action"] = producer
    messages["consumer_action"] = consumer
    messages["direction"] = direction


def _way_by_rank(src: int, dst: int, last_rank: int) -> str | None:
    """Which way a message of a segmented run goes, where the ranks alone say it: to the next
    rank (or from the last back to the first, a virtual pipeline's wrap) activations, to the
    previous one gradients. None where they do not (two ranks: 1 -> 0 is either; ranks of a
    pipeline that are not consecutive numbers): the producer's kind decides then.

    A send an engine holds back (DeepSpeed posts some activations after its next action) is
    still its forward's output, not that of whatever ran last before it was posted."""
    if last_rank < 2:
        return None
    if dst == src + 1 or (src == last_rank and dst == 0):
        return "fwd"
    if dst == src - 1 or (src == 0 and dst == last_rank):
        return "bwd"
    return None


def estimate_arrivals(messages: pd.DataFrame, actions: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """When each message's data was at the receiver (``arrival_ns``), and how long the
    receiver was blocked on it (``recv_wait_ns``).

    A receive's wait returns at max(wait call, data there). The wait is called once the
    receiver has finished its previous compute and posted its comm ops (``wait_start``);
    the message leaves when the sender posts it, or when its producer ends if later.
    If it left after the wait began, the receiver waited for the sender and the data came
    when the wait returned. If it left earlier, the data was ready to go before anyone
    asked for it: the part of the wait that remains is the transfer itself (rendezvous
    transports like gloo move data only once the receive is posted), so the message is
    taken to arrive that long after it left. Both cases are one formula:
    ``arrival = leaves + done - max(wait_start, leaves)``.
    """
    if messages.empty:
        return messages[MESSAGE_COLUMNS]
    messages = messages.copy()
    cpu = events[~events["on_gpu"]]
    n = len(messages)
    wait_start = np.zeros(n, dtype=np.int64)
    # Sorted end times, once: of each rank's actions, and of each thread's comm ops (only the
    # receiving thread's own comm ops delay its wait; a sender thread's do not).
    action_ends = {int(r): np.sort(g["end_ns"].to_numpy(dtype=np.int64)) for r, g in actions.groupby("rank")}
    ends_by_id = dict(zip(actions["action_id"], actions["end_ns"]))
    comm = cpu[cpu["name"].str.startswith(("c10d::", "record_param_comms"))]
    comm_ends = {
        (int(r), int(tid)): np.sort(g["end_ns"].to_numpy(dtype=np.int64))
        for (r, tid), g in comm.groupby(["rank", "tid"])
    }
    done = messages["recv_done_ns"].to_numpy(dtype=np.int64)
    posted = messages["recv_post_ns"].to_numpy(dtype=np.int64)
    dst = messages["dst_rank"].to_numpy(dtype=np.int64)
    dst_tid = messages["dst_tid"].to_numpy(dtype=np.int64)
    for i in range(n):
        ready = int(posted[i])
        for ends in (action_ends.get(int(dst[i])), comm_ends.get((int(dst[i]), int(dst_tid[i])))):
            if ends is None:
                continue
            k = np.searchsorted(ends, done[i], side="right")
            if k > 0:
                ready = max(ready, int(ends[k - 1]))
        wait_start[i] = min(ready, done[i])
    produced = np.array(
        [ends_by_id.get(a, s) for a, s in zip(messages["producer_action"], messages["send_post_ns"])], dtype=np.int64
    )
    leaves = np.minimum(np.maximum(messages["send_post_ns"].to_numpy(dtype=np.int64), produced), done)
    messages["recv_wait_ns"] = done - wait_start
    messages["arrival_ns"] = leaves + done - np.maximum(wait_start, leaves)
    return messages[MESSAGE_COLUMNS]


def host_p2p_ops(events: pd.DataFrame) -> pd.DataFrame:
    """The host's point-to-point calls, one row per message side (``direction`` send or
    recv). With NCCL one send is several nested or overlapping ranges on its thread
    (``c10d::send`` > ``record_param_comms:send``, and the ``nccl:send 0->1`` title, whose
    end may come later): the first of them stands for all, with the peer and size of
    whichever names them."""
    cpu = events[~events["on_gpu"].to_numpy()]
    names = cpu["name"].astype(str)
    # Matched once per distinct name (a run has tens of them, in hundreds of thousands of rows).
    distinct = pd.Index(names.unique())
    titles = distinct.to_series().str.extract(_NCCL_TITLE).iloc[distinct.get_indexer(names)]
    titles.index = names.index
    is_title = titles[0].notna().to_numpy()
    is_send = names.isin(SEND_NAMES).to_numpy() | (titles[0] == "send").to_numpy()
    is_recv = names.isin(RECV_NAMES).to_numpy() | (titles[0] == "recv").to_numpy()
    chosen = is_send | is_recv
    ops = cpu[chosen].assign(direction=np.where(is_send[chosen], "send", "recv"))
    if ops.empty:
        return ops
    title_peer = titles[3].to_numpy()[chosen]  # "<own rank>-><dst>", "<own rank><-<src>"
    peer = ops["peer"].to_numpy(np.int64).copy()
    from_title = is_title[chosen] & (peer < 0)
    peer[from_title] = title_peer[from_title].astype(np.int64)
    ops = ops.assign(peer=peer).sort_values(["rank", "tid", "start_ns", "end_ns"], ascending=[True, True, True, False])
    keep = np.ones(len(ops), dtype=bool)
    peer = ops["peer"].to_numpy(np.int64).copy()
    nbytes = ops["nbytes"].to_numpy(np.int64).copy()
    rank, tid, direction = ops["rank"].to_numpy(), ops["tid"].to_numpy(), ops["direction"].to_numpy()
    start, end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    # record_param_comms names the job's rank where its group's spacing is given: it wins
    precise = ops["name"].astype(str).str.startswith("record_param_comms").to_numpy()
    outer = -1
    for i in range(len(ops)):
        if (
            outer >= 0
            and rank[i] == rank[outer]
            and tid[i] == tid[outer]
            and direction[i] == direction[outer]
            and start[i] <= end[outer]
        ):
            keep[i] = False
            if peer[outer] < 0 or (precise[i] and peer[i] >= 0):
                peer[outer] = peer[i]
            if nbytes[outer] < 0:
                nbytes[outer] = nbytes[i]
        else:
            outer = i
    return ops.assign(peer=peer, nbytes=nbytes)[keep]
