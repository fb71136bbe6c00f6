"""The normalised event table that every parser produces.

One row per profiler interval (a complete event), all ranks in one table, times in
integer nanoseconds on an absolute clock (Unix epoch ns where the source says so, else
the source's own origin; ``TraceFile.clock`` says which). Parsers keep only what the
analysis needs, plus ``source_index`` so every figure can be traced back to the raw event.

Columns (see ``EVENT_SCHEMA`` for types):

- ``rank``          global rank of the process that recorded the event
- ``file_id``       index into ``Run.files`` (which file the row came from)
- ``source_index``  position of the event in its file (Kineto: index in ``traceEvents``;
                    nsys: the row id in its table), for tracing figures back
- ``cat``           normalised category: ``cpu_op``, ``user_annotation``,
                    ``gpu_user_annotation``, ``kernel``, ``gpu_memcpy``, ``gpu_memset``,
                    ``nvtx`` (nsys ranges), ``runtime`` (CUDA API calls: Kineto's
                    ``cuda_runtime``/``cuda_driver``, Nsight Systems' CUPTI runtime table),
                    ``python_function`` (with_stack's Python frames: only those of
                    frameworks' action entry points, ``model.names.is_action_frame``)
- ``name``          event name as recorded
- ``start_ns``, ``end_ns``  absolute times, ``end_ns >= start_ns``
- ``pid``, ``tid``  process and thread (for GPU rows: device and stream)
- ``on_gpu``        True for device-side rows (kernels, memcpy, GPU annotations)
- ``depth``         nesting depth on its thread (0 = top level), computed by the parser;
                    Python frames nest nothing: a frame is as deep as the ops it holds
- ``seq``           autograd sequence number (-1 when absent)
- ``peer``          P2P peer rank for send/recv ops (-1 when unknown / not P2P)
- ``tag``           P2P tag (-1 when unknown); on a collective's ``record_param_comms``, the
                    stride of its process group's ranks (torch's "Global rank stride", -1
                    when not given or not strided)
- ``nbytes``        message size in bytes for P2P ops (-1 when unknown)
- ``correlation``   CUDA correlation id: the same on a device row (kernel, copy, set) and
                    the ``runtime`` row of the API call that launched it (-1 when absent;
                    Kineto CPU ops carry their ``External id`` here instead)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from tracekit.schemas.analysis import FileDoc

# Plain Python and numpy only at import: parser worker processes import this module and
# must not pay for pandas and pyarrow (~75 MB and 0.4 s each); those load on first use.
_FIELDS = [
    ("rank", "int32"),
    ("file_id", "int32"),
    ("source_index", "int64"),
    ("cat", "string"),
    ("name", "string"),
    ("start_ns", "int64"),
    ("end_ns", "int64"),
    ("pid", "int64"),
    ("tid", "int64"),
    ("on_gpu", "bool"),
    ("depth", "int16"),
    ("seq", "int64"),
    ("peer", "int32"),
    ("tag", "int32"),
    ("nbytes", "int64"),
    ("correlation", "int64"),
]
EVENT_COLUMNS = [name for name, _ in _FIELDS]
STRING_COLUMNS = ("cat", "name")
# Any: the names are numpy dtype names, which pandas-stubs types as literals only
_NUMPY_DTYPES: dict[str, Any] = {name: kind for name, kind in _FIELDS if kind != "string"}
_SCHEMA: pa.Schema | None = None


def event_schema() -> pa.Schema:
    """The event table as an Arrow schema (what the parse cache stores)."""
    global _SCHEMA
    if _SCHEMA is None:
        import pyarrow as pa

        _SCHEMA = pa.schema(
            [(name, pa.string() if kind == "string" else pa.from_numpy_dtype(kind)) for name, kind in _FIELDS]
        )
    return _SCHEMA


def __getattr__(name: str) -> object:
    if name == "EVENT_SCHEMA":  # built on first use (imports pyarrow)
        return event_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def empty_events() -> pd.DataFrame:
    """An events table with the right columns and no rows."""
    import pandas as pd

    return conform(pd.DataFrame({c: [] for c in EVENT_COLUMNS}))


def canonical_strings(column: Iterable[Any]) -> pd.Series:
    """A string column as a categorical whose categories are the values present, sorted:
    few distinct names over many rows are small and fast to compare, and two tables with
    the same values have the same dtype however they were built."""
    import pandas as pd

    column = pd.Series(column, copy=False)
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype(str).astype("category")
    column = column.cat.remove_unused_categories()
    return column.cat.reorder_categories(sorted(column.cat.categories))


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with exactly the event columns, in order, with their dtypes."""
    missing = [c for c in EVENT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"events table lacks columns {missing}")
    out = df[EVENT_COLUMNS].copy()
    for col, dtype in _NUMPY_DTYPES.items():
        out[col] = out[col].astype(dtype)
    for col in ("cat", "name"):
        out[col] = canonical_strings(out[col])
    return out.reset_index(drop=True)


@dataclass
class TraceFile:
    """What one input file told us about itself, beside its events."""

    path: Path
    format: str  # "kineto" | "nsys-sqlite" | "nsys-json"
    rank: int  # the rank this file's process had (first, if several)
    ranks: list[int] = field(default_factory=list)  # all ranks in the file (nsys: several)
    world_size: int | None = None
    backend: str | None = None  # "gloo" | "nccl" | ...
    host: str | None = None
    clock: str = "unix"  # "unix": absolute epoch ns; "relative": file's own origin
    rank_source: str = ""  # how the rank was decided: "distributedInfo", "file name", ...
    n_events_raw: int = 0  # events in the file before filtering
    truncated: bool = False  # file ended early; what it held was read
    profiler: dict[str, Any] = field(default_factory=dict)  # versions and settings the file names
    # the process groups the file lists (Kineto distributedInfo.pg_config): name, description,
    # ranks (the job's rank of each group rank)
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # rows="reduce": this rank's steps, actions and label counts, found where the file was
    # parsed (tracekit.reconstruct.per_rank); JSON values and int64 arrays (a GPU rank's
    # device ops), which the parse cache keeps.
    reduced: dict[str, Any] | None = None

    def describe(self) -> FileDoc:
        return {
            "path": str(self.path),
            "format": self.format,
            "rank": self.rank,
            "ranks": self.ranks or [self.rank],
            "world_size": self.world_size,
            "backend": self.backend,
            "host": self.host,
            "clock": self.clock,
            "rank_source": self.rank_source,
            "n_events_raw": self.n_events_raw,
            "truncated": self.truncated,
            "warnings": list(self.warnings),
        }
