"""Idle intervals on the measured timeline, each labelled with a cause, for drawing.

Attribution is per rank and step (a counterfactual replay has no single "moment" where a
cause acts), so the timeline's shading lays each rank's attributed totals over its idle
intervals in time order: warm-up on the earliest idle time, drain on the latest, and the
middle intervals split among schedule gaps, imbalance, comm and overhead in proportion
to the rank's shares. The shaded lengths per cause equal the attributed ones exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.vocab import CATEGORIES

if TYPE_CHECKING:  # the package imports this module
    from tracekit.analyze import Analysis

INTERVAL_COLUMNS = ["rank", "step", "start_ns", "end_ns", "cause"]
_MIDDLE = ("schedule_gaps", "imbalance", "comm", "overhead")


def gaps(actions: pd.DataFrame, window_start: int, window_end: int) -> list[tuple[int, int]]:
    """Idle stretches of one rank's actions inside [window_start, window_end)."""
    out = []
    cursor = window_start
    for start, end in sorted(zip(actions["start_ns"], actions["end_ns"])):
        if start > cursor:
            out.append((cursor, int(start)))
        cursor = max(cursor, int(end))
    if window_end > cursor:
        out.append((cursor, window_end))
    return out


def idle_intervals(analysis: Analysis) -> pd.DataFrame:
    """One row per shaded idle interval: rank, step, start_ns, end_ns, cause."""
    if analysis.attribution is None:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    actions = analysis.run.actions
    b = analysis.bubbles
    windows = {
        (int(r), int(s)): (int(lo), int(hi))
        for r, s, lo, hi in zip(b["rank"], b["step"], b["window_start_ns"], b["window_end_ns"])
    }
    rows: list[tuple[int, int, int, int, str]] = []
    columns = ["rank", "step", *[f"{c}_ns" for c in CATEGORIES]]
    for rank, step, *cause_ns in analysis.attribution.table[columns].to_numpy(dtype=np.int64).tolist():
        lo, hi = windows[(rank, step)]
        rank_actions = actions[(actions["rank"] == rank) & (actions["step"] == step)]
        stretches = gaps(rank_actions, lo, hi)
        rows.extend(_lay_out(rank, step, stretches, dict(zip(CATEGORIES, cause_ns))))
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def _lay_out(
    rank: int, step: int, stretches: list[tuple[int, int]], budget: dict[str, int]
) -> list[tuple[int, int, int, int, str]]:
    rows: list[tuple[int, int, int, int, str]] = []
    # warm-up from the front
    remaining = budget["warmup"]
    front: list[tuple[int, int]] = []
    for lo, hi in stretches:
        take = min(remaining, hi - lo)
        if take > 0:
            rows.append((rank, step, lo, lo + take, "warmup"))
            remaining -= take
        if lo + take < hi:
            front.append((lo + take, hi))
    # drain from the back
    remaining = budget["drain"]
    middle: list[tuple[int, int]] = []
    for lo, hi in reversed(front):
        take = min(remaining, hi - lo)
        if take > 0:
            rows.append((rank, step, hi - take, hi, "drain"))
            remaining -= take
        if hi - take > lo:
            middle.append((lo, hi - take))
    middle.reverse()
    # The middle causes are laid end to end over the middle intervals as one running total,
    # so each cause's drawn length equals its budget exactly.
    queue = [(c, budget[c]) for c in _MIDDLE if budget[c] > 0]
    for lo, hi in middle:
        cursor = lo
        while cursor < hi and queue:
            cause, left = queue[0]
            take = min(left, hi - cursor)
            rows.append((rank, step, cursor, cursor + take, cause))
            cursor += take
            if left == take:
                queue.pop(0)
            else:
                queue[0] = (cause, left - take)
    return rows
