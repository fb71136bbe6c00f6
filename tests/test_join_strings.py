"""ingest.columns._join_strings builds the joined string column's categorical (the values
present, sorted) at once; canonical_strings, the two steps it replaced, is the reference."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from tracekit.ingest.columns import EventColumns, _join_strings
from tracekit.model.events import canonical_strings

_WORDS = ["aten::mm", "nccl:send", "B", "a", "ProfilerStep#3", "", "é", "zz", "kernel_x", "Z"]


def _part(rnd: random.Random) -> EventColumns:
    values = rnd.sample(_WORDS, rnd.randint(1, len(_WORDS)))
    codes = np.array([rnd.randrange(len(values)) for _ in range(rnd.randint(0, 30))], dtype=np.int32)
    return EventColumns({}, {"name": codes}, {"name": values})


def _reference(parts: list[EventColumns]) -> pd.Categorical:
    """REFERENCE: the values of every part, in row order, through canonical_strings."""
    texts = [part.values["name"][code] for part in parts for code in part.codes["name"].tolist()]
    return canonical_strings(pd.Series(texts, dtype=object).astype("category")).array


def test_the_joined_column_equals_canonical_strings():
    rnd = random.Random(5)
    for _ in range(200):
        parts = [_part(rnd) for _ in range(rnd.randint(1, 4))]
        want = _reference(parts)
        got = _join_strings(parts, "name")
        assert list(got.categories) == list(want.categories), (got.categories, want.categories)
        assert got.categories.dtype == want.categories.dtype or not len(got)
        assert np.array_equal(got.codes, want.codes)
        assert got.dtype.ordered is False
