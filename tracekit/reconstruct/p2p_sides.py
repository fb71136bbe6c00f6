"""The host's point-to-point calls, one per message side, on event columns without pandas:
where a file was parsed (a GPU rank's kernels are tied to them there, :mod:`.device_rank`)
and, for the whole run's table, in :func:`tracekit.reconstruct.p2p.host_p2p_ops` (one
implementation).

With NCCL one send is several nested or overlapping ranges on its thread (``c10d::send`` >
``record_param_comms:send``, and the ``nccl:send 0->1`` title, whose end may come later):
the first of them stands for all, with the peer and size of whichever names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tracekit.model.names import RECV_NAMES, SEND_NAMES
from tracekit.reconstruct.event_arrays import EventArrays

# ProcessGroupNCCL's profiling titles name both ranks: "nccl:send 0->1", "nccl:recv 1<-0".
NCCL_TITLE = re.compile(r"^nccl:(send|recv) (\d+)(->|<-)(\d+)$")
SEND, RECV = 0, 1
DIRECTIONS = ("send", "recv")


@dataclass(frozen=True)
class Sides:
    """Message sides: ``rows`` index the events they came from, in the order (rank, thread,
    start, longest first); ``direction`` :data:`SEND` or :data:`RECV`; ``peer`` and
    ``nbytes`` (-1: unknown) gathered from the ranges folded into each."""

    rows: np.ndarray
    direction: np.ndarray
    peer: np.ndarray
    nbytes: np.ndarray


def _name_kind(name: str) -> tuple[int, int]:
    """(direction or -1, the peer a title names or -1) of one distinct name."""
    title = NCCL_TITLE.match(name)
    if name in SEND_NAMES or (title and title.group(1) == "send"):
        return SEND, int(title.group(4)) if title else -1
    if name in RECV_NAMES or (title and title.group(1) == "recv"):
        return RECV, int(title.group(4)) if title else -1
    return -1, -1


def p2p_sides(events: EventArrays) -> Sides:
    """The host's point-to-point calls in ``events``, one per message side (module doc)."""
    values = events.values["name"]
    # decided once per distinct name (a run has tens of them, in hundreds of thousands of rows)
    kinds = np.array([_name_kind(v) for v in values], dtype=np.int64).reshape(-1, 2)
    # NCCL's record_param_comms names the job's rank where the trace says how (its group's
    # "Global rank start"/"stride": tracekit.ingest.kineto_comm); the c10d op around it names
    # a rank of the op's group only: the former's peer wins
    param_comms = np.array([str(v).startswith("record_param_comms") for v in values], dtype=bool)
    codes = events.codes["name"]
    direction = kinds[codes, 0] if len(values) else np.full(len(events), -1, dtype=np.int64)
    title_peer = kinds[codes, 1] if len(values) else np.full(len(events), -1, dtype=np.int64)
    chosen = np.flatnonzero(~events["on_gpu"] & (direction >= 0))
    if not len(chosen):
        empty = np.zeros(0, dtype=np.int64)
        return Sides(empty, empty, empty, empty)
    peer = events["peer"][chosen].astype(np.int64)
    peer = np.where(peer < 0, title_peer[chosen], peer)  # a title's peer where the op names none
    rank, tid = events["rank"][chosen], events["tid"][chosen]
    start, end = events["start_ns"][chosen].astype(np.int64), events["end_ns"][chosen].astype(np.int64)
    order = np.lexsort((-end, start, tid, rank))  # stable: ties keep table order
    rows, direction, peer = chosen[order], direction[chosen][order], peer[order]
    precise = param_comms[events.codes["name"][rows]] if len(values) else np.zeros(len(rows), dtype=bool)
    nbytes = events["nbytes"][rows].astype(np.int64)
    rank, tid, start, end = rank[order], tid[order], start[order], end[order]
    keep = np.ones(len(rows), dtype=bool)
    # Runs of ops of one thread and direction, in order: an op folds into the run's last
    # kept one if it starts before that one ended (a run's first op never folds: the op
    # before it is another thread's or direction's). Only runs where some op starts before
    # the one before it ended can fold (gloo's never do): the walk visits those alone.
    same = np.zeros(len(rows), dtype=bool)
    same[1:] = (rank[1:] == rank[:-1]) & (tid[1:] == tid[:-1]) & (direction[1:] == direction[:-1])
    run = np.cumsum(~same)
    overlaps = same.copy()
    overlaps[1:] &= start[1:] <= end[:-1]
    outer = -1
    for i in np.flatnonzero(np.isin(run, run[overlaps])).tolist():
        if outer >= 0 and run[i] == run[outer] and start[i] <= end[outer]:
            keep[i] = False
            if peer[outer] < 0 or (precise[i] and peer[i] >= 0):
                peer[outer] = peer[i]
            if nbytes[outer] < 0:
                nbytes[outer] = nbytes[i]
        else:
            outer = i
    return Sides(rows[keep], direction[keep], peer[keep], nbytes[keep])
