"""tracekit.model.groups: the pandas-free group helpers equal pandas' groupby on drawn rows
(generated arrays: unit-test fixtures, not traces)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tracekit.model.groups import counts_of, first_rows, reduce_by, split_by


def _drawn(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    key = rng.choice(np.array([-(2**40), -3, 0, 1, 7, 2**40], dtype=np.int64), n)
    low = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    high = rng.integers(0, 2**20, n, dtype=np.int64)
    return key, low, high


@pytest.mark.parametrize("seed", range(20))
def test_reduce_by_equals_pandas_groupby(seed):
    n = int(np.random.default_rng(seed + 100).integers(0, 60))
    key, low, high = _drawn(seed, n)
    keys, (least, most, total) = reduce_by(key, (low, np.minimum), (low, np.maximum), (high, np.add))
    want = (
        pd.DataFrame({"k": key, "lo": low, "hi": high})
        .groupby("k")
        .agg(least=("lo", "min"), most=("lo", "max"), total=("hi", "sum"))
    )
    assert keys.tolist() == want.index.tolist()
    for got, column in ((least, "least"), (most, "most"), (total, "total")):
        assert got.dtype == np.int64
        assert got.tolist() == want[column].tolist()


def test_split_first_and_count_by_key_equal_pandas():
    key, low, _ = _drawn(7, 200)
    parts = split_by(key, low)
    frame = pd.DataFrame({"k": key, "v": low})
    assert list(parts) == sorted(set(key.tolist()))
    for k, part in parts.items():
        assert part.tolist() == frame.loc[frame["k"] == k, "v"].tolist()
    queries = np.array([-3, 5, 2**40, 0], dtype=np.int64)
    firsts = first_rows(key, queries).tolist()
    counts = counts_of(key, queries).tolist()
    for q, first, count in zip(queries.tolist(), firsts, counts):
        rows = np.flatnonzero(key == q)
        assert first == (int(rows[0]) if len(rows) else -1)
        assert count == len(rows)
