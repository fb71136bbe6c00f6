"""Figures of the device timeline: busy time from kernels, and what kept a GPU idle that a
bubble table alone does not say.

Busy is the union of a rank's device work over all its streams: compute kernels, copies
and sets, and collectives launched inside an action (tensor-parallel collectives are part
of the action's work). Point-to-point kernels are never busy: a SendRecv kernel that starts
before its peer spins until the peer arrives, and the device does no work meanwhile. Each op
counts in the step whose host span holds its launch (``run.device.step``), so work the host
launched in step N and the GPU ran after the host had moved on is step N's.

Per rank and step, beside busy and idle:

- ``launch_wait_ns``: device idle while the host had not yet launched the next op (the gap
  before an op up to its launch call's end): the GPU waited for the host, launch-bound.
- ``step_end_ns``: device work of the step after the pipeline's window closed (optimizer,
  data-parallel gradient collectives): its own share, not pipeline bubble.
- ``p2p_wait_ns`` / ``p2p_transfer_ns``: time the rank's SendRecv kernels spun waiting for
  their peer, and moved data.
- ``collective_idle_ns``: idle time in the window during which a collective kernel outside
  every action ran (all_reduce, all_to_all, ...: waiting for its peers or moving data).
- ``host_ahead_ns`` (per rank): how far the host ran ahead: the longest time from a
  launch call's end to its op's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.analyze.bubbles import bubble_table, rank_windows
from tracekit.model.device import BEFORE_PROFILE, DeviceSummary
from tracekit.model.groups import first_rows, pair_codes, reduce_by, split_by
from tracekit.model.intervals import clipped_length, union_lengths
from tracekit.model.run import Run

DEVICE_RANK_COLUMNS = [
    "rank",
    "step",
    "launch_wait_ns",
    "step_end_ns",
    "p2p_wait_ns",
    "p2p_transfer_ns",
    "collective_idle_ns",
]
# A rank whose GPU waits for the host at least this share of its window is launch-bound.
LAUNCH_BOUND_SHARE = 0.10


@dataclass
class DeviceFigures:
    """What :func:`device_figures` measured (see the module doc)."""

    per_step: pd.DataFrame  # DEVICE_RANK_COLUMNS
    host_ahead_ns: dict[int, int] = field(default_factory=dict)
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)  # messages with device kernels
    # per rank: device work launched before the profile began, left out of every step
    before_profile_ns: dict[int, int] = field(default_factory=dict)

    def per_rank(self) -> pd.DataFrame:
        """Each figure summed over the steps, one row a rank (indexed by it, ascending)."""
        columns = DEVICE_RANK_COLUMNS[2:]
        ranks, sums = reduce_by(
            self.per_step["rank"].to_numpy(), *((self.per_step[c].to_numpy(), np.add) for c in columns)
        )
        return pd.DataFrame(dict(zip(columns, sums)), index=pd.Index(ranks, name="rank"), columns=columns)

    @property
    def host_ahead_max_ns(self) -> int:
        return max(self.host_ahead_ns.values(), default=0)


def measure_device_pipeline(actions: pd.DataFrame, summary: DeviceSummary) -> pd.DataFrame:
    """Bubble table of a pipeline run on the device: each step's window is its actions'
    device spans over all ranks (split per rank where steps overlap:
    :func:`~tracekit.analyze.bubbles.rank_windows`); busy is the union of the rank's busy
    ops of that step."""
    pairs = np.unique(np.stack([actions["rank"].to_numpy(np.int64), actions["step"].to_numpy(np.int64)]), axis=1)
    rank, step = pairs[0], pairs[1]
    lo, hi = rank_windows(actions, rank, step)
    busy = _busy_in(summary, rank, step, lo, hi)
    return bubble_table(
        list(zip(rank.tolist(), step.tolist(), lo.tolist(), hi.tolist(), (hi - lo).tolist(), busy.tolist()))
    )


def measure_device_plain(summary: DeviceSummary) -> pd.DataFrame:
    """Bubble table of a run without pipeline actions, on the device.

    Each step's window runs from its first compute op over all ranks (or from the end of the
    previous step's window, if later) to its last. Windows never overlap: with the host a
    step ahead, side streams run step N+1's work while the main stream still runs step N's,
    and windows that overlapped would count that stretch's idle twice. A rank's idle in a
    window is the time none of its profiled compute ran there, so the idle of the windows
    adds up to the device's idle over its span.

    A rank's busy in a step is the step's own compute, the union of what it launched,
    wherever it ran (a step keeps its work; work another step launched that ran in this
    window is neither this step's busy nor idle), and its window is busy + idle. Work
    launched before the profile began (step ``BEFORE_PROFILE``) is no step's: a rank's
    windows begin where it ends (``DeviceSummary.before_profile`` says how much it was)."""
    extents = summary["compute_steps"]
    in_step = extents["step"] >= 0
    step_col, rank_col = extents["step"][in_step], extents["rank"][in_step]
    steps, (step_lo, step_hi) = reduce_by(
        step_col, (extents["lo_ns"][in_step], np.minimum), (extents["hi_ns"][in_step], np.maximum)
    )
    present = split_by(step_col, rank_col)
    own_busy = dict(zip(zip(rank_col.tolist(), step_col.tolist()), extents["busy_ns"][in_step].tolist()))
    before = extents["step"] == BEFORE_PROFILE
    begins = dict(zip(extents["rank"][before].tolist(), extents["hi_ns"][before].tolist()))
    rank_q, step_q, lo_q, hi_q = [], [], [], []
    previous_end = None
    for step, span_lo, span_hi in zip(steps, step_lo, step_hi):
        lo, hi = int(span_lo), int(span_hi)
        if previous_end is not None:
            lo = min(max(lo, previous_end), hi)
        previous_end = hi if previous_end is None else max(previous_end, hi)
        for rank in sorted(set(present[int(step)].tolist())):
            rank_q.append(rank)
            step_q.append(int(step))
            lo_q.append(min(max(lo, begins.get(rank, lo)), hi))
            hi_q.append(hi)
    lo_a, hi_a = np.array(lo_q, dtype=np.int64), np.array(hi_q, dtype=np.int64)
    idle = (hi_a - lo_a) - _compute_in(summary, np.array(rank_q, dtype=np.int64), lo_a, hi_a)
    busy = np.array([own_busy[key] for key in zip(rank_q, step_q)], dtype=np.int64)
    return bubble_table(list(zip(rank_q, step_q, lo_q, hi_q, (busy + idle).tolist(), busy.tolist())))


def device_figures(run: Run, bubbles: pd.DataFrame) -> DeviceFigures:
    """Launch waits, step-end work, P2P wait and transfer per rank and step (module doc),
    from the run's device summary (:mod:`tracekit.model.device`): no op is read."""
    summary = run.device_summary
    windows = bubbles[["rank", "step", "window_start_ns", "window_end_ns"]].to_numpy(np.int64)
    rank, step, lo, hi = windows[:, 0], windows[:, 1], windows[:, 2], windows[:, 3]
    has_ops = _folded(summary, "n_ops", rank, step, lo, hi) > 0
    launch_wait = _launch_wait(summary, rank, step, lo, hi)
    after = _busy_after(summary, rank, step, hi)
    paired = run.device_pairs
    p2p_wait, p2p_transfer = _p2p_sums(paired, rank, step)
    collective = _stretches_in(summary, "collective_idle", rank, lo, hi)
    zero = np.zeros(len(rank), dtype=np.int64)
    per_step = pd.DataFrame(
        {
            "rank": rank,
            "step": step,
            **{
                c: np.where(has_ops, v, zero)
                for c, v in zip(DEVICE_RANK_COLUMNS[2:], (launch_wait, after, p2p_wait, p2p_transfer, collective))
            },
        },
        columns=DEVICE_RANK_COLUMNS,
    )
    before = {rank: busy for rank, (busy, _, _) in sorted(summary.before_profile().items()) if busy > 0}
    return DeviceFigures(
        per_step=per_step,
        host_ahead_ns=dict(sorted(summary.host_ahead_ns.items())),
        pairs=paired,
        before_profile_ns=before,
    )


def _lookup(keys: tuple[np.ndarray, np.ndarray], rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """For each (rank, step) query, the row of ``keys`` (rank and step columns, one row a
    pair) that holds it; -1 where none does."""
    key_code, query_code = pair_codes(keys[0], keys[1], (rank, step))
    return first_rows(key_code, query_code)


def _rows_of(table: dict[str, np.ndarray], rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``table`` whose (rank, step) is queried, and which query each is."""
    query = _lookup((rank, step), table["rank"], table["step"])
    rows = np.flatnonzero(query >= 0)
    return rows, query[rows]


def _folded(
    summary: DeviceSummary, column: str, rank: np.ndarray, step: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Each queried rank's step's ``column`` of the steps table (what it folded, or its op
    count; 0 where it has no row), after checking that each window holds the span it was folded over (tracekit.reconstruct.device_rank)."""
    steps = summary["steps"]
    found = _lookup((steps["rank"], steps["step"]), rank, step)
    known = found >= 0
    span_lo, span_hi = steps["span_lo_ns"][found[known]], steps["span_hi_ns"][found[known]]
    folded = span_lo <= span_hi
    if ((lo[known] > span_lo) & folded).any() or ((hi[known] < span_hi) & folded).any():
        raise RuntimeError("a step window does not hold the device span its rank's step was folded over")
    total = np.zeros(len(rank), dtype=np.int64)
    total[known] = steps[column][found[known]]
    return total


def _busy_in(summary: DeviceSummary, rank: np.ndarray, step: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Busy time of each queried rank's step inside [lo, hi)."""
    total = _folded(summary, "busy_inside_ns", rank, step, lo, hi)
    busy = summary["busy"]
    rows, query = _rows_of(busy, rank, step)
    np.add.at(total, query, clipped_length(busy["start_ns"][rows], busy["end_ns"][rows], lo[query], hi[query]))
    return total


def _busy_after(summary: DeviceSummary, rank: np.ndarray, step: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Busy time of each queried rank's step after ``hi`` (the step's work past its window):
    its busy stretches and its gradient collectives (no action's work, but the step's), each
    moment once."""
    busy = summary["busy"]
    rows, query = _rows_of(busy, rank, step)
    starts, ends, queries = [busy["start_ns"][rows]], [busy["end_ns"][rows]], [query]
    collectives = summary["collectives"]
    if len(collectives["rank"]):
        rows, query = _rows_of(collectives, rank, step)
        gradient = collectives["gradient"][rows] > 0
        starts.append(collectives["start_ns"][rows][gradient])
        ends.append(collectives["end_ns"][rows][gradient])
        queries.append(query[gradient])
    never = np.full(len(rank), np.iinfo(np.int64).max, dtype=np.int64)
    return union_lengths(np.concatenate(queries), np.concatenate(starts), np.concatenate(ends), hi, never)


def _launch_wait(
    summary: DeviceSummary, rank: np.ndarray, step: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Device idle in [lo, hi) before ops the host had not launched yet: for each gap in the
    rank's device activity of the step (any op, any stream), the part before the next op's
    launch ended."""
    total = _folded(summary, "wait_inside_ns", rank, step, lo, hi)
    gaps = summary["gaps"]
    rows, query = _rows_of(gaps, rank, step)
    covered = np.maximum(gaps["covered_ns"][rows], lo[query])
    gap_hi = np.minimum(gaps["start_ns"][rows], hi[query])
    waited = np.minimum(gaps["launched_ns"][rows], gap_hi) - covered
    np.add.at(total, query, np.where((gap_hi > covered) & (waited > 0), waited, 0))
    return total


def _compute_in(summary: DeviceSummary, rank: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Each queried rank's compute time inside [lo, hi) (any step's: ranks not folded)."""
    return _stretches_in(summary, "compute", rank, lo, hi)


def _stretches_in(summary: DeviceSummary, name: str, rank: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Each queried rank's time inside [lo, hi) covered by table ``name``'s disjoint stretches."""
    total = np.zeros(len(rank), dtype=np.int64)
    compute = summary[name]
    by_rank = split_by(compute["rank"], np.arange(len(compute["rank"])))
    for r, queries in split_by(rank, np.arange(len(rank))).items():
        mine = by_rank.get(r)
        if mine is None:
            continue
        starts, ends = compute["start_ns"][mine], compute["end_ns"][mine]  # disjoint, in time order
        before = np.concatenate(([0], np.cumsum(ends - starts)))
        total[queries] = _covered_before(starts, ends, before, hi[queries]) - _covered_before(
            starts, ends, before, lo[queries]
        )
    return total


def _covered_before(starts: np.ndarray, ends: np.ndarray, before: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How much of the disjoint stretches (in time order; ``before``: their lengths' running
    sum from 0) lies before each ``t``."""
    i = np.searchsorted(starts, t, side="left")  # stretches starting before t
    last = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.minimum(t, ends[last] if len(ends) else 0) - (starts[last] if len(starts) else 0), 0)
    out: np.ndarray = before[last] + partial
    return np.where(i > 0, out, 0)


def _p2p_sums(paired: pd.DataFrame, rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per queried (rank, step): the wait of the P2P pairs it waited in, the transfer of those
    it sent or received."""
    wait, transfer = np.zeros(len(rank), dtype=np.int64), np.zeros(len(rank), dtype=np.int64)
    if paired.empty:
        return wait, transfer
    p_step = paired["step"].to_numpy(np.int64)
    src, dst = paired["src_rank"].to_numpy(np.int64), paired["dst_rank"].to_numpy(np.int64)
    waiting = paired["waiting_rank"].to_numpy(np.int64)
    query = _lookup((rank, step), waiting, p_step)
    np.add.at(wait, query[query >= 0], paired["wait_ns"].to_numpy(np.int64)[query >= 0])
    moved = paired["transfer_ns"].to_numpy(np.int64)
    for side, also in ((src, None), (dst, src)):
        query = _lookup((rank, step), side, p_step)
        take = query >= 0
        if also is not None:
            take &= side != also  # a pair with src == dst counted once
        np.add.at(transfer, query[take], moved[take])
    return wait, transfer
