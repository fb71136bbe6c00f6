"""Idle intervals on the measured timeline, each labelled with a cause, for drawing.

Attribution is per rank and step (a counterfactual replay has no single "moment" where a
cause acts), so the timeline's shading lays each rank's attributed totals over its idle
intervals in time order: warm-up on the earliest idle time, drain on the latest, and the
other causes end to end over the middle intervals, in the order of tracekit.vocab (each
cause's ``drawn``). The shaded lengths per cause equal the attributed ones exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.vocab import CATEGORIES, IDLE_CAUSES

if TYPE_CHECKING:  # the package imports this module
    from tracekit.analyze import Analysis

INTERVAL_COLUMNS = ["rank", "step", "start_ns", "end_ns", "cause"]
# Where each cause's idle goes (tracekit.vocab's Cause.drawn): from the front, from the back,
# then the middle ones end to end over what is left.
_FRONT = tuple(c.key for c in IDLE_CAUSES if c.drawn == "front")
_BACK = tuple(c.key for c in IDLE_CAUSES if c.drawn == "back")
_MIDDLE = tuple(c.key for c in IDLE_CAUSES if c.drawn == "middle")


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
    middle = stretches
    for cause in _FRONT:  # warm-up from the front
        middle = _lay_at_end(rank, step, middle, cause, budget[cause], rows, from_back=False)
    for cause in _BACK:  # drain from the back
        middle = _lay_at_end(rank, step, middle, cause, budget[cause], rows, from_back=True)
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


def _lay_at_end(
    rank: int,
    step: int,
    stretches: list[tuple[int, int]],
    cause: str,
    ns: int,
    rows: list[tuple[int, int, int, int, str]],
    from_back: bool,
) -> list[tuple[int, int]]:
    """Lay ``ns`` of ``cause`` over ``stretches`` (in time order) from the front, or from the
    back, appending its intervals to ``rows``; returns what is left of the stretches, in order."""
    kept: list[tuple[int, int]] = []
    for lo, hi in reversed(stretches) if from_back else stretches:
        take = min(ns, hi - lo)
        if take > 0:
            rows.append((rank, step, hi - take, hi, cause) if from_back else (rank, step, lo, lo + take, cause))
            ns -= take
        if take < hi - lo:
            kept.append((lo, hi - take) if from_back else (lo + take, hi))
    return kept[::-1] if from_back else kept


BLAMED_COLUMNS = [*INTERVAL_COLUMNS, "blamed_stage", "blamed_src_rank", "blamed_dst_rank"]
NO_BLAME = -1  # an interval of a cause no stage or link is blamed for


def blamed_intervals(analysis: Analysis) -> pd.DataFrame:
    """:func:`idle_intervals` with who each is blamed on: a rank's imbalance intervals of a
    step are cut, in time order, into the stages its ``stage_blame`` rows charge (largest
    share first) and its comm intervals into the links of ``link_blame``, so each stage's
    (link's) intervals add up to its blame exactly. Columns: those of :func:`idle_intervals`,
    ``blamed_stage``, ``blamed_src_rank`` and ``blamed_dst_rank`` (-1 where not blamed on one)."""
    intervals = idle_intervals(analysis)
    if analysis.attribution is None or intervals.empty:
        return intervals.assign(blamed_stage=NO_BLAME, blamed_src_rank=NO_BLAME, blamed_dst_rank=NO_BLAME)[
            BLAMED_COLUMNS
        ]
    # (rank, step, cause) -> who is blamed and for how many ns, in the order laid out
    shares: dict[tuple[int, int, str], list[tuple[tuple[int, int, int], int]]] = {}
    for attributed in analysis.attribution.steps:
        stages = attributed.stage_blame.sort_values(["imbalance_ns", "stage"], ascending=[False, True], kind="stable")
        for rank, stage, ns in zip(stages["rank"], stages["stage"], stages["imbalance_ns"]):
            key = (int(rank), attributed.step, "imbalance")
            shares.setdefault(key, []).append(((int(stage), NO_BLAME, NO_BLAME), int(ns)))
        links = attributed.link_blame.sort_values(
            ["comm_ns", "src_rank", "dst_rank"], ascending=[False, True, True], kind="stable"
        )
        for rank, src, dst, ns in zip(links["rank"], links["src_rank"], links["dst_rank"], links["comm_ns"]):
            key = (int(rank), attributed.step, "comm")
            shares.setdefault(key, []).append(((NO_BLAME, int(src), int(dst)), int(ns)))
    rows: list[tuple[int, int, int, int, str, int, int, int]] = []
    unblamed = (NO_BLAME, NO_BLAME, NO_BLAME)
    queues = {key: [share for share in blamed if share[1] > 0] for key, blamed in shares.items()}
    in_order = intervals.sort_values(["rank", "step", "cause", "start_ns"], kind="stable")
    for rank, step, lo, hi, cause in in_order[INTERVAL_COLUMNS].itertuples(index=False, name=None):
        queue = queues.get((int(rank), int(step), str(cause)), [])
        cursor = int(lo)
        while cursor < hi:
            if not queue:  # blame short of the cause's idle (none recorded): the rest is unblamed
                rows.append((int(rank), int(step), cursor, int(hi), str(cause), *unblamed))
                break
            who, left = queue[0]
            take = min(left, int(hi) - cursor)
            rows.append((int(rank), int(step), cursor, cursor + take, str(cause), *who))
            cursor += take
            queue[0] = (who, left - take)
            if queue[0][1] == 0:
                queue.pop(0)
    frame = pd.DataFrame(rows, columns=BLAMED_COLUMNS)
    return frame.sort_values(["rank", "step", "start_ns"], kind="stable", ignore_index=True)
