"""Idle intervals on the measured timeline, each labelled with a cause, for drawing.

Attribution is per rank and step (a counterfactual replay has no single "moment" where a
cause acts), so the timeline's shading lays each rank's attributed totals over its idle
intervals in time order: warm-up on the earliest idle time, drain on the latest, and the
middle intervals split among schedule gaps, imbalance, comm and overhead in proportion
to the rank's shares. The shaded lengths per cause equal the attributed ones exactly.
"""
from __future__ import annotations

import pandas as pd

from tracekit.analyze.attribution import CATEGORIES

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


def idle_intervals(analysis) -> pd.DataFrame:
    """One row per shaded idle interval: rank, step, start_ns, end_ns, cause."""
    if analysis.attribution is None:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    actions = analysis.run.actions
    bubbles = analysis.bubbles.set_index(["rank", "step"])
    rows = []
    for row in analysis.attribution.table.itertuples(index=False):
        key = (row.rank, row.step)
        lo, hi = int(bubbles.at[key, "window_start_ns"]), int(bubbles.at[key, "window_end_ns"])
        rank_actions = actions[(actions["rank"] == row.rank) & (actions["step"] == row.step)]
        stretches = gaps(rank_actions, lo, hi)
        budget = {c: int(getattr(row, f"{c}_ns")) for c in CATEGORIES}
        rows.extend(_lay_out(row.rank, row.step, stretches, budget))
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def _lay_out(rank: int, step: int, stretches: list[tuple[int, int]], budget: dict[str, int]) -> list[tuple]:
    rows = []
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
    queue = [[c, budget[c]] for c in _MIDDLE if budget[c] > 0]
    for lo, hi in middle:
        cursor = lo
        while cursor < hi and queue:
            cause, left = queue[0]
            take = min(left, hi - cursor)
            rows.append((rank, step, cursor, cursor + take, cause))
            cursor += take
            queue[0][1] -= take
            if queue[0][1] == 0:
                queue.pop(0)
    return rows
