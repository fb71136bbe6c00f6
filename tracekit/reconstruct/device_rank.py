"""One rank's device timeline, reduced to what the cross-rank analysis reads.

numpy only: it runs where a GPU rank's file was parsed (:mod:`.per_rank`), and rank by rank
over the client's device table where the working sets were read (the report, exports): one
implementation. Given the rank's device ops in table order (by start, then end), its host
point-to-point sides (:mod:`.p2p_sides`) and its actions (host spans), it:

- ties each P2P side to the kernel it launched: the first NCCL/RCCL kernel its thread launched at
  or after the call began (``batch_isend_irecv`` posts several sides and launches one fused
  kernel when the group closes: all of them map to it); kernels P2P can run in
  (:data:`P2P_CAPABLE_KERNEL`: NCCL's SendRecv, RCCL's generic kernel) so tied are ``p2p``;
- gives each op the action whose host label holds its launch (same step), each action its
  device span (first to last op it launched) and busy time (their union); an action that
  launched nothing gets an empty span where its rank's device was when it ran;
- says when each side's kernel ran and whether it started only when the P2P kernel before
  it on its stream ended (queued behind the link's earlier traffic);
- reduces each step's ops to a :class:`Profile` that answers, for a window [lo, hi), the
  busy time in it, the device idle spent waiting for the host to launch, and the busy time
  after it: exactly, without the ops.

Busy is the union of compute kernels (and copies, sets) and of collectives launched inside
an action; P2P kernels are never busy (a P2P kernel spins until its peer arrives).

Why a profile is small: a pipeline step's window runs from the first action start to the
last action end over ALL ranks, so it holds the rank's own actions' span [a, b]. Every op
inside [a, b] then adds the same to each answer, whatever the window: those add up to two
constants, and only the stretches before a and after b (the step's first ops, its optimizer
and gradient collectives) are kept. Where the window is not known to hold [a, b] (a run
without pipeline actions, or a single rank's, whose windows come from compute ops), nothing
is folded (``compress=False``) and the rank's compute intervals are kept for those windows.
A rank without actions keeps no busy stretch: its busy ops are the step's compute ops, and
a window built from compute ops (the only kind it is asked about) ends after the last of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tracekit.model.groups import SortedGroups, holding, split_by
from tracekit.model.device import BEFORE_PROFILE, DEVICE_TABLES, NO_SPAN, NOTHING_BEFORE, DeviceSummary, empty_table
from tracekit.model.intervals import covered_lengths, merge_intervals, subtract_intervals, union_lengths
from tracekit.reconstruct.recompute import recompute_spans
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.p2p_sides import p2p_sides

# Op kinds by name (device_columns.op_kind), as codes; P2P also for kernels P2P can run in
# that a host P2P call launched.
COMPUTE, COLLECTIVE, P2P = 0, 1, 2
KINDS = ("compute", "collective", "p2p")
# NCCL's SendRecv kernels: P2P or, launched by all_to_all, a collective's (the sendrecv table).
SENDRECV_KERNEL = re.compile(r"SendRecv", re.IGNORECASE)
# The kernels P2P can run in: NCCL's SendRecv kernels, and RCCL's one kernel for every op,
# P2P or collective (rccl_main_kernel to ROCm 6.1, ncclDevKernel_Generic in 6.2,
# ncclDevKernel_Generic_1/_2/_4 from 6.3). The name never says P2P: the host call that
# launched the kernel does (_link_sides).
P2P_CAPABLE_KERNEL = re.compile(r"SendRecv|ncclDevKernel(?:Debug)?_Generic|rccl_main_kernel", re.IGNORECASE)
# Each action's device span and busy time, as reduce_ranks gives them beside its actions.
DEVICE_ACTION_COLUMNS = ("dev_start_ns", "dev_end_ns", "busy_ns")
# A kernel that starts within this of the previous kernel's end on its stream waited for it.
QUEUE_SLACK_NS = 2_000


@dataclass(frozen=True)
class RankOps:
    """One rank's device ops, in table order (by start, then end; ties in file order)."""

    step: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    stream: np.ndarray
    launch_ns: np.ndarray  # the launch call's start (-1: no launch recorded)
    launch_end_ns: np.ndarray
    launch_tid: np.ndarray
    kind: np.ndarray  # COMPUTE / COLLECTIVE / P2P, by name
    sendrecv: np.ndarray  # the name says SendRecv
    p2p_capable: np.ndarray  # the name is a kernel P2P can run in (P2P_CAPABLE_KERNEL)
    peer: np.ndarray  # the peer the op's own row names (-1)

    def __len__(self) -> int:
        return len(self.start_ns)


@dataclass(frozen=True)
class RankActions:
    """One rank's actions: their step, order in it and host spans."""

    step: np.ndarray
    order: np.ndarray
    label_start_ns: np.ndarray
    label_end_ns: np.ndarray
    start_ns: np.ndarray  # host start (an action of a rank that launched nothing sits there)
    forward: np.ndarray | None = None  # 1 for a forward (F) action (None: not known)

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True)
class RankSides:
    """One rank's host P2P sides (:class:`.p2p_sides.Sides` order): thread and start."""

    tid: np.ndarray
    start_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)


@dataclass
class Profile:
    """A rank's steps reduced (module doc): per step, the actions' span [a, b] folded and the
    constants it folded; the busy stretches and launch gaps outside it; with ``compress=False``
    also every compute stretch of the rank and each step's compute extent."""

    steps: dict[str, np.ndarray]  # the columns of tracekit.model.device.DEVICE_TABLES, but rank
    busy: dict[str, np.ndarray]  # merged busy stretches not inside [a, b]
    gaps: dict[str, np.ndarray]  # ops whose launch wait depends on the window
    compute: dict[str, np.ndarray] | None = None  # compress=False
    compute_steps: dict[str, np.ndarray] | None = None  # compress=False


@dataclass
class RankDevice:
    """What :func:`reduce_rank` found (module doc)."""

    kind: np.ndarray  # per op: KINDS code, P2P-capable kernels tied to P2P calls made P2P
    owner: np.ndarray  # per op: index of the action that launched it, -1
    action_start_ns: np.ndarray  # per action: device span (empty where it launched nothing)
    action_end_ns: np.ndarray
    action_busy_ns: np.ndarray
    sides: dict[str, np.ndarray]  # per side: its kernel (op index, -1), when it ran, queued
    p2p_kernels: dict[str, np.ndarray]  # every P2P kernel
    sendrecv: dict[str, np.ndarray]  # SendRecv kernels of collectives
    collective_idle: dict[str, np.ndarray]  # collectives outside actions while nothing busy ran
    collectives: dict[str, np.ndarray]  # every collective kernel: in an action or gradient
    recompute: dict[str, np.ndarray]  # kernels a recomputation launched (activation checkpointing)
    profile: Profile
    host_ahead_ns: int | None  # the longest launch end to op start (None: nothing launched)
    n_ops: int = 0

    def tables(self, rank: int, side_columns: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        """This rank's rows of the run's tables (:data:`tracekit.model.device.DEVICE_TABLES`),
        ``rank`` added; ``side_columns``: its P2P sides' own columns (file_id, source_index,
        direction, peer), beside their kernels."""
        profile = self.profile
        found = {
            "steps": profile.steps,
            "busy": profile.busy,
            "gaps": profile.gaps,
            "compute": profile.compute,
            "compute_steps": profile.compute_steps,
            "sides": {**side_columns, **self.sides},
            "p2p_kernels": self.p2p_kernels,
            "sendrecv": self.sendrecv,
            "collective_idle": self.collective_idle,
            "collectives": self.collectives,
            "recompute": self.recompute,
        }
        out = {}
        for name, table in found.items():
            columns = DEVICE_TABLES[name]
            n = len(table[columns[0]]) if table is not None else 0
            values = {c: np.asarray(table[c], dtype=np.int64) for c in columns} if table is not None else {}
            out[name] = {"rank": np.full(n, rank, dtype=np.int64), **values} if n else empty_table(name)
        return out


def kind_codes(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each distinct op name's kind code, whether it says SendRecv and whether P2P can run in
    it (decided once a name)."""
    from tracekit.reconstruct.device_columns import op_kind

    kinds = np.array([KINDS.index(op_kind(n)) for n in names], dtype=np.int8)
    sendrecv = np.array([bool(SENDRECV_KERNEL.search(n)) for n in names], dtype=bool)
    p2p_capable = np.array([bool(P2P_CAPABLE_KERNEL.search(n)) for n in names], dtype=bool)
    return kinds, sendrecv, p2p_capable


def reduce_rank(
    ops: RankOps,
    sides: RankSides,
    actions: RankActions,
    compress: bool,
    recompute: Mapping[str, np.ndarray] | None = None,
) -> RankDevice:
    """One rank's device timeline reduced (module doc). ``compress``: the run's windows hold
    each step's actions (a pipeline of several ranks): fold each step's span. ``recompute``:
    the rank's recomputations on the host (:func:`.recompute.recompute_spans`: tid,
    start_ns, end_ns), whose kernels are listed apart."""
    kind = ops.kind.astype(np.int8, copy=True)
    side_kernel = _link_sides(ops, kind, sides)
    owner = _owners(ops, kind, actions)
    gradient = _gradient_collectives(ops, kind, owner, actions)
    owner[gradient] = -1  # launched from a backward hook, but no action waits for it
    a_start, a_end, a_busy = _action_spans(ops, owner, actions)
    queued = _queued(ops, kind)
    linked = side_kernel >= 0
    at = side_kernel[linked]
    side_rows = {"kernel": side_kernel}
    for column, values, none in (
        ("kernel_start_ns", ops.start_ns, -1),
        ("kernel_end_ns", ops.end_ns, -1),
        ("queued", queued, 0),
    ):
        side_rows[column] = np.full(len(sides), none, dtype=np.int64)
        side_rows[column][linked] = values[at]
    p2p = np.flatnonzero(kind == P2P)
    collective_sendrecv = np.flatnonzero((kind == COLLECTIVE) & ops.sendrecv)
    launched = ops.launch_end_ns >= 0
    ahead = ops.start_ns[launched] - ops.launch_end_ns[launched]
    busy = (kind == COMPUTE) | ((kind == COLLECTIVE) & (owner >= 0))
    profiled = ops.step != BEFORE_PROFILE
    alone = (kind == COLLECTIVE) & (owner < 0) & profiled
    busy_profiled = busy & profiled
    idle_start, idle_end = subtract_intervals(
        ops.start_ns[alone], ops.end_ns[alone], ops.start_ns[busy_profiled], ops.end_ns[busy_profiled]
    )
    return RankDevice(
        kind=kind,
        owner=owner,
        action_start_ns=a_start,
        action_end_ns=a_end,
        action_busy_ns=a_busy,
        sides=side_rows,
        p2p_kernels={
            "kernel": p2p.astype(np.int64),
            "step": ops.step[p2p],
            "start_ns": ops.start_ns[p2p],
            "end_ns": ops.end_ns[p2p],
            "peer": ops.peer[p2p],
        },
        sendrecv={c: getattr(ops, c)[collective_sendrecv] for c in DEVICE_TABLES["sendrecv"]},
        collective_idle={"start_ns": idle_start, "end_ns": idle_end},
        collectives=_collective_rows(ops, kind, owner, gradient, actions, busy & profiled),
        recompute=_recompute_rows(ops, kind, recompute),
        profile=_profile(ops, busy, actions, a_start, a_end, compress),
        host_ahead_ns=max(0, int(ahead.max())) if len(ahead) else None,
        n_ops=len(ops),
    )


def _link_sides(ops: RankOps, kind: np.ndarray, sides: RankSides) -> np.ndarray:
    """For each side, the op index of the kernel it launched (-1), and P2P-capable kernels so
    tied made P2P in ``kind`` (in place)."""
    out = np.full(len(sides), -1, dtype=np.int64)
    comm = np.flatnonzero((kind != COMPUTE) & (ops.launch_ns >= 0))
    if not len(comm) or not len(sides):
        return out
    comm = comm[np.lexsort((ops.launch_ns[comm], ops.launch_tid[comm]))]
    launches = SortedGroups(ops.launch_tid[comm], ops.launch_ns[comm])
    first = launches.first_at_least(sides.tid, sides.start_ns)
    found = first >= 0
    out[found] = comm[first[found]]
    tied = np.unique(out[found])
    p2p = tied[ops.p2p_capable[tied]]
    kind[p2p] = P2P
    return np.where(np.isin(out, p2p), out, -1)


def _owners(ops: RankOps, kind: np.ndarray, actions: RankActions) -> np.ndarray:
    """Each op's action: the one of its step whose host label holds its launch (-1)."""
    owner = np.full(len(ops), -1, dtype=np.int64)
    launched = np.flatnonzero((kind != P2P) & (ops.launch_ns >= 0))
    if not len(launched) or not len(actions):
        return owner
    by_label = np.lexsort((actions.label_start_ns, actions.step))
    labels = SortedGroups(actions.step[by_label], actions.label_start_ns[by_label])
    t = ops.launch_ns[launched]
    k = labels.last_at_most(ops.step[launched], t)
    inside = k >= 0
    inside[inside] = t[inside] <= actions.label_end_ns[by_label[k[inside]]]
    owner[launched[inside]] = by_label[k[inside]]
    return owner


def _gradient_collectives(ops: RankOps, kind: np.ndarray, owner: np.ndarray, actions: RankActions) -> np.ndarray:
    """Per op: a gradient collective launched inside an action. Data-parallel gradient
    reduction overlapped with the backward (torch DDP's bucket hooks, Megatron's
    ``overlap_grad_reduce``: megatron/core/distributed/param_and_grad_buffer.py
    ``start_grad_sync``) launches its all-reduce or reduce-scatter from a backward hook, on
    its own process group's stream, and nothing waits for it before the optimizer
    (``finish_grad_sync``). So: the collectives of a stream none of whose collectives an
    action of the forward launched, on a rank that runs forwards. A tensor-parallel stream
    all-reduces inside every forward (megatron/core/tensor_parallel/mappings.py): action work."""
    gradient = np.zeros(len(ops), dtype=bool)
    owned = (kind == COLLECTIVE) & (owner >= 0)
    if actions.forward is None or not owned.any() or not actions.forward.any():
        return gradient
    streams = np.unique(ops.stream[owned])
    forward_streams = np.unique(ops.stream[owned & (actions.forward[np.maximum(owner, 0)] > 0)])
    for stream in np.setdiff1d(streams, forward_streams):
        gradient |= owned & (ops.stream == stream)
    return gradient


def _collective_rows(
    ops: RankOps, kind: np.ndarray, owner: np.ndarray, gradient: np.ndarray, actions: RankActions, busy: np.ndarray
) -> dict[str, np.ndarray]:
    """Every collective kernel of the profile (not SendRecv's P2P): step, times, stream, the
    order of the action that launched it (-1: none), whether it is a gradient collective, and
    how much of it no compute kernel overlapped (``alone_ns``: what busy loses without it)."""
    rows = np.flatnonzero((kind == COLLECTIVE) & (ops.step != BEFORE_PROFILE))
    compute = (kind == COMPUTE) & busy
    start, end = ops.start_ns[rows], ops.end_ns[rows]
    alone = end - start
    if len(rows) and compute.any():
        alone = alone - covered_lengths(start, end, *merge_intervals(ops.start_ns[compute], ops.end_ns[compute]))
    order = np.where(owner[rows] >= 0, actions.order[np.maximum(owner[rows], 0)] if len(actions) else -1, -1)
    return {
        "step": ops.step[rows],
        "start_ns": start,
        "end_ns": end,
        "stream": ops.stream[rows],
        "order": order.astype(np.int64),
        "gradient": (gradient[rows] | (owner[rows] < 0)).astype(np.int64),
        "alone_ns": alone,
    }


def _recompute_rows(ops: RankOps, kind: np.ndarray, spans: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The compute kernels a recomputation launched: launched on its thread while it ran."""
    picked = np.zeros(len(ops), dtype=bool)
    if spans is not None:
        held = holding(spans["tid"], spans["start_ns"], spans["end_ns"], ops.launch_tid, ops.launch_ns)
        picked = (held >= 0) & (ops.launch_ns >= 0) & (kind == COMPUTE)
    rows = np.flatnonzero(picked & (ops.step != BEFORE_PROFILE))
    return {"step": ops.step[rows], "start_ns": ops.start_ns[rows], "end_ns": ops.end_ns[rows]}


def _action_spans(ops: RankOps, owner: np.ndarray, actions: RankActions) -> tuple[np.ndarray, ...]:
    """Each action's device span and busy time; actions that launched nothing: an empty
    span at their rank's device time (after the action before them), else their host start."""
    n = len(actions)
    start, end = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    owned = np.flatnonzero(owner >= 0)
    busy = np.zeros(n, dtype=np.int64)
    if len(owned):
        mine = owner[owned]
        start[:] = np.iinfo(np.int64).max
        np.minimum.at(start, mine, ops.start_ns[owned])
        np.maximum.at(end, mine, ops.end_ns[owned])
        start[start == np.iinfo(np.int64).max] = -1
        lo, hi = np.full(n, np.iinfo(np.int64).min), np.full(n, np.iinfo(np.int64).max)
        busy = union_lengths(mine, ops.start_ns[owned], ops.end_ns[owned], lo, hi)
    _fill_empty(start, end, actions)
    return start, end, busy


def _fill_empty(start: np.ndarray, end: np.ndarray, actions: RankActions) -> None:
    """Empty device spans for actions that launched nothing (in place), in (step, order)."""
    if not (start < 0).any():
        return
    last = -1
    pending: list[int] = []
    for i in np.lexsort((actions.order, actions.step)).tolist():
        if start[i] < 0:
            if last >= 0:
                start[i] = end[i] = last
            else:
                pending.append(i)
            continue
        for p in pending:
            start[p] = end[p] = start[i]
        pending = []
        last = max(last, int(end[i]))
    for p in pending:  # a rank that launched nothing at all: its host start
        start[p] = end[p] = actions.start_ns[p]


def _queued(ops: RankOps, kind: np.ndarray) -> np.ndarray:
    """Whether each op started only when the P2P kernel before it on its stream ended."""
    queued = np.zeros(len(ops), dtype=bool)
    if len(ops) < 2:
        return queued
    order = np.lexsort((ops.start_ns, ops.stream))
    stream, start, end = ops.stream[order], ops.start_ns[order], ops.end_ns[order]
    same = stream[1:] == stream[:-1]
    queued[order[1:]] = same & (kind[order[:-1]] == P2P) & (start[1:] <= end[:-1] + QUEUE_SLACK_NS)
    return queued


def _profile(
    ops: RankOps, busy: np.ndarray, actions: RankActions, a_start: np.ndarray, a_end: np.ndarray, compress: bool
) -> Profile:
    """Each step's :class:`Profile` rows (module doc)."""
    stepped = np.flatnonzero(ops.step >= 0)
    steps, step_of = np.unique(ops.step[stepped], return_inverse=True)  # each stepped op's step, as a position
    # the span [a, b] folded in each step: its actions' (compress), else none (a > b)
    span_lo = np.full(len(steps), NO_SPAN[0], dtype=np.int64)
    span_hi = np.full(len(steps), NO_SPAN[1], dtype=np.int64)
    if compress and len(actions):
        where = np.searchsorted(steps, actions.step)
        known = (where < len(steps)) & (actions.step >= 0)
        known[known] = steps[where[known]] == actions.step[known]
        np.minimum.at(span_lo, where[known], a_start[known])
        np.maximum.at(span_hi, where[known], a_end[known])
    busy_inside = np.zeros(len(steps), dtype=np.int64)
    wait_inside = np.zeros(len(steps), dtype=np.int64)
    busy_rows: list[tuple[np.ndarray, ...]] = []
    gap_rows: list[tuple[np.ndarray, ...]] = []
    by_step = split_by(step_of, stepped)
    for k, mine in sorted(by_step.items()):
        a, b = int(span_lo[k]), int(span_hi[k])
        step = np.int64(steps[k])
        # busy: merged stretches; those inside [a, b] count whole in every window holding it
        work = mine[busy[mine]]
        merged_start, merged_end = merge_intervals(ops.start_ns[work], ops.end_ns[work])
        inside = (merged_start >= a) & (merged_end <= b)
        busy_inside[k] = int((merged_end[inside] - merged_start[inside]).sum())
        if len(actions):  # (without actions, busy is compute of the step: never past its window)
            busy_rows.append(_rows(step, merged_start[~inside], merged_end[~inside]))
        # launch waits: each op in start order after the device's reach so far
        order = mine[np.argsort(ops.start_ns[mine], kind="quicksort")]
        starts, launched = ops.start_ns[order], ops.launch_end_ns[order]
        covered = np.empty(len(order), dtype=np.int64)
        covered[0] = NOTHING_BEFORE
        covered[1:] = np.maximum.accumulate(ops.end_ns[order])[:-1]
        # an op not launched, launched before the reach, or starting inside it never waited
        # in any window (the wait is at most launch end - reach): no row
        can_wait = (launched >= 0) & (launched > covered) & (starts > covered)
        fixed = can_wait & (covered >= a) & (starts <= b)
        waited = np.minimum(launched[fixed], starts[fixed]) - covered[fixed]
        wait_inside[k] = int(waited[waited > 0].sum())
        rest = can_wait & ~fixed
        gap_rows.append(_rows(step, covered[rest], starts[rest], launched[rest]))
    n_ops = np.bincount(step_of, minlength=len(steps)).astype(np.int64)
    profile = Profile(
        steps=dict(
            zip(DEVICE_TABLES["steps"], (steps.astype(np.int64), span_lo, span_hi, busy_inside, wait_inside, n_ops))
        ),
        busy=_columns(DEVICE_TABLES["busy"], busy_rows),
        gaps=_columns(DEVICE_TABLES["gaps"], gap_rows),
    )
    if not compress:
        compute = np.flatnonzero(ops.kind == COMPUTE)
        profiled = compute[ops.step[compute] != BEFORE_PROFILE]
        merged_start, merged_end = merge_intervals(ops.start_ns[profiled], ops.end_ns[profiled])
        profile.compute = {"start_ns": merged_start, "end_ns": merged_end}
        work = compute[(ops.step[compute] >= 0) | (ops.step[compute] == BEFORE_PROFILE)]
        steps_of, lo, hi = _extents(ops.step[work], ops.start_ns[work], ops.end_ns[work])
        # each step's own work, wherever it ran (a step keeps what it launched)
        busy_of = union_lengths(np.searchsorted(steps_of, ops.step[work]), ops.start_ns[work], ops.end_ns[work], lo, hi)
        profile.compute_steps = dict(zip(DEVICE_TABLES["compute_steps"], (steps_of, lo, hi, busy_of)))
    return profile


def _extents(step: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct steps, each one's earliest start and latest end."""
    steps, group = np.unique(step, return_inverse=True)
    lo = np.full(len(steps), np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(len(steps), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, group, start)
    np.maximum.at(hi, group, end)
    return steps.astype(np.int64), lo, hi


def _rows(step: np.int64, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    return (np.full(len(columns[0]), step, dtype=np.int64), *columns)


def _columns(names: tuple[str, ...], rows: list[tuple[np.ndarray, ...]]) -> dict[str, np.ndarray]:
    if not rows:
        return {c: np.zeros(0, dtype=np.int64) for c in names}
    return {c: np.concatenate([r[i] for r in rows]).astype(np.int64) for i, c in enumerate(names)}


def _rank_ops(
    columns: Mapping[str, np.ndarray],
    rows: np.ndarray,
    kinds: np.ndarray,
    sendrecv: np.ndarray,
    p2p_capable: np.ndarray,
) -> RankOps:
    """The ops ``rows`` (in table order) of a set of op columns; ``kinds`` / ``sendrecv`` /
    ``p2p_capable``: per name code (:func:`kind_codes`)."""
    name = columns["name_code"][rows]
    return RankOps(
        step=columns["step"][rows],
        start_ns=columns["start_ns"][rows],
        end_ns=columns["end_ns"][rows],
        stream=columns["stream"][rows],
        launch_ns=columns["launch_ns"][rows],
        launch_end_ns=columns["launch_end_ns"][rows],
        launch_tid=columns["launch_tid"][rows],
        kind=kinds[name],
        sendrecv=sendrecv[name],
        p2p_capable=p2p_capable[name],
        peer=columns["peer"][rows],
    )


@dataclass
class ReducedRanks:
    """:func:`reduce_ranks` of a set of ops: the ranks' tables (rank-local kernel numbers),
    each action's device span and busy time, and each op's kind and action (index into the
    actions given)."""

    part: dict[str, dict[str, np.ndarray]]
    action_columns: dict[str, np.ndarray]  # dev_start_ns, dev_end_ns, busy_ns
    op_kind: np.ndarray
    op_action: np.ndarray


def reduce_ranks(
    columns: Mapping[str, np.ndarray],
    names: list[str],
    host: EventArrays,
    actions: Mapping[str, np.ndarray],
    world_size: Mapping[int, int],
) -> ReducedRanks:
    """Every rank of a set of device ops reduced (:func:`reduce_rank`), its tables joined.

    ``columns``: op columns (:func:`~.device_columns.op_columns`, or the device table's, with
    ``name_code`` into ``names``); ``host``: the ranks' host rows (their P2P calls are read);
    ``actions``: action columns (rank, step, order, label_start_ns, label_end_ns, start_ns);
    ``world_size``: per rank, the job's size its file states (a rank's steps are folded only
    in a pipeline of several ranks: see the module doc)."""
    kinds, sendrecv, p2p_capable = kind_codes(names)
    sides = p2p_sides(host)
    spans = recompute_spans(host)
    spans_of = split_by(spans["rank"], np.arange(len(spans["rank"])))
    side_rank = host["rank"][sides.rows]
    op_rank, action_rank = columns["rank"], np.asarray(actions["rank"], dtype=np.int64)
    ops_of = split_by(op_rank, np.arange(len(op_rank)))
    actions_of = split_by(action_rank, np.arange(len(action_rank)))
    sides_of = split_by(side_rank, np.arange(len(side_rank)))
    none = np.zeros(0, dtype=np.int64)
    dev_start = np.full(len(action_rank), -1, dtype=np.int64)
    dev_end = np.full(len(action_rank), -1, dtype=np.int64)
    busy = np.zeros(len(action_rank), dtype=np.int64)
    op_kind = np.zeros(len(op_rank), dtype=np.int8)
    op_action = np.full(len(op_rank), -1, dtype=np.int64)
    rank_tables: list[dict[str, dict[str, np.ndarray]]] = []
    ahead: dict[int, int] = {}
    n_ops: dict[int, int] = {}
    for rank in sorted(set(ops_of) | set(actions_of)):
        rows = ops_of.get(rank, none)
        rows = rows[np.lexsort((columns["end_ns"][rows], columns["start_ns"][rows]))]  # table order
        mine = actions_of.get(rank, none)
        side_rows = sides.rows[sides_of.get(rank, none)]
        found = reduce_rank(
            _rank_ops(columns, rows, kinds, sendrecv, p2p_capable),
            RankSides(tid=host["tid"][side_rows], start_ns=host["start_ns"][side_rows]),
            RankActions(**{c: _action_field(actions, c)[mine] for c in _ACTION_FIELDS}),
            compress=bool(len(mine)) and world_size.get(rank, 1) > 1,
            recompute={c: spans[c][spans_of[rank]] for c in ("tid", "start_ns", "end_ns")}
            if rank in spans_of
            else None,
        )
        op_kind[rows] = found.kind
        owned = found.owner >= 0
        op_action[rows[owned]] = mine[found.owner[owned]]
        dev_start[mine], dev_end[mine], busy[mine] = found.action_start_ns, found.action_end_ns, found.action_busy_ns
        at = sides_of.get(rank, none)
        side_columns = {
            "file_id": host["file_id"][side_rows],
            "source_index": host["source_index"][side_rows],
            "direction": sides.direction[at],
            "peer": sides.peer[at],
        }
        rank_tables.append(found.tables(rank, side_columns))
        if found.host_ahead_ns is not None:
            ahead[rank] = found.host_ahead_ns
        n_ops[rank] = found.n_ops
    part = stack_part(rank_tables, ahead, n_ops)
    return ReducedRanks(part, dict(zip(DEVICE_ACTION_COLUMNS, (dev_start, dev_end, busy))), op_kind, op_action)


def _action_field(actions: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """An action column as int64; ``forward`` from ``kind`` where not given."""
    if name == "forward" and name not in actions:
        kinds = actions.get("kind")
        if kinds is None:
            return np.zeros(len(np.asarray(actions["step"])), dtype=np.int64)
        forward: np.ndarray = (np.asarray(kinds, dtype=object) == "F").astype(np.int64)
        return forward
    return np.asarray(actions[name], dtype=np.int64)


def stack_part(
    rank_tables: list[dict[str, dict[str, np.ndarray]]], host_ahead_ns: Mapping[int, int], n_ops: Mapping[int, int]
) -> dict[str, dict[str, np.ndarray]]:
    """A file's part, as :func:`join_ranks` takes it: its ranks' tables (:meth:`RankDevice.tables`,
    in rank order) one below the other, each rank's host lead and op count."""
    part = {
        name: {
            c: np.concatenate([t[name][c] for t in rank_tables]) if rank_tables else np.zeros(0, dtype=np.int64)
            for c in ("rank", *DEVICE_TABLES[name])
        }
        for name in DEVICE_TABLES
    }
    part["host_ahead"] = {
        "rank": np.array(list(host_ahead_ns), dtype=np.int64),
        "ns": np.array(list(host_ahead_ns.values()), dtype=np.int64),
    }
    part["n_ops"] = {"rank": np.array(list(n_ops), dtype=np.int64), "n": np.array(list(n_ops.values()), dtype=np.int64)}
    return part


_ACTION_FIELDS = ("step", "order", "label_start_ns", "label_end_ns", "start_ns", "forward")


def join_ranks(parts: list[dict[str, dict[str, np.ndarray]]]) -> DeviceSummary:
    """The run's :class:`~tracekit.model.device.DeviceSummary` from the parts
    :func:`reduce_ranks` gave (a file's each): rows by rank (stably: a rank's rows keep their
    order), kernels numbered in the run's device-op order (by rank, then the rank's own).
    Each column is filled once, part by part, in rank order (a part's rows are by rank
    already): thousands of GPU ranks' tables are not concatenated, cast and sorted in turn."""
    summary = DeviceSummary()
    for part in parts:
        summary.host_ahead_ns.update(zip(part["host_ahead"]["rank"].tolist(), part["host_ahead"]["ns"].tolist()))
        summary.n_ops.update(zip(part["n_ops"]["rank"].tolist(), part["n_ops"]["n"].tolist()))
    spans = [
        (int(p["n_ops"]["rank"].min()), int(p["n_ops"]["rank"].max())) if len(p["n_ops"]["rank"]) else (0, -1)
        for p in parts
    ]
    by_rank = sorted(range(len(parts)), key=lambda i: spans[i])
    # parts whose ranks interleave (one report holding ranks 0 and 2, another 1): sort rows
    interleaved = any(spans[a][1] >= spans[b][0] for a, b in zip(by_rank, by_rank[1:]) if spans[a][1] >= spans[a][0])
    for name in DEVICE_TABLES:
        columns = ("rank", *DEVICE_TABLES[name])
        tables = [parts[i][name] for i in by_rank]
        joined = {c: np.empty(sum(len(t["rank"]) for t in tables), dtype=np.int64) for c in columns}
        at = 0
        for table in tables:
            n = len(table["rank"])
            for c in columns:
                joined[c][at : at + n] = table[c]
            at += n
        if interleaved:
            order = np.argsort(joined["rank"], kind="stable")
            joined = {c: v[order] for c, v in joined.items()}
        summary.tables[name] = joined
    ranks = sorted(summary.n_ops)
    offsets = dict(zip(ranks, np.concatenate(([0], np.cumsum([summary.n_ops[r] for r in ranks])[:-1])).tolist()))
    for name in ("sides", "p2p_kernels"):
        table = summary.tables[name]
        if len(table["rank"]):
            shift = np.array([offsets[r] for r in table["rank"].tolist()], dtype=np.int64)
            table["kernel"] = np.where(table["kernel"] >= 0, table["kernel"] + shift, -1)
    return summary
