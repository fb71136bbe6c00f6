"""Nesting depth: the array computation equals the stack walk on every input, real or
generated (the generated intervals are a unit-test fixture, not a trace)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLES, SHARED_TRACES
from tracekit.ingest import nesting
from tracekit.ingest.kineto import read_kineto
from tracekit.ingest.kineto_rows import ASYNC_SPANS


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
def test_array_depth_equals_the_walk_on_generated_intervals(seed):
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
    # the array path must actually be taken on nested input, not always fall back
    rng = np.random.default_rng(seed)
    nested = _generated_nested(rng, 200)
    s = np.array([a for a, _ in nested], dtype=np.int64)
    e = np.array([b for _, b in nested], dtype=np.int64)
    order, _ = nesting._thread_order(np.zeros(len(s)), np.zeros(len(s)), s, e)
    assert nesting._laminar_depth(s[order], e[order], np.ones(len(s), dtype=bool)) is not None


def _real_files():
    files = [SAMPLES / "1f1b" / "rank0.json.gz", SAMPLES / "zbv" / "rank1.json.gz"]
    gpu = SHARED_TRACES / "kineto-gpu"
    if gpu.is_dir():
        files += sorted(gpu.glob("*.json*"))[:3]
    return files


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name)
def test_array_depth_equals_the_walk_on_real_traces(path):
    _, columns = read_kineto(path, 0)
    n = columns.numbers
    names = np.array(columns.values["name"], dtype=object)[columns.codes["name"]]
    transparent = np.isin(names, list(ASYNC_SPANS))
    args = (n["pid"], n["tid"], n["start_ns"], n["end_ns"], transparent)
    assert np.array_equal(nesting.nesting_depth(*args), nesting.nesting_depth_walk(*args))
    assert np.array_equal(n["depth"], nesting.nesting_depth_walk(*args))
