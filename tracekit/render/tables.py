"""The tables of :func:`tracekit.analyze.tabular.tables` as file contents: Parquet and CSV bytes.

Parquet keeps the types (``int64``, ``double``, ``string``; no pandas index, no pandas-only
types) so pandas, polars and DuckDB read the same columns, and carries the documentation:
each field's ``doc`` in its metadata, the table's in the schema metadata (``tracekit.doc``),
beside the tracekit version, the timeline and the run. CSV has a header row and nothing else.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.analyze.tabular import TABLES
from tracekit.render.protocol import NamedTable
from tracekit.version import __version__

# "Int64": integers that may be null (pandas' nullable Int64: a time since the step's start,
# outside every measured step)
_ARROW_TYPES = {"int64": pa.int64(), "Int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}


def arrow_schema(name: str, run_meta: dict[str, str]) -> pa.Schema:
    """Table ``name``'s schema with its documentation; ``run_meta`` adds facts about the run."""
    spec = TABLES[name]
    fields = [
        pa.field(column, _ARROW_TYPES[dtype], nullable=dtype == "Int64", metadata={"doc": doc})
        for column, (dtype, doc) in spec.columns.items()
    ]
    meta = {
        "tracekit.table": name,
        "tracekit.doc": spec.doc,
        "tracekit.version": __version__,
        "tracekit.units": "times and durations in integer ns; ratios 0..1",
        **{f"tracekit.{key}": value for key, value in run_meta.items()},
    }
    return pa.schema(fields, metadata=meta)


def parquet_bytes(name: str, frame: pd.DataFrame, run_meta: dict[str, str]) -> bytes:
    """``frame`` (table ``name``) as a Parquet file."""
    table = pa.Table.from_pandas(frame, schema=arrow_schema(name, run_meta), preserve_index=False)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """``frame`` as CSV (UTF-8, a header row, no index)."""
    return frame.to_csv(index=False, lineterminator="\n").encode()


class ParquetRenderer:
    """One table (:class:`~tracekit.render.protocol.NamedTable`) as a Parquet file."""

    name = "parquet"
    reads = "table"

    def render(self, table: NamedTable) -> bytes:
        return parquet_bytes(table.name, table.frame, table.run_meta)


class CsvRenderer:
    """One table (:class:`~tracekit.render.protocol.NamedTable`) as a CSV file."""

    name = "csv"
    reads = "table"

    def render(self, table: NamedTable) -> bytes:
        return csv_bytes(table.frame)
