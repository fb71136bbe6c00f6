"""Nesting depth of intervals on each thread, shared by every parser.

The rule is a stack walk (:func:`nesting_depth_walk`): on each thread, intervals in start
order, longer first; an interval's depth is the number of enclosing intervals still open.
Walking 60k rows in Python costs ~50 ms a file, a third of parsing a GPU trace, so
:func:`nesting_depth` walks them in C where the optional extension ``_nesting`` is built
(``tracekit/ingest/_nesting.c``: ~1 ms), and otherwise computes the same numbers with array
operations on every thread: nested or not, with async spans or without (see its docstring
for why that is exact). ``TRACEKIT_NATIVE=0`` turns the C walk off.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tracekit.ingest.options import native_allowed

try:
    from tracekit.ingest import _nesting  # type: ignore[attr-defined]  # a C extension, no stub
except ImportError:  # not built (no C compiler at install): the array computation below
    _nesting = None


def nesting_depth(
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    transparent: np.ndarray | None = None,
    apart: np.ndarray | None = None,
) -> np.ndarray:
    """Depth of each interval within the intervals of its (pid, tid): 0 = top level.

    An interval is nested in another when it starts inside it and does not outlast it;
    intervals that merely overlap (ill-formed traces) are treated as siblings.
    ``transparent`` marks async spans (gloo's send/recv annotations run from posting to
    the wait's return, across unrelated ops): they get a depth but are nobody's parent.
    ``apart`` marks rows that take no part in the others' nesting (Python frames, which
    hold the ops they call: the rules that read depth must see the ops where they were
    without them): every other row's depth is the one it has without them, and each of
    them is as deep as the rows it holds: the depth a transparent row gets among the others.
    Equal to :func:`nesting_depth_walk` on every input (a property test checks).

    How, without walking: the walk's stack of ends never increases from bottom to top (a
    row pops every end it starts at or after, or outlasts, so the ends left are all >= its
    own, which it pushes). So a popping row pops exactly the entries it pops by value, and
    each parent-capable row ``c`` stays on the stack until the first later row ``k`` of its
    thread with ``s[k] >= e[c]`` or ``e[k] > e[c]``; call that ``pop[c]``. The depth of row
    ``j`` is then the number of capable rows ``c < j`` with ``pop[c] > j``.
    """
    if apart is not None and apart.any():
        return _apart_depths(nesting_depth, pid, tid, start, end, transparent, apart)
    n = len(start)
    depth = np.zeros(n, dtype=np.int16)
    if n == 0:
        return depth
    order, bounds = _thread_order_fast(pid, tid, start, end)
    if _nesting is not None and native_allowed():
        through = None if transparent is None else np.ascontiguousarray(transparent, dtype=bool)
        _nesting.walk(_int64(start), _int64(end), through, _int64(order), _int64(bounds), depth)
        return depth
    s, e = start[order], end[order]
    capable = np.ones(n, dtype=bool) if transparent is None else ~np.asarray(transparent, dtype=bool)[order]
    # First later row of the thread starting at or after the end (starts are sorted).
    pop = np.empty(n, dtype=np.int64)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        pop[lo:hi] = np.searchsorted(s[lo:hi], e[lo:hi], side="left") + lo
    rows = np.arange(n)
    np.maximum(pop, rows + 1, out=pop)
    # Rows starting inside a capable row may outlast it (async spans, ill-formed overlaps):
    # the first of them pops it earlier.
    inner = np.flatnonzero(capable & (pop > rows + 1))
    if len(inner):
        pop[inner] = _first_larger(e, inner, pop[inner])
    before = np.cumsum(capable) - capable  # capable rows before j
    popped = np.cumsum(np.bincount(pop[capable], minlength=n + 1))[:n]  # capable rows popped by j
    depth[order] = before - popped
    return depth


def _int64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def nesting_depth_walk(
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    transparent: np.ndarray | None = None,
    apart: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`nesting_depth` by walking every thread with a stack (the reference)."""
    if apart is not None and apart.any():
        return _apart_depths(nesting_depth_walk, pid, tid, start, end, transparent, apart)
    n = len(start)
    depth = np.zeros(n, dtype=np.int16)
    if n == 0:
        return depth
    order, bounds = _thread_order(pid, tid, start, end)
    parent = np.ones(n, dtype=bool) if transparent is None else ~np.asarray(transparent, dtype=bool)[order]
    starts, ends, parents = start[order].tolist(), end[order].tolist(), parent.tolist()
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        out.extend(_walk(starts[lo:hi], ends[lo:hi], parents[lo:hi]))
    depth[order] = out
    return depth


def _thread_order(
    pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by thread, then start, then longer first (parents before children), then
    row number; and the offsets where each thread's rows begin (plus the end)."""
    return _bounds(pid, tid, np.lexsort((-(end - start), start, tid, pid)))


def _thread_order_fast(
    pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_thread_order` without sorting by duration: profilers write rows nearly in
    start order, which stable sorts by start, tid and pid take in a few passes (~4x faster
    than ``lexsort`` with the duration key); the duration only orders rows of one thread
    that start together, so only those are sorted by it."""
    order = np.argsort(start, kind="stable")
    order = order[np.argsort(tid[order], kind="stable")]
    order = order[np.argsort(pid[order], kind="stable")]
    p, t, s = pid[order], tid[order], start[order]
    same = (s[1:] == s[:-1]) & (t[1:] == t[:-1]) & (p[1:] == p[:-1])  # as the row before
    if same.any():
        tied = np.zeros(len(order), dtype=bool)
        tied[1:] = same
        tied[:-1] |= same
        at = np.flatnonzero(tied)
        group = np.cumsum(np.concatenate(([True], ~same)))[at]
        rows = order[at]  # in row order within each group: the sorts above are stable
        order[at] = rows[np.lexsort((-(end[rows] - start[rows]), group))]
    return _bounds(pid, tid, order)


def _bounds(pid: np.ndarray, tid: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pid_s, tid_s = pid[order], tid[order]
    change = np.flatnonzero((pid_s[1:] != pid_s[:-1]) | (tid_s[1:] != tid_s[:-1])) + 1
    return order, np.concatenate(([0], change, [len(order)]))


def _apart_depths(
    depth_of: Callable[..., np.ndarray],
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    transparent: np.ndarray | None,
    apart: np.ndarray,
) -> np.ndarray:
    """Depths by ``depth_of`` (the array computation or the walk) with rows ``apart``: theirs
    as transparent rows among all, the others' from the others alone."""
    depth = depth_of(pid, tid, start, end, apart if transparent is None else transparent | apart)
    others = np.flatnonzero(~apart)
    through = None if transparent is None else transparent[others]
    depth[others] = depth_of(pid[others], tid[others], start[others], end[others], through)
    return depth


def _walk(starts: list[int], ends: list[int], parents: list[bool]) -> list[int]:
    """One thread's depths by the stack rule (plain lists: ~2x faster than numpy scalars)."""
    out = [0] * len(starts)
    stack: list[int] = []
    for i, (s, e) in enumerate(zip(starts, ends)):
        while stack and (s >= stack[-1] or e > stack[-1]):
            stack.pop()
        out[i] = len(stack)
        if parents[i]:
            stack.append(e)
    return out


def _first_larger(e: np.ndarray, rows: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """For each row ``c`` of ``rows``: the first row ``k`` in ``[c + 1, limit)`` with
    ``e[k] > e[c]``, else ``limit``.

    Most rows have no such ``k`` (nothing outlasts them): the largest end in their range is
    the larger of two blocks of ``2**j`` rows covering it, with block maxima built one
    power of two at a time (memory: two arrays of the rows). The rest (the ops an async
    span outlasts) take binary lifting over a table of every power's block maxima, built
    only over the rows their ranges cover."""
    first = rows + 1
    level = np.frexp((limit - first).astype(np.float64))[1] - 1  # floor(log2(width)), width >= 1
    by_level = np.argsort(level, kind="stable")
    cuts = np.searchsorted(level[by_level], np.arange(int(level.max()) + 2))
    most = np.empty(len(rows), dtype=e.dtype)
    block = e  # block[i]: the largest end of rows i .. i + 2**k - 1
    for k in range(len(cuts) - 1):
        at = by_level[cuts[k] : cuts[k + 1]]
        most[at] = np.maximum(block[first[at]], block[limit[at] - (1 << k)])
        if k + 2 < len(cuts):
            block = np.maximum(block[: -(1 << k)], block[1 << k :])
    out = limit.copy()
    hit = np.flatnonzero(most > e[rows])
    if len(hit):
        out[hit] = _lift(e, first[hit], limit[hit], e[rows[hit]])
    return out


def _lift(e: np.ndarray, pos: np.ndarray, limit: np.ndarray, own: np.ndarray) -> np.ndarray:
    """The first row in ``[pos, limit)`` ending after ``own`` (else ``limit``), for each
    query, by binary lifting over ``e[lo:hi]``, the rows the queries cover."""
    lo, hi = int(pos.min()), int(limit.max())
    span = e[lo:hi]
    pos, limit = pos - lo, limit - lo
    top = int(np.frexp(float((limit - pos).max()))[1] - 1)
    blocks = np.empty((top + 1, len(span)), dtype=e.dtype)  # blocks[k, i]: largest end of rows i .. i + 2**k - 1
    blocks[0] = span
    for k in range(1, top + 1):
        half, valid = 1 << (k - 1), len(span) - (1 << k) + 1
        np.maximum(blocks[k - 1, :valid], blocks[k - 1, half : half + valid], out=blocks[k, :valid])
    for k in range(top, -1, -1):  # advance by each block, largest first, while none of it ends later
        ok = pos + (1 << k) <= limit
        ok[ok] = blocks[k, pos[ok]] <= own[ok]
        pos[ok] += 1 << k
    return pos + lo
