"""Nesting depth: the C walk (tracekit/ingest/_nesting.c, where built) and the array
computation each equal the stack walk on every input, real or generated (the generated
intervals are a unit-test fixture, not a trace); the C walk refuses bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLES, SHARED_TRACES
from tracekit.ingest import nesting
from tracekit.ingest.kineto import read_kineto
from tracekit.ingest.kineto_rows import ASYNC_SPANS


@pytest.fixture(params=["c", "arrays"])
def way(request, monkeypatch):
    """nesting_depth by the C walk, then by the array computation (TRACEKIT_NATIVE=0)."""
    if request.param == "c":
        if nesting._nesting is None:
            pytest.skip("the C walk is not built (no C compiler at install)")
        monkeypatch.setenv("TRACEKIT_NATIVE", "1")
    else:
        monkeypatch.setenv("TRACEKIT_NATIVE", "0")
    return request.param


def _generated_nested(rng, n: int) -> list[tuple[int, int]]:
    """Properly nested intervals, with empty ones and shared starts and ends."""
    out: list[tuple[int, int]] = []

    def fill(lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and len(out) < n:
            s = t + int(rng.integers(0, 3))
            if s > hi:
                return
            e = s if rng.random() < 0.2 else min(hi, s + int(rng.integers(0, max(1, (hi - s) // 2 + 1))))
            out.append((s, e))
            if e - s > 4 and depth < 6 and rng.random() < 0.6:
                fill(s, e, depth + 1)
            t = e + int(rng.integers(0, 3))

    fill(0, 10_000, 0)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_array_depth_equals_the_walk_on_generated_intervals(seed, way):
    rng = np.random.default_rng(seed)
    for trial in range(400):
        if trial % 2:
            intervals = _generated_nested(rng, int(rng.integers(1, 80)))
        else:  # arbitrary overlaps: ill-formed traces
            starts = rng.integers(0, 60, int(rng.integers(1, 60)))
            intervals = [(int(s), int(s + rng.integers(0, 25))) for s in starts]
        start = np.array([s for s, _ in intervals], dtype=np.int64)
        end = np.array([e for _, e in intervals], dtype=np.int64)
        pid = rng.integers(0, 2, len(start))
        tid = rng.integers(0, 3, len(start)) if trial % 4 < 2 else np.zeros(len(start), dtype=np.int64)
        transparent = (rng.random(len(start)) < 0.15) if trial % 3 == 0 else None
        got = nesting.nesting_depth(pid, tid, start, end, transparent)
        want = nesting.nesting_depth_walk(pid, tid, start, end, transparent)
        assert np.array_equal(got, want), (trial, intervals)


def _generated_async(rng, n: int) -> tuple[list[tuple[int, int]], list[bool]]:
    """Nested intervals plus async spans as a gloo rank has them: each starts inside an op
    and runs past it (often past its parents too), or ends at the same time."""
    intervals = _generated_nested(rng, n)
    spans = []
    for s, e in intervals:
        if rng.random() < 0.25:
            start = int(rng.integers(s, e + 1))
            spans.append((start, e + int(rng.choice([0, 1, 5, 50, 5000]))))
    flags = [False] * len(intervals) + [True] * len(spans)
    return intervals + spans, flags


@pytest.mark.parametrize("seed", range(6))
def test_array_depth_equals_the_walk_with_async_spans(seed, monkeypatch, way):
    """Transparent spans that outlast the ops they start in pop them in the walk; the array
    computation must pop the same ones, without walking (the walk is made to fail)."""
    rng = np.random.default_rng(100 + seed)
    cases = []
    for trial in range(300):
        intervals, flags = _generated_async(rng, int(rng.integers(1, 120)))
        if trial % 5 == 0:  # and ill-formed overlaps among the ops too
            starts = rng.integers(0, 60, int(rng.integers(1, 40)))
            intervals += [(int(s), int(s + rng.integers(0, 25))) for s in starts]
            flags += [bool(rng.random() < 0.3) for _ in starts]
        start = np.array([s for s, _ in intervals], dtype=np.int64)
        end = np.array([e for _, e in intervals], dtype=np.int64)
        tid = rng.integers(0, 2, len(start)) if trial % 2 else np.zeros(len(start), dtype=np.int64)
        cases.append((np.zeros(len(start), dtype=np.int64), tid, start, end, np.array(flags)))
    want = [nesting.nesting_depth_walk(*case) for case in cases]
    monkeypatch.setattr(nesting, "_walk", None)  # nesting_depth must not need it
    for case, expected in zip(cases, want):
        assert np.array_equal(nesting.nesting_depth(*case), expected), case


@pytest.mark.parametrize("seed", range(4))
def test_rows_apart_leave_every_other_depth_as_it_was(seed, way):
    """Rows apart (Python frames) among nested ops and async spans, ill-formed overlaps too:
    every other row's depth is the one it has without them."""
    rng = np.random.default_rng(200 + seed)
    for trial in range(200):
        intervals, flags = _generated_async(rng, int(rng.integers(1, 100)))
        if trial % 4 == 0:
            starts = rng.integers(0, 60, int(rng.integers(1, 30)))
            intervals += [(int(s), int(s + rng.integers(0, 25))) for s in starts]
            flags += [False] * len(starts)
        start = np.array([s for s, _ in intervals], dtype=np.int64)
        end = np.array([e for _, e in intervals], dtype=np.int64)
        tid = rng.integers(0, 2, len(start)) if trial % 2 else np.zeros(len(start), dtype=np.int64)
        pid = np.zeros(len(start), dtype=np.int64)
        transparent = np.array(flags)
        apart = ~transparent & (rng.random(len(start)) < 0.3)
        got = nesting.nesting_depth(pid, tid, start, end, transparent, apart)
        others = ~apart
        alone = nesting.nesting_depth_walk(pid[others], tid[others], start[others], end[others], transparent[others])
        assert np.array_equal(got[others], alone), (trial, intervals)
        assert np.array_equal(got, nesting.nesting_depth_walk(pid, tid, start, end, transparent, apart))


@pytest.mark.parametrize("seed", range(4))
def test_a_row_apart_is_as_deep_as_the_rows_around_it(seed, way):
    """Among well-nested rows, a row apart is as deep as the other rows that hold it (it
    starts inside them, after them or as long and earlier in the file, and ends by their end):
    as deep as the ops it holds."""
    rng = np.random.default_rng(300 + seed)
    for trial in range(150):
        intervals = _generated_nested(rng, int(rng.integers(1, 80)))
        start = np.array([s for s, _ in intervals], dtype=np.int64)
        end = np.array([e for _, e in intervals], dtype=np.int64)
        ids = np.zeros(len(start), dtype=np.int64)
        apart = rng.random(len(start)) < 0.3
        got = nesting.nesting_depth(ids, ids, start, end, None, apart)
        key = list(zip(start.tolist(), (start - end).tolist(), range(len(start))))
        for j in np.flatnonzero(apart).tolist():
            around = [
                c
                for c in np.flatnonzero(~apart).tolist()
                if key[c] < key[j] and start[c] <= start[j] < end[c] and end[j] <= end[c]
            ]
            assert got[j] == len(around), (trial, j, intervals)


def test_array_depth_on_edge_cases(way):
    """Empty intervals at a parent's end, equal ends, one row, ends before starts (bad
    rows the parsers drop, but the function must still agree with the walk)."""
    cases = [
        ([(0, 10), (10, 10), (10, 20)], [False, False, False]),
        ([(0, 10), (0, 10), (0, 10)], [False, True, False]),
        ([(0, 10), (2, 10), (5, 10), (5, 12)], [False, False, False, True]),
        ([(5, 5)], [True]),
        ([(0, 10), (3, 1), (4, 8)], [False, False, False]),
        ([(0, 100), (1, 50), (2, 60), (3, 40), (55, 58)], [False, False, True, False, False]),
    ]
    for intervals, flags in cases:
        start = np.array([s for s, _ in intervals], dtype=np.int64)
        end = np.array([e for _, e in intervals], dtype=np.int64)
        ids = np.zeros(len(start), dtype=np.int64)
        got = nesting.nesting_depth(ids, ids, start, end, np.array(flags))
        assert np.array_equal(got, nesting.nesting_depth_walk(ids, ids, start, end, np.array(flags))), intervals


def test_fast_row_order_equals_lexsort():
    """Generated rows with many ties (same start, same duration, same everything) on
    interleaved threads: the fast order must be lexsort's, row number breaking full ties."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 200))
        start = rng.integers(0, 1 + trial % 40, n) * int(rng.choice([1, 1000]))
        end = start + rng.integers(0, 4, n)
        pid = rng.integers(-2, 2, n) if trial % 3 else np.full(n, 7)
        tid = rng.integers(0, 3, n)
        if trial % 4 == 0:  # nearly in start order, as profilers write
            start = np.sort(start)
        got, got_bounds = nesting._thread_order_fast(pid, tid, start, end)
        want, want_bounds = nesting._thread_order(pid, tid, start, end)
        assert np.array_equal(got, want) and np.array_equal(got_bounds, want_bounds), trial


def _real_files():
    files = [SAMPLES / "1f1b" / "rank0.json.gz", SAMPLES / "zbv" / "rank1.json.gz"]
    gpu = SHARED_TRACES / "kineto-gpu"
    if gpu.is_dir():
        files += sorted(gpu.glob("*.json*"))[:3]
    return files


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name)
def test_array_depth_equals_the_walk_on_real_traces(path, way):
    _, columns = read_kineto(path, 0)
    n = columns.numbers
    names = np.array(columns.values["name"], dtype=object)[columns.codes["name"]]
    transparent = np.isin(names, list(ASYNC_SPANS))
    args = (n["pid"], n["tid"], n["start_ns"], n["end_ns"], transparent)
    assert np.array_equal(nesting.nesting_depth(*args), nesting.nesting_depth_walk(*args))
    assert np.array_equal(n["depth"], nesting.nesting_depth_walk(*args))


@pytest.mark.skipif(nesting._nesting is None, reason="the C walk is not built (no C compiler at install)")
def test_the_c_walk_is_what_runs_where_built(monkeypatch):
    """Built and allowed, nesting_depth walks in C: the array computation's helpers are not
    called (they are made to fail); TRACEKIT_NATIVE=0 goes back to them."""
    start = np.array([0, 1, 2, 30], dtype=np.int64)
    end = np.array([10, 5, 3, 40], dtype=np.int64)
    ids = np.zeros(4, dtype=np.int64)
    monkeypatch.setattr(nesting, "_first_larger", None)
    monkeypatch.setenv("TRACEKIT_NATIVE", "1")
    assert nesting.nesting_depth(ids, ids, start, end).tolist() == [0, 1, 2, 0]
    monkeypatch.setenv("TRACEKIT_NATIVE", "0")
    with pytest.raises(TypeError):
        nesting.nesting_depth(ids, ids, start, end)


@pytest.mark.skipif(nesting._nesting is None, reason="the C walk is not built (no C compiler at install)")
def test_the_c_walk_refuses_bad_arguments():
    """Wrong lengths, item sizes, indices or bounds raise ValueError; nothing is written
    outside the arrays (the process would crash)."""
    walk = nesting._nesting.walk
    s = np.array([0, 1, 2], dtype=np.int64)
    e = np.array([5, 2, 3], dtype=np.int64)
    order, bounds = np.array([0, 1, 2], dtype=np.int64), np.array([0, 3], dtype=np.int64)
    depth = np.zeros(3, dtype=np.int16)
    walk(s, e, None, order, bounds, depth)
    assert depth.tolist() == [0, 1, 1]
    bad = [
        (s[:2], e, None, order, bounds, depth),  # lengths differ
        (s, e, np.zeros(2, dtype=bool), order, bounds, depth),
        (s.astype(np.int32), e, None, order, bounds, depth),  # 4-byte items
        (s, e, None, order, bounds, np.zeros(3, dtype=np.int64)),
        (s, e, None, np.array([0, 1, 3]), bounds, depth),  # an index past the rows
        (s, e, None, np.array([0, -1, 2]), bounds, depth),
        (s, e, None, order, np.array([0, 2]), depth),  # bounds short of the rows
        (s, e, None, order, np.array([0, 4]), depth),  # past them
        (s, e, None, order, np.array([1, 3]), depth),  # not from 0
        (s, e, None, order, np.array([0, 2, 1, 3]), depth),  # going back
    ]
    for args in bad:
        with pytest.raises(ValueError):
            walk(*args)
    with pytest.raises(ValueError):  # depth must be writable (numpy refuses the buffer)
        frozen = np.zeros(3, dtype=np.int16)
        frozen.flags.writeable = False
        walk(s, e, None, order, bounds, frozen)
