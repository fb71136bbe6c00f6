"""Lengths of sets of time intervals (ns), shared by reconstruction and the analyses."""

from __future__ import annotations

import numpy as np


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as disjoint stretches, in time order: intervals
    that overlap or touch become one. Empty intervals (end <= start) add nothing."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    real = ends > starts
    starts, ends = starts[real], ends[real]
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # the latest end so far
    first = np.ones(len(starts), dtype=bool)
    first[1:] = starts[1:] > reach[:-1]  # a stretch begins past the reach of the ones before
    begins = np.flatnonzero(first)
    last = np.append(begins[1:] - 1, len(starts) - 1)
    return starts[begins], reach[last]


def clipped_length(starts: np.ndarray, ends: np.ndarray, lo: int | np.ndarray, hi: int | np.ndarray) -> np.ndarray:
    """Each interval's length inside [lo, hi) (0 where it lies outside): the union's length
    where the intervals are disjoint (:func:`merge_intervals`). ``lo`` / ``hi`` may be arrays,
    one bound per interval."""
    inside = np.minimum(ends, hi) - np.maximum(starts, lo)
    out: np.ndarray = np.maximum(inside, 0)
    return out


def union_length(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Total length of the union of [start, end) intervals clipped to [lo, hi)."""
    if len(starts) == 0 or hi <= lo:
        return 0
    merged_starts, merged_ends = merge_intervals(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
    return int((merged_ends - merged_starts).sum())


def union_lengths(
    group: np.ndarray, starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """:func:`union_length` of each group's intervals, all groups at
    once: ``group`` numbers each interval's group (0 .. len(lo) - 1), clipped to that group's
    [lo, hi)."""
    total = np.zeros(len(lo), dtype=np.int64)
    if not len(group):
        return total
    s, e = np.clip(starts, lo[group], hi[group]), np.clip(ends, lo[group], hi[group])
    order = np.lexsort((s, group))
    g, s, e = group[order], s[order], e[order]
    # Each interval's reach: the latest end so far in its group. A running maximum over keys
    # (group, rank of the end) restarts at each group, whose keys all lie above the last's.
    distinct = np.unique(e)
    width = len(distinct) + 1
    reach = distinct[np.maximum.accumulate(g * width + np.searchsorted(distinct, e)) - g * width]
    # A merged stretch starts where a group starts or an interval starts past the reach before it.
    first = np.ones(len(g), dtype=bool)
    first[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    begins = np.flatnonzero(first)
    ends_at = np.append(begins[1:] - 1, len(g) - 1)
    np.add.at(total, g[begins], reach[ends_at] - s[begins])
    return total


def subtract_intervals(
    starts: np.ndarray, ends: np.ndarray, cut_starts: np.ndarray, cut_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the union of [start, end) intervals that no [cut_start, cut_end) interval
    covers, as disjoint stretches in time order.

    The union less the cuts is its intersection with the gaps between the merged cuts: each
    stretch of the union meets a run of consecutive gaps (two binary searches), and each
    meeting is a piece. No sort of every boundary: the cuts (a rank's busy ops) are many,
    the union (its collectives outside actions) mostly few."""
    a_start, a_end = merge_intervals(starts, ends)
    if not len(a_start):  # nothing to cut (most ranks of a pipeline: no collective outside actions)
        return a_start, a_end
    b_start, b_end = merge_intervals(cut_starts, cut_ends)
    if not len(b_start):
        return a_start, a_end
    bound = np.iinfo(np.int64)
    gap_start = np.concatenate(([bound.min], b_end))  # before the first cut, between them, after the last
    gap_end = np.concatenate((b_start, [bound.max]))
    first = np.searchsorted(gap_end, a_start, side="right")  # the first gap ending after the stretch starts
    count = np.maximum(np.searchsorted(gap_start, a_end, side="left") - first, 0)  # gaps starting before it ends
    stretch = np.repeat(np.arange(len(a_start)), count)
    gap = first[stretch] + np.arange(len(stretch)) - np.repeat(np.cumsum(count) - count, count)
    lo = np.maximum(a_start[stretch], gap_start[gap])
    hi = np.minimum(a_end[stretch], gap_end[gap])
    return lo, hi  # positive, and apart: stretches and gaps are both merged


def covered_lengths(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How much of each [start, end) the disjoint stretches [lo, hi), sorted, cover (by a
    running total of their lengths: two searches per interval)."""
    before = np.concatenate(([0], np.cumsum(hi - lo)))  # covered before stretch k

    def reach(t: np.ndarray) -> np.ndarray:  # covered time up to t
        k = np.searchsorted(lo, t, side="right")  # stretches starting at or before t
        last = np.maximum(k - 1, 0)
        inside = np.where(k > 0, np.clip(t - lo[last], 0, hi[last] - lo[last]), 0)
        return np.where(k > 0, before[last], 0) + inside

    covered: np.ndarray = reach(np.asarray(end)) - reach(np.asarray(start))
    return covered
