"""The device timeline of a run as the analyses read it: each GPU rank reduced
(:mod:`tracekit.reconstruct.device_rank`, where its file was parsed or over the device table)
and the ranks joined. Plain numpy columns, no op rows: a rank costs its steps, the stretches
of them that depend on the window, and its P2P kernels.

Tables (dicts of int64 columns, every one with ``rank``):

- ``steps``: per rank and step with device work: the span [span_lo_ns, span_hi_ns] folded
  (its actions' device span; span_lo > span_hi where nothing was folded), the busy time and
  launch waits inside it (``busy_inside_ns``, ``wait_inside_ns``) and how many ops it had.
- ``busy``: merged busy stretches (compute, copies, sets; collectives inside an action) of a
  rank's step not inside its folded span.
- ``gaps``: ops of a rank's step whose launch wait depends on the window: how far the
  device's work reached before the op (``covered_ns``; the step's first op: NOTHING_BEFORE),
  its start and its launch call's end.
- ``compute`` / ``compute_steps`` (ranks not folded): the rank's merged compute stretches, any
  step but work launched before the profile began; each step's compute extent and the busy
  time of its own compute (the union of what it launched, wherever it ran), with a row of
  step ``BEFORE_PROFILE`` (-2) for the work launched before the profile began. Runs without
  pipeline actions are measured by them.
- ``sides``: each host P2P call (message side: ``file_id``, ``source_index``, ``direction``
  0 send / 1 recv, ``peer``) with the kernel it launched (``kernel``: the op's number in the
  run's device-op order, -1), when that kernel ran and whether it ``queued`` behind its
  stream's earlier P2P kernel.
- ``p2p_kernels``: every P2P kernel (its number, step, times, the peer its own row names).
- ``sendrecv``: SendRecv kernels that ran collectives (all_to_all launches them too).
- ``collectives``: every collective kernel (not SendRecv's P2P): its step, times, stream, the
  order of the action that launched it in its step (-1: none), whether it is a gradient
  collective (launched outside every action, or on a stream no forward launched a collective
  on: data-parallel reduction from backward hooks) and the part of it no compute kernel
  overlapped (``alone_ns``). The rest are launched inside actions: tensor-parallel work.
- ``recompute``: the compute kernels an activation recomputation launched (its re-run forward
  ops, :mod:`tracekit.reconstruct.recompute`): step and times.
- ``collective_idle``: stretches where a collective kernel outside every action ran (NCCL
  all_reduce, all_to_all, ...) and no busy op did: idle time spent in collectives, waiting
  for their peers or moving data (work launched before the profile began aside).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Per table, the columns besides ``rank`` (all int64).
DEVICE_TABLES: dict[str, tuple[str, ...]] = {
    "steps": ("step", "span_lo_ns", "span_hi_ns", "busy_inside_ns", "wait_inside_ns", "n_ops"),
    "busy": ("step", "start_ns", "end_ns"),
    "gaps": ("step", "covered_ns", "start_ns", "launched_ns"),
    "compute": ("start_ns", "end_ns"),
    "compute_steps": ("step", "lo_ns", "hi_ns", "busy_ns"),
    "sides": (
        "file_id",
        "source_index",
        "direction",
        "peer",
        "kernel",
        "kernel_start_ns",
        "kernel_end_ns",
        "queued",
    ),
    "p2p_kernels": ("kernel", "step", "start_ns", "end_ns", "peer"),
    "sendrecv": ("step", "start_ns", "end_ns"),
    "collective_idle": ("start_ns", "end_ns"),
    "collectives": ("step", "start_ns", "end_ns", "stream", "order", "gradient", "alone_ns"),
    "recompute": ("step", "start_ns", "end_ns"),
}
# Time columns, moved when a rank's clock is aligned (NOTHING_BEFORE and -1 stay).
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("span_lo_ns", "span_hi_ns"),
    "busy": ("start_ns", "end_ns"),
    "gaps": ("covered_ns", "start_ns", "launched_ns"),
    "compute": ("start_ns", "end_ns"),
    "compute_steps": ("lo_ns", "hi_ns"),
    "sides": ("kernel_start_ns", "kernel_end_ns"),
    "p2p_kernels": ("start_ns", "end_ns"),
    "sendrecv": ("start_ns", "end_ns"),
    "collective_idle": ("start_ns", "end_ns"),
    "collectives": ("start_ns", "end_ns"),
    "recompute": ("start_ns", "end_ns"),
}
# The step of device ops launched before the profile began (a step's number is >= 0; -1 is
# "outside every step").
BEFORE_PROFILE = -2
# An explicit gap's "covered up to" for a step's first op: nothing before it.
NOTHING_BEFORE = int(np.iinfo(np.int64).min)
# A folded span's bounds where nothing was folded (a > b: no window is asked to hold it).
NO_SPAN = (int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min))


def empty_table(name: str) -> dict[str, np.ndarray]:
    return {c: np.zeros(0, dtype=np.int64) for c in ("rank", *DEVICE_TABLES[name])}


@dataclass
class DeviceSummary:
    """The run's device timeline, reduced (module doc)."""

    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=lambda: {n: empty_table(n) for n in DEVICE_TABLES})
    host_ahead_ns: dict[int, int] = field(default_factory=dict)  # per rank: launch end to op start, longest
    n_ops: dict[int, int] = field(default_factory=dict)  # per rank

    def __getitem__(self, name: str) -> dict[str, np.ndarray]:
        return self.tables[name]

    def before_profile(self) -> dict[int, tuple[int, int, int]]:
        """Per rank (ranks not folded), its compute launched before the profile began, kept
        apart from every step: (busy ns, first start, last end)."""
        extents = self.tables["compute_steps"]
        rows = np.flatnonzero(extents["step"] == BEFORE_PROFILE)
        return {
            int(extents["rank"][i]): (int(extents["busy_ns"][i]), int(extents["lo_ns"][i]), int(extents["hi_ns"][i]))
            for i in rows
        }

    def shift(self, shifts: dict[int, int]) -> None:
        """Put ranks on the reference clock: subtract ``shifts[rank]`` from every time of the
        rank (in place), leaving the markers (NOTHING_BEFORE, NO_SPAN, -1) as they are."""
        if not shifts:
            return
        ranks = np.array(sorted(shifts), dtype=np.int64)
        offsets = np.array([shifts[r] for r in ranks.tolist()], dtype=np.int64)
        for name, columns in TIME_COLUMNS.items():
            table = self.tables[name]
            if not len(table["rank"]):
                continue
            at = np.minimum(np.searchsorted(ranks, table["rank"]), len(ranks) - 1)
            by = np.where(ranks[at] == table["rank"], offsets[at], 0)  # each row's rank's offset
            for column in columns:
                values = table[column]
                if name == "sides":  # a side without a kernel has no kernel times (-1)
                    real = table["kernel"] >= 0
                else:
                    real = (values != NOTHING_BEFORE) & (values != NO_SPAN[0]) & (values != NO_SPAN[1])
                table[column] = np.where(real, values - by, values)
