"""Busy time of a run without pipeline actions, per rank and step, from its events: a
rank's GPU rows (kernels, copies; not ``gpu_user_annotation``) or, where it has none, any
CPU op or annotation but the step marks (and Python frames: they hold ops, they are none),
inside each of its own step windows.

Without pandas, so the process that parsed a GPU rank's file finds its host-side view
there (:mod:`.per_rank`); :func:`tracekit.analyze.bubbles.measure_plain` tabulates the same
rows for a whole run's events table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.model.intervals import union_length
from tracekit.model.names import FRAME_CATEGORY
from tracekit.model.run import STEP_COLUMNS
from tracekit.reconstruct.event_arrays import EventArrays

if TYPE_CHECKING:  # numpy only at import: parser workers run plain_busy
    import pandas as pd

# (rank, step, window start, window end, window, busy), all in ns but rank and step
BubbleRow = tuple[int, int, int, int, int, int]


def plain_busy(events: EventArrays, steps: pd.DataFrame | Mapping[str, Any]) -> list[BubbleRow]:
    """One row per step of ``steps`` (a step table), ranks ascending, a rank's steps in the
    table's order: the union of the rank's work rows inside the step's window."""
    rows: list[BubbleRow] = []
    ranks = events["rank"]
    all_starts, all_ends = events["start_ns"], events["end_ns"]
    on_gpu = events["on_gpu"]
    gpu_work = on_gpu & ~events.is_in("cat", ("gpu_user_annotation",))
    cpu_work = ~events.starts_with("ProfilerStep") & ~events.is_in("cat", (FRAME_CATEGORY,))
    order = np.argsort(ranks, kind="stable")
    sorted_ranks = ranks[order]
    step_rank, step_number, step_start, step_end = (np.asarray(steps[c], dtype=np.int64) for c in STEP_COLUMNS[:4])
    for rank in np.unique(step_rank).tolist():
        lo_i = np.searchsorted(sorted_ranks, rank, side="left")
        hi_i = np.searchsorted(sorted_ranks, rank, side="right")
        mine = order[lo_i:hi_i]
        work = mine[gpu_work[mine]]
        if not len(work):
            work = mine[cpu_work[mine]]
        starts, ends = all_starts[work], all_ends[work]
        for k in np.flatnonzero(step_rank == rank).tolist():
            lo, hi = int(step_start[k]), int(step_end[k])
            inside = (ends > lo) & (starts < hi)
            busy = union_length(starts[inside], ends[inside], lo, hi)
            rows.append((int(rank), int(step_number[k]), lo, hi, hi - lo, busy))
    return rows
