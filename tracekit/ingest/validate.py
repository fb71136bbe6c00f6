"""Rows that cannot be real, found and dropped the same way for every parser.

A profiler writes an event's times from one clock, inside one profiling window. A row whose
time is not a number or does not fit in int64 ns, that ends before it starts, that reaches
more than a day away from the rest of its file, or that repeats another row exactly is
damage (a flipped bit, an exporter bug, events written twice), not data: used as data it
gives bubble ratios in the millions. Parsers convert times with :func:`ns_from_us` and
:func:`add_ns`, which give :data:`NOT_A_TIME` for what does not fit instead of wrapping
around, and pass the rows through :func:`drop_impossible` before nesting depth is computed;
the file then carries one warning saying how many rows went and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A time that could not be represented (not finite, or outside int64 after conversion).
NOT_A_TIME = np.iinfo(np.int64).min
_INT64_MAX = np.iinfo(np.int64).max
# Limits in microseconds that keep ``us * 1000`` inside int64 (with room for rounding).
_LIMIT_US = _INT64_MAX // 1000
# One profiling window never spans a day; real captures span seconds to minutes.
MAX_DISTANCE_NS = 24 * 3600 * 10**9
# More than float64's rounding can move a distance between two int64 times (~2 us at most).
_FLOAT_ROOM_NS = 1 << 13

_REASONS = {
    "not_a_time": "with a time that is not a number, overflows int64 ns or lies before the capture began",
    "end_before_start": "with end before start",
    "far": "reaching more than 24 h from the file's other events",
    "duplicate": "exact repeats of another event",
    "category_not_text": "with a category ('cat') that is not text",
}


def ns_from_us(us: np.ndarray) -> np.ndarray:
    """Microseconds (int or float array) to int64 ns, rounding as ``round(us * 1000)``
    does; :data:`NOT_A_TIME` where the value is not finite or the result leaves int64."""
    if us.dtype.kind == "f":
        fits = np.isfinite(us) & (np.abs(us) < _LIMIT_US)
        if fits.all():
            return np.rint(us * 1000.0).astype(np.int64)
        out = np.full(len(us), NOT_A_TIME, dtype=np.int64)
        out[fits] = np.rint(us[fits] * 1000.0).astype(np.int64)
        return out
    us = us.astype(np.int64)
    fits = (us > -_LIMIT_US) & (us < _LIMIT_US)
    if fits.all():
        return us * 1000
    return np.where(fits, np.where(fits, us, 0) * 1000, NOT_A_TIME)


def ns_of_us(value: Any) -> int:
    """One time in microseconds (any JSON number) as int ns, or :data:`NOT_A_TIME`."""
    if isinstance(value, float) and not math.isfinite(value):
        return NOT_A_TIME
    ns = round(value * 1000)
    return ns if -_INT64_MAX <= ns <= _INT64_MAX else NOT_A_TIME


def add_ns(times: np.ndarray, offset: int | np.ndarray) -> np.ndarray:
    """``times + offset`` (offset: an int or an array) in int64 without wrapping around:
    :data:`NOT_A_TIME` where either side is one or the sum leaves int64."""
    times = np.asarray(times, dtype=np.int64)
    offset_arr = np.asarray(offset, dtype=np.int64)
    if times.size and offset_arr.size:
        # The usual case, settled by the extremes: no side holds NOT_A_TIME and no sum can
        # leave int64 (every sum lies between the two below), so no per-row check is needed.
        low, high = times.min(), offset_arr.min()
        if low != NOT_A_TIME and high != NOT_A_TIME:
            if -_INT64_MAX <= int(low) + int(high) and int(times.max()) + int(offset_arr.max()) <= _INT64_MAX:
                return times + offset_arr
    total = times + offset_arr  # numpy wraps silently; the wrapped entries are found below
    wrapped = ((times > 0) & (offset_arr > 0) & (total < 0)) | ((times < 0) & (offset_arr < 0) & (total >= 0))
    bad = wrapped | (times == NOT_A_TIME) | (offset_arr == NOT_A_TIME)
    if bad.any():
        total = np.where(bad, NOT_A_TIME, total)
    return total


# A profiler's clock origin is a wall-clock time: 2000-01-01 to 2100-01-01 in Unix ns.
_WALL_CLOCK_NS = (946_684_800 * 10**9, 4_102_444_800 * 10**9)


def is_wall_clock(ns: int) -> bool:
    """Whether ``ns`` can be the Unix time of a capture (a session start of 12 ns cannot)."""
    return _WALL_CLOCK_NS[0] <= ns < _WALL_CLOCK_NS[1]


def offset_fits(offset: int) -> bool:
    """Whether a clock offset (ns) can be added to times at all."""
    return -_INT64_MAX <= offset <= _INT64_MAX


@dataclass
class DroppedRows:
    """What :func:`drop_impossible` removed from one file, by reason."""

    counts: dict[str, int] = field(default_factory=dict)
    of_rows: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def warning(self, file_name: str) -> str | None:
        """The one warning for the file, or None when nothing was dropped."""
        if not self.total:
            return None
        return (
            f"{file_name}: dropped {self.total:,} of {plural(self.of_rows, 'event')} that cannot "
            f"be real ({self.reasons()}); analysed the rest"
        )

    def reasons(self) -> str:
        """Each reason with its count, most basic first."""
        return ", ".join(f"{n:,} {_REASONS[reason]}" for reason, n in self.counts.items() if n)


def drop_impossible(
    start_ns: np.ndarray, end_ns: np.ndarray, identity: list[np.ndarray]
) -> tuple[np.ndarray | None, DroppedRows]:
    """Which rows to keep (None: all of them) and what was dropped.

    A row is dropped for the first of: a start or end that is :data:`NOT_A_TIME`; end
    before start; a start or end more than :data:`MAX_DISTANCE_NS` from the median start
    of the rows left; being an exact repeat (same times and the same ``identity`` values:
    process, thread, category, name, ids) of an earlier row.
    """
    n = len(start_ns)
    dropped = DroppedRows(of_rows=n)
    if n == 0:
        return None, dropped
    keep = (start_ns != NOT_A_TIME) & (end_ns != NOT_A_TIME)
    dropped.counts["not_a_time"] = int(n - keep.sum())
    backwards = keep & (end_ns < start_ns)
    dropped.counts["end_before_start"] = int(backwards.sum())
    keep &= ~backwards
    if keep.any():
        every = keep.all()
        kept_start, kept_end = (start_ns, end_ns) if every else (start_ns[keep], end_ns[keep])
        extremes = [int(kept_start.min()), int(kept_start.max()), int(kept_end.min()), int(kept_end.max())]
        dropped.counts["far"] = 0
        # No kept row is farther from the median start (itself among the kept starts) than the
        # kept rows span: within a day, less room for float rounding, nothing is far and the
        # median is not needed (the usual case: no partition and no pass over the rows).
        if max(extremes) - min(extremes) > MAX_DISTANCE_NS - _FLOAT_ROOM_NS:
            # float: the distance of a wild value from the median can itself leave int64
            median = float(np.median(kept_start))
            # The distance only grows away from the median, in float64 too (rounding is
            # monotonic): when the extremes are near, every row is.
            if (np.abs(np.array(extremes, dtype=np.float64) - median) > MAX_DISTANCE_NS).any():
                far = keep & (
                    (np.abs(start_ns.astype(np.float64) - median) > MAX_DISTANCE_NS)
                    | (np.abs(end_ns.astype(np.float64) - median) > MAX_DISTANCE_NS)
                )
                dropped.counts["far"] = int(far.sum())
                keep &= ~far
    repeats = _repeats(start_ns, end_ns, identity, keep)
    dropped.counts["duplicate"] = int(repeats.sum())
    keep &= ~repeats
    return (None if keep.all() else keep), dropped


def _repeats(
    start_ns: np.ndarray, end_ns: np.ndarray, identity: list[np.ndarray], candidates: np.ndarray
) -> np.ndarray:
    """Rows (among ``candidates``) equal in every column to an earlier row."""
    out = np.zeros(len(start_ns), dtype=bool)
    # Most rows differ in their times alone: compare whole rows only where the times tie.
    # Rows come nearly in start order, which a stable sort takes fast; only the few rows that
    # share a start are sorted by end too (rows tie only if they share a start).
    if candidates.all():
        order = np.argsort(start_ns, kind="stable")
    else:
        rows = np.flatnonzero(candidates)
        order = rows[np.argsort(start_ns[rows], kind="stable")]
    starts = start_ns[order]
    shared = starts[1:] == starts[:-1]
    if not shared.any():
        return out
    sharing = np.zeros(len(order), dtype=bool)
    sharing[1:] = shared
    sharing[:-1] |= shared
    order = order[sharing]
    order = order[np.lexsort((end_ns[order], start_ns[order]))]
    tie = (start_ns[order][1:] == start_ns[order][:-1]) & (end_ns[order][1:] == end_ns[order][:-1])
    if not tie.any():
        return out
    tied = np.unique(np.concatenate([order[1:][tie], order[:-1][tie]]))
    columns = [start_ns[tied], end_ns[tied]] + [np.asarray(c)[tied] for c in identity]
    # lexsort's last key sorts first; the row number last breaks ties, so the first stays
    order = tied[np.lexsort([tied] + columns[::-1])]
    same = np.ones(len(order) - 1, dtype=bool)
    for column in [start_ns, end_ns] + [np.asarray(c) for c in identity]:
        same &= column[order][1:] == column[order][:-1]
    out[order[1:][same]] = True
    return out


def plural(count: int, noun: str) -> str:
    """``1 event``, ``2,000 events``."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def valid_text(text: str) -> str:
    """``text`` as a string every writer can encode: a lone surrogate (JSON allows the
    escape ``\\ud800``; UTF-8 does not) becomes U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text
