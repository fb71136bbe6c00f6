"""Integer groups of rows (a rank, a rank and step, a rank and thread) without pandas: values
sorted within groups and searched for every query at once (one ``searchsorted`` over all
groups instead of a slice and a search per group), tuples coded as one int64, rows numbered
by their group. Shared by reconstruction and the analyses."""

from __future__ import annotations

from typing import Literal

import numpy as np


class SortedGroups:
    """Values in groups, laid out so that one searchsorted places every query in its own
    group: ``group`` ascending (any int64 labels), ``values`` ascending within each group.
    A value's key is its group's number times (distinct values + 1) plus its rank among
    the distinct values, so each group's keys lie above the group's before it and below
    the one's after it."""

    def __init__(self, group: np.ndarray, values: np.ndarray) -> None:
        self.labels, number = np.unique(np.asarray(group, dtype=np.int64), return_inverse=True)
        self.number = number.astype(np.int64)
        self.values = values
        self.distinct = np.unique(values)
        self.width = len(self.distinct) + 1
        self.keys = self.number * self.width + np.searchsorted(self.distinct, values)

    def position(self, group: np.ndarray, x: np.ndarray, side: Literal["left", "right"]) -> np.ndarray:
        """Where each ``x`` goes among its group's values, as searchsorted(values of the
        group, x, side) offset by the group's start (a group with no values: 0)."""
        number = np.searchsorted(self.labels, np.asarray(group, dtype=np.int64))
        known = number < len(self.labels)
        known[known] = self.labels[number[known]] == np.asarray(group)[known]
        if side == "left":
            key = np.searchsorted(self.distinct, x, side="left")  # a value >= x iff its rank >= key
        else:
            key = np.searchsorted(self.distinct, x, side="right") - 1  # a value <= x iff its rank <= key
        found = np.searchsorted(self.keys, np.where(known, number, -1) * self.width + key, side=side)
        return np.where(known, found, 0)

    def first_at_least(self, group: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Each query's position of the first value >= x of its group; -1 where none."""
        return self._inside(self.position(group, x, "left"), group)

    def last_at_most(self, group: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Each query's position of the last value <= x of its group; -1 where none."""
        return self._inside(self.position(group, x, "right") - 1, group)

    def _inside(self, position: np.ndarray, group: np.ndarray) -> np.ndarray:
        ok = (position >= 0) & (position < len(self.number))
        ok[ok] = self.labels[self.number[position[ok]]] == np.asarray(group)[ok]
        return np.where(ok, position, -1)


def holding(
    span_group: np.ndarray, span_start: np.ndarray, span_end: np.ndarray, group: np.ndarray, t: np.ndarray
) -> np.ndarray:
    """For each query (``group``, ``t``): the span of its group that started last at or before
    ``t``, where that span still runs at ``t`` (its index into the spans given), else -1.
    Every query at once (:class:`SortedGroups`), however many groups."""
    span_group, span_start = np.asarray(span_group, dtype=np.int64), np.asarray(span_start, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    out = np.full(len(t), -1, dtype=np.int64)
    if not len(span_start) or not len(t):
        return out
    order = np.lexsort((span_start, span_group))
    k = SortedGroups(span_group[order], span_start[order]).last_at_most(np.asarray(group, dtype=np.int64), t)
    found = np.flatnonzero(k >= 0)
    span = order[k[found]]
    runs = np.asarray(span_end, dtype=np.int64)[span] >= t[found]
    out[found[runs]] = span[runs]
    return out


def pair_codes(first: np.ndarray, second: np.ndarray, *more: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One int64 per (first, second) pair, ordered as the pairs are, the same pair the same
    code across every set given (``more``: further (first, second) sets)."""
    sets = [(first, second), *more]
    seconds = np.unique(np.concatenate([np.asarray(b, dtype=np.int64) for _, b in sets]))
    width = len(seconds)
    return [
        np.asarray(a, dtype=np.int64) * width + np.searchsorted(seconds, np.asarray(b, dtype=np.int64)) for a, b in sets
    ]


def group_ids(*keys: np.ndarray) -> np.ndarray:
    """Each row's group of equal ``keys`` (columns of one length) as a number; groups are
    numbered in the keys' sort order."""
    n = len(keys[0])
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys[::-1])
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for key in keys:
        ordered = key[order]
        change[1:] |= ordered[1:] != ordered[:-1]
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(change) - 1
    return ids


def split_by(key: np.ndarray, items: np.ndarray) -> dict[int, np.ndarray]:
    """``items`` by their ``key`` (one int per item), keys ascending, each part in the items'
    order."""
    order = np.argsort(key, kind="stable")
    keys, first = np.unique(np.asarray(key)[order], return_index=True)
    return dict(zip(keys.tolist(), np.split(np.asarray(items)[order], first[1:])))


def reduce_by(key: np.ndarray, *columns: tuple[np.ndarray, np.ufunc]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each distinct ``key`` (ascending) and, for each ``(values, ufunc)``, the ufunc reduced
    over the values of its rows (``np.add``: sums, ``np.minimum``: least, ...), in their dtype."""
    key = np.asarray(key)
    order = np.argsort(key, kind="stable")
    keys, first = np.unique(key[order], return_index=True)
    if not len(keys):
        return keys, [np.asarray(values)[:0] for values, _ in columns]
    return keys, [ufunc.reduceat(np.asarray(values)[order], first) for values, ufunc in columns]


def first_rows(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query (an int64 code, e.g. of :func:`pair_codes`), the first row of ``keys``
    that holds it; -1 where none does."""
    distinct, first = np.unique(np.asarray(keys, dtype=np.int64), return_index=True)
    return _per_query(distinct, first, queries, -1)


def counts_of(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query (an int64 code, e.g. of :func:`pair_codes`), how many rows of ``keys``
    hold it."""
    distinct, counts = np.unique(np.asarray(keys, dtype=np.int64), return_counts=True)
    return _per_query(distinct, counts, queries, 0)


def _per_query(distinct: np.ndarray, value: np.ndarray, queries: np.ndarray, missing: int) -> np.ndarray:
    """``value`` of each query's entry in the sorted ``distinct``; ``missing`` where it has none."""
    if not len(distinct):
        return np.full(len(queries), missing, dtype=np.int64)
    at = np.minimum(np.searchsorted(distinct, queries), len(distinct) - 1)
    found: np.ndarray = np.where(distinct[at] == queries, value[at], missing)
    return found
