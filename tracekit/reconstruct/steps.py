"""Training steps: ``ProfilerStep#N`` spans on each rank's main thread."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.model.names import STEP_MARK_PREFIX
from tracekit.model.run import STEP_COLUMNS, rank_ranges
from tracekit.reconstruct.event_arrays import EventArrays

if TYPE_CHECKING:
    import pandas as pd

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


def find_steps(events: pd.DataFrame) -> pd.DataFrame:
    """:func:`step_table` of an events table, as a table with ``n_actions`` (0 until counted)."""
    import pandas as pd

    steps = pd.DataFrame(step_table(EventArrays.of(events)), columns=STEP_COLUMNS[:4])
    steps["n_actions"] = 0
    return steps


def step_table(events: EventArrays) -> dict[str, np.ndarray]:
    """One row per rank and step, sorted by both (the first four of
    :data:`~tracekit.model.run.STEP_COLUMNS`). A rank with no step markers is one step
    (number 0) spanning all of its events."""
    is_mark = events.is_in("cat", ("user_annotation",)) & ~events["on_gpu"] & events.starts_with(STEP_MARK_PREFIX)
    marks = np.flatnonzero(is_mark)
    number = events.per_name("name", _step_number, dtype=np.int64)[marks]
    ranks = events["rank"]
    numbered = marks[number >= 0]  # a mark such as ProfilerStep#x marks its rank, yet numbers no step
    rank = [ranks[numbered].astype(np.int64)]
    step = [number[number >= 0]]
    start = [events["start_ns"][numbered].astype(np.int64)]
    end = [events["end_ns"][numbered].astype(np.int64)]
    unmarked = np.setdiff1d(np.unique(ranks), ranks[marks])
    for r in unmarked.tolist():
        mine = ranks == r
        rank.append(np.array([r], dtype=np.int64))
        step.append(np.zeros(1, dtype=np.int64))
        start.append(np.array([events["start_ns"][mine].min()], dtype=np.int64))
        end.append(np.array([events["end_ns"][mine].max()], dtype=np.int64))
    columns = [np.concatenate(c) for c in (rank, step, start, end)]
    order = np.lexsort((columns[1], columns[0]))  # stable: marks in row order where numbers repeat
    return {name: column[order] for name, column in zip(STEP_COLUMNS[:4], columns)}


def steps_cut_short(steps: pd.DataFrame | Mapping[str, Any]) -> dict[int, str]:
    """Each rank whose trace covers fewer of the run's steps than another rank's does, with
    what it covers ("covers steps 2-3 of 2-4"): the profiler stopped early there, or a file
    of another window was put beside the rest. A step table of one rank, or whose ranks all
    cover the same steps, gives none."""
    rank, step = (np.asarray(steps[c], dtype=np.int64) for c in STEP_COLUMNS[:2])
    covered: dict[int, set[int]] = {}
    for r, s in zip(rank.tolist(), step.tolist()):
        covered.setdefault(r, set()).add(s)
    every = set().union(*covered.values()) if covered else set()
    return {
        r: f"covers step{'s' if len(mine) != 1 else ''} {rank_ranges(sorted(mine), most=4)} of "
        f"{rank_ranges(sorted(every), most=4)}"
        for r, mine in sorted(covered.items())
        if mine != every
    }


def _step_number(name: str) -> int:
    match = _STEP_NAME.match(name)
    return int(match.group(1)) if match else -1


def step_of(ranks: np.ndarray, times: np.ndarray, steps: pd.DataFrame | Mapping[str, Any]) -> np.ndarray:
    """The step number each (rank, time) falls in (the earlier step where two touch); -1
    outside every step. ``steps``: a step table (:func:`step_table`, or the run's).

    "Earlier" is the table's order: the first row of the time's rank whose window holds it.
    Each time is checked against its own rank's rows only, the k-th of them for every time
    at once, so the cost is times x (most steps of one rank), not times x all steps."""
    ranks, times = np.asarray(ranks), np.asarray(times)
    out = np.full(len(times), -1, dtype=np.int64)
    rank, step, start, end = (np.asarray(steps[c], dtype=np.int64) for c in STEP_COLUMNS[:4])
    if not len(rank) or not len(times):
        return out
    by_rank = np.argsort(rank, kind="stable")  # a rank's rows in table order
    rank, step, start, end = rank[by_rank], step[by_rank], start[by_rank], end[by_rank]
    first = np.searchsorted(rank, ranks, side="left")
    count = np.searchsorted(rank, ranks, side="right") - first
    found = np.zeros(len(times), dtype=bool)
    for k in range(int(count.max())):
        row = np.minimum(first + k, len(rank) - 1)
        hit = ~found & (count > k) & (times >= start[row]) & (times <= end[row])
        out[hit] = step[row[hit]]
        found |= hit
    return out
