"""One file's event rows as typed arrays: what parsers hand over, workers send back and the
cache stores, before all files become the one events table.

Numbers are numpy arrays in the event table's dtypes; ``cat`` and ``name`` are dictionary
encoded (int32 codes into a list of distinct strings), which makes a file's rows ~60-100
bytes each and cheap to pickle. :func:`events_frame` joins the files column by column,
releasing each file's column as it goes, so the run's table is built with about one copy of
itself in memory instead of three (per-file frames, their concatenation, its conformed copy).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.model.events import (
    _NUMPY_DTYPES,
    EVENT_COLUMNS,
    STRING_COLUMNS,
    TraceFile,
    canonical_strings,
    conform,
    event_schema,
)

if TYPE_CHECKING:
    import pandas as pd

# numpy only at import (parser workers); pandas and pyarrow load where a method needs them.
NUMBER_COLUMNS = [c for c in EVENT_COLUMNS if c not in STRING_COLUMNS]
_DTYPES = {c: np.dtype(kind) for c, kind in _NUMPY_DTYPES.items()}


def row_indices(rows: np.ndarray) -> np.ndarray:
    """The rows ``rows`` selects as indices (a mask's set positions; indices as they are)."""
    return np.flatnonzero(rows) if rows.dtype == bool else rows


def take_rows(arrays: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Each array's rows that ``rows`` selects (a mask or indices), in order. A mask becomes
    indices once (:func:`row_indices`; for several dicts, once for them all): indexing a dozen
    columns by the mask itself scans it again for each, ~4x slower on a GPU rank's working set."""
    rows = row_indices(rows)
    return {c: v.take(rows) for c, v in arrays.items()}


@dataclass
class EventColumns:
    """The rows of one file (or one rank of it)."""

    numbers: dict[str, np.ndarray]  # every event column but cat and name
    codes: dict[str, np.ndarray]  # "cat" / "name" -> int32 codes into values
    values: dict[str, list[str]]  # "cat" / "name" -> the distinct strings

    def __len__(self) -> int:
        return len(self.numbers["start_ns"])

    def take(self, rows: np.ndarray) -> EventColumns:
        """The rows ``rows`` selects (a mask or indices), in order; the strings are shared."""
        rows = row_indices(rows)
        return EventColumns(take_rows(self.numbers, rows), take_rows(self.codes, rows), self.values)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> "EventColumns":
        import pandas as pd

        frame = conform(frame)
        numbers = {c: frame[c].to_numpy(dtype=_DTYPES[c], copy=True) for c in NUMBER_COLUMNS}
        codes, values = {}, {}
        for col in STRING_COLUMNS:
            uniques_codes, uniques = pd.factorize(frame[col].astype(object), use_na_sentinel=False)
            codes[col] = uniques_codes.astype(np.int32)
            values[col] = [str(v) for v in uniques]
        return cls(numbers, codes, values)

    @classmethod
    def from_arrow(cls, table: Any) -> "EventColumns":  # a pyarrow.Table (pyarrow ships no types)
        import pyarrow as pa

        numbers = {c: table.column(c).to_numpy().astype(_DTYPES[c], copy=False) for c in NUMBER_COLUMNS}
        codes, values = {}, {}
        for col in STRING_COLUMNS:
            encoded = table.column(col).combine_chunks()
            if not pa.types.is_dictionary(encoded.type):
                encoded = encoded.dictionary_encode()
            codes[col] = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
            values[col] = encoded.dictionary.to_pylist()
        return cls(numbers, codes, values)

    def to_arrow(self) -> Any:  # a pyarrow.Table
        import pyarrow as pa

        schema = event_schema()
        arrays = []
        for field in schema:
            if field.name in STRING_COLUMNS:
                arrays.append(_strings(self.codes[field.name], self.values[field.name]).cast(field.type))
            else:
                arrays.append(pa.array(self.numbers[field.name], type=field.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def copy(self) -> "EventColumns":
        return EventColumns(
            {c: v.copy() for c, v in self.numbers.items()},
            {c: v.copy() for c, v in self.codes.items()},
            {c: list(v) for c, v in self.values.items()},
        )

    def to_frame(self) -> pd.DataFrame:
        return events_frame([self])


# One file's parse: its facts and rows, one pair per rank it holds (an nsys report may hold several).
Parsed = list[tuple[TraceFile, EventColumns]]


def _strings(codes: np.ndarray, values: list[str]) -> Any:  # a pyarrow.DictionaryArray
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), pa.array(values, type=pa.large_string()))


def events_frame(parts: list[EventColumns]) -> pd.DataFrame:
    """All parts as one conformed events table. Empties ``parts`` as it goes (each part's
    arrays are released once copied), so call it with parts nobody else needs."""
    held = sum(v.nbytes for part in parts for v in part.numbers.values())
    data: dict[str, object] = {}
    for col in EVENT_COLUMNS:
        if col in STRING_COLUMNS:
            data[col] = _join_strings(parts, col)
        else:
            pieces = [part.numbers.pop(col) for part in parts]
            data[col] = (np.concatenate(pieces) if pieces else np.zeros(0)).astype(_DTYPES[col], copy=False)
            del pieces
    parts.clear()
    import pandas as pd

    frame = pd.DataFrame(data, copy=False)
    if held >= _TRIM_FROM_BYTES:
        release_freed_memory()
    return frame


# Parts smaller than this leave too little to hand back to be worth the trim (~1.3 ms, on the
# serial path after parsing): 8 reduced GPU ranks hold ~3 MB.
_TRIM_FROM_BYTES = 32 << 20


def release_freed_memory() -> None:
    """Hand memory freed by the parts back to the system (glibc keeps freed heap pages; the
    analysis that follows then grows on top of them). What Dask's workers do too."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to trim
        pass


def _join_strings(parts: list[EventColumns], col: str) -> Any:  # a pandas extension array
    index: dict[str, int] = {}
    pieces = []
    for part in parts:
        values = part.values.pop(col)
        remap = np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int32)
        codes = part.codes.pop(col)
        pieces.append(remap[codes] if len(codes) else codes.astype(np.int32))
    codes = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    import pandas as pd

    values = list(index)
    if not len(codes) or codes.min() < 0:
        # pandas-stubs take categories only as an Index; pandas takes any list-like
        return canonical_strings(pd.Categorical.from_codes(codes, categories=values)).array  # type: ignore[call-overload]
    # canonical_strings' categories (the values present, sorted) built at once: ~1.4 ms less a
    # column than its two steps through a Series
    present = sorted(np.flatnonzero(np.bincount(codes, minlength=len(values))).tolist(), key=values.__getitem__)
    recode = np.empty(len(values), dtype=np.int32)
    recode[present] = np.arange(len(present), dtype=np.int32)
    return pd.Categorical.from_codes(recode[codes], categories=[values[i] for i in present])  # type: ignore[call-overload]
