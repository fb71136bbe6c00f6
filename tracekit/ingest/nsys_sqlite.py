"""Reading an Nsight Systems SQLite export: read-only, schema discovered, never assumed.

Every nsys release moves tables and columns (``EXPORT_META_DATA`` became ``META_DATA_EXPORT``,
columns come and go, empty tables are omitted since 2022.4, tools such as pipit add their
own columns). So this module asks the file what it holds (``sqlite_master``, ``PRAGMA
table_info``) and builds each query from the columns that are there. It returns raw rows
as DataFrames with times still in the file's own clock; :mod:`tracekit.ingest.nsys_events` turns
them into the event table.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest.validate import NOT_A_TIME, is_wall_clock, offset_fits

SQLITE_MAGIC = b"SQLite format 3\x00"

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX_TABLE = "NVTX_EVENTS"
# Names the export metadata table has had: 2022.4+ (schema 3.x) and 2022.x (schema 2.x).
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")

# NVTX_EVENTS.eventType values (ENUM_NSYS_EVENT_TYPE)
NVTX_MARK = 34
NVTX_THREAD_NAME = 39
NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTXT_PUSH_POP = 70
NVTXT_START_END = 71
NVTX_DOMAIN_CREATE = 75
NVTX_RANGE_TYPES = (NVTX_PUSH_POP, NVTX_START_END, NVTXT_PUSH_POP, NVTXT_START_END)

_FIX = "re-export it with: nsys export --type sqlite --output report.sqlite report.nsys-rep"


def damaged(path: Path, err: Exception) -> TraceFormatError:
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return TraceFormatError(
        f"{path}: the SQLite file is damaged or truncated ({reason}); copy it again whole, or {_FIX}"
    )


def connect_read_only(path: Path) -> sqlite3.Connection:
    """Open ``path`` read-only; nothing is ever written beside it.

    ``immutable=1`` also stops SQLite from creating journal/-shm files, which matters on
    read-only storage (and for files that must stay byte-identical).
    """
    with open(path, "rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise TraceFormatError(
            f"{path}: not an SQLite file; if it is an nsys report (.nsys-rep, .qdstrm), export it "
            "first: nsys export --type sqlite --output report.sqlite report.nsys-rep"
        )
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as err:
        raise damaged(path, err) from None
    # Text that is not UTF-8 (a damaged string table) reads with U+FFFD, not as an error.
    conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    return conn


@dataclass
class Schema:
    """What one export holds: tables, their columns, and its metadata."""

    tables: dict[str, list[str]]
    meta_table: str | None = None
    meta: dict[str, str] = field(default_factory=dict)

    def has(self, table: str) -> bool:
        return table in self.tables

    def cols(self, table: str) -> list[str]:
        return self.tables.get(table, [])

    @property
    def nsys_version(self) -> str:
        return self.meta.get("EXPORT_PRODUCT_VERSION") or "unknown (no export metadata: ~2021 or older)"

    @property
    def schema_version(self) -> str | None:
        return self.meta.get("EXPORT_SCHEMA_VERSION")


def read_schema(conn: sqlite3.Connection) -> Schema:
    tables: dict[str, list[str]] = {}
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"):
        tables[name] = [row[1] for row in conn.execute(f"PRAGMA table_info({_q(name)})")]
    schema = Schema(tables=tables)
    for meta_table in META_TABLES:
        if meta_table in tables and {"name", "value"} <= set(tables[meta_table]):
            schema.meta_table = meta_table
            for name, value in conn.execute(f"SELECT name, value FROM {_q(meta_table)}"):
                schema.meta.setdefault(str(name), "" if value is None else str(value))
            break
    return schema


def _row(alias: str) -> str:
    """SQL for a row's number in its table: its rowid, or where the table is a view (no
    rowid) its position in the view."""
    return f"COALESCE({alias}.rowid, ROW_NUMBER() OVER ())"


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


@dataclass
class TimeBase:
    """How to turn the file's timestamps into Unix-epoch ns."""

    offset_ns: int  # add to every timestamp
    clock: str  # "unix" | "relative"
    normalized: bool  # the export was made with --ts-normalize (already absolute)
    session_start_ns: int | None
    note: str = ""
    # the file's timestamps count from the session start or are epoch ns, unshifted: none
    # can be below 0, so a negative one is damage (a row that cannot be real)
    never_negative: bool = True


# Session-relative timestamps are the capture's length; 1e17 ns (~3 years) never is.
_EPOCH_NS_FLOOR = 10**17


def time_base(conn: sqlite3.Connection, schema: Schema, earliest_ns: int | None) -> TimeBase:
    """Absolute = session start + ts, unless the export already normalised the times."""
    meta = schema.meta
    normalized = (meta.get("EXPORT_PARAM_TIME_NORMALIZE") or meta.get("EXPORT_TIME_NORMALIZE") or "").lower() == "true"
    user_shift = _int_or_zero(meta.get("EXPORT_PARAM_TIME_SHIFT"))
    start = None
    unreadable = ""
    table = "TARGET_INFO_SESSION_START_TIME"
    if "utcEpochNs" in schema.cols(table):
        row = conn.execute(f"SELECT utcEpochNs FROM {table} LIMIT 1").fetchone()
        if row and row[0] is not None:
            start = _int_or_none(row[0])
            if start is None or not offset_fits(start - user_shift):
                unreadable, start = f"its utcEpochNs {str(row[0])[:40]!r} is not a time", None
            elif not is_wall_clock(start):
                unreadable, start = f"its utcEpochNs {start} is no wall-clock time (not 2000-2100)", None
    if not offset_fits(user_shift):
        unreadable, user_shift = f"EXPORT_PARAM_TIME_SHIFT {user_shift} is not a time shift", 0
    never_negative = not user_shift
    if unreadable:
        return TimeBase(0, "relative", False, None, unreadable, never_negative)
    if normalized:
        return TimeBase(-user_shift, "unix", True, start, "export made with --ts-normalize", never_negative)
    if earliest_ns is not None and earliest_ns > _EPOCH_NS_FLOOR:
        return TimeBase(-user_shift, "unix", True, start, "timestamps are already epoch ns", never_negative)
    if start is not None:
        return TimeBase(start - user_shift, "unix", False, start, never_negative=never_negative)
    return TimeBase(0, "relative", False, None, "no TARGET_INFO_SESSION_START_TIME", never_negative)


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def _int_or_none(value: Any) -> int | None:
    """An integer stored as an integer, a real or text; None when it is none of these."""
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if abs(number) < 2.0**63 else None


def _string_expr(schema: Schema, table_alias: str, column: str, join_alias: str) -> tuple[str, str]:
    """SQL for a name column that is an id into StringIds (or, in some exports, text)."""
    raw = f"{table_alias}.{_q(column)}"
    inline = f"CASE WHEN typeof({raw}) = 'text' THEN {raw} END"
    if not schema.has("StringIds"):
        return inline, ""
    join = f" LEFT JOIN StringIds {join_alias} ON {join_alias}.id = {raw}"
    # CAST: a damaged string table may hold numbers; a name is text all the same
    return f"COALESCE(CAST({join_alias}.value AS TEXT), {inline})", join


def _select(conn: sqlite3.Connection, path: Path, sql: str) -> pd.DataFrame:
    try:
        return pd.read_sql_query(sql, conn)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as err:
        raise damaged(path, err) from None


def _col(schema: Schema, table: str, alias: str, column: str, as_name: str, default: str = "-1") -> str:
    """An integer column, never NULL: pandas would turn a column with NULLs into float64,
    which cannot hold epoch nanoseconds exactly."""
    if column in schema.cols(table):
        return f"{_integer(f'{alias}.{_q(column)}', default, default)} AS {as_name}"
    return f"{default} AS {as_name}"


def _integer(expr: str, if_null: str, if_not_a_number: str) -> str:
    """SQL for an integer column whatever the file stored: a real is truncated (SQLite
    saturates it at the int64 limits), text or a blob is ``if_not_a_number``. One text
    value would otherwise make pandas read the whole column as objects."""
    return (
        f"CASE typeof({expr}) WHEN 'integer' THEN {expr} WHEN 'real' THEN CAST({expr} AS INTEGER) "
        f"WHEN 'null' THEN {if_null} ELSE {if_not_a_number} END"
    )


def _times(schema: Schema, table: str, alias: str) -> str:
    """start and end (end -1 where the row has none: marks, unfinished ranges); a time that
    is not a number, or a missing time column, is NOT_A_TIME (the row is dropped, counted)."""
    cols = schema.cols(table)
    start = _integer(f"{alias}.start", "0", str(NOT_A_TIME)) if "start" in cols else str(NOT_A_TIME)
    end = _integer(f'{alias}."end"', str(NO_END), str(NOT_A_TIME)) if "end" in cols else str(NO_END)
    return f"{start} AS start, {end} AS end_"


NO_END = -1


def read_kernels(conn: sqlite3.Connection, path: Path, schema: Schema) -> pd.DataFrame:
    """row, start, end, device, stream, correlation, gpid, name (readable), short_name."""
    t = KERNEL_TABLE
    if not schema.has(t):
        return pd.DataFrame()
    cols = schema.cols(t)
    joins, names = "", {}
    for column, alias in (("demangledName", "sd"), ("shortName", "ss"), ("mangledName", "sm")):
        if column in cols:
            expr, join = _string_expr(schema, "k", column, alias)
            names[column] = expr
            joins += join
    readable = [names[c] for c in ("demangledName", "shortName", "mangledName") if c in names]
    short = [names[c] for c in ("shortName", "demangledName", "mangledName") if c in names]
    name_sql = f"COALESCE({', '.join(readable)}, 'kernel')" if readable else "'kernel'"
    short_sql = f"COALESCE({', '.join(short)}, 'kernel')" if short else "'kernel'"
    sql = (
        f"SELECT {_row('k')} AS row, {_times(schema, t, 'k')}, "
        f"{_col(schema, t, 'k', 'deviceId', 'device', '0')}, "
        f"{_col(schema, t, 'k', 'streamId', 'stream', '0')}, "
        f"{_col(schema, t, 'k', 'correlationId', 'correlation', '-1')}, "
        f"{_col(schema, t, 'k', 'globalPid', 'gpid', '0')}, "
        f"{name_sql} AS name, {short_sql} AS short_name FROM {t} k{joins}"
    )
    return _select(conn, path, sql)


def read_memory_ops(conn: sqlite3.Connection, path: Path, schema: Schema, table: str) -> pd.DataFrame:
    """row, start, end, device, stream, correlation, gpid, bytes, copy_kind (memcpy only)."""
    if not schema.has(table):
        return pd.DataFrame()
    copy_kind = _col(schema, table, "m", "copyKind", "copy_kind", "-1")
    sql = (
        f"SELECT {_row('m')} AS row, {_times(schema, table, 'm')}, "
        f"{_col(schema, table, 'm', 'deviceId', 'device', '0')}, "
        f"{_col(schema, table, 'm', 'streamId', 'stream', '0')}, "
        f"{_col(schema, table, 'm', 'correlationId', 'correlation', '-1')}, "
        f"{_col(schema, table, 'm', 'globalPid', 'gpid', '0')}, "
        f"{_col(schema, table, 'm', 'bytes', 'bytes', '-1')}, {copy_kind} FROM {table} m"
    )
    return _select(conn, path, sql)


def read_runtime(conn: sqlite3.Connection, path: Path, schema: Schema) -> pd.DataFrame:
    """row, start, end, gtid, correlation, name: CUDA runtime/driver API calls."""
    t = RUNTIME_TABLE
    if not schema.has(t) or "correlationId" not in schema.cols(t):
        return pd.DataFrame()
    name_sql, join = ("'cuda_api'", "")
    if "nameId" in schema.cols(t):
        expr, join = _string_expr(schema, "r", "nameId", "sn")
        name_sql = f"COALESCE({expr}, 'cuda_api')"
    sql = (
        f"SELECT {_row('r')} AS row, {_times(schema, t, 'r')}, "
        f"{_col(schema, t, 'r', 'globalTid', 'gtid', '0')}, "
        f"{_col(schema, t, 'r', 'correlationId', 'correlation', '-1')}, "
        f"{name_sql} AS name FROM {t} r{join}"
    )
    return _select(conn, path, sql)


def read_nvtx(conn: sqlite3.Connection, path: Path, schema: Schema) -> pd.DataFrame:
    """row, start, end, event_type, gtid, domain, text, json: ranges, marks, names, domains."""
    t = NVTX_TABLE
    if not schema.has(t):
        return pd.DataFrame()
    cols = schema.cols(t)
    parts = []
    if "text" in cols:
        parts.append("n.text")
    join = ""
    if "textId" in cols:
        expr, join = _string_expr(schema, "n", "textId", "st")
        parts.append(expr)
    text_sql = f"COALESCE({', '.join(parts)})" if parts else "NULL"
    json_sql = "NULL"
    if "jsonText" in cols:
        json_sql = "n.jsonText"
        if "jsonTextId" in cols and schema.has("StringIds"):
            json_sql = "COALESCE(n.jsonText, sj.value)"
            join += " LEFT JOIN StringIds sj ON sj.id = n.jsonTextId"
    kinds = (NVTX_MARK, NVTX_THREAD_NAME, NVTX_DOMAIN_CREATE) + NVTX_RANGE_TYPES
    sql = (
        f"SELECT {_row('n')} AS row, {_times(schema, t, 'n')}, {_col(schema, t, 'n', 'eventType', 'event_type')}, "
        f"{_col(schema, t, 'n', 'globalTid', 'gtid', '0')}, "
        f"{_col(schema, t, 'n', 'domainId', 'domain', '0')}, "
        f"{text_sql} AS text, {json_sql} AS json FROM {t} n{join} "
        f"WHERE n.eventType IN ({', '.join(map(str, kinds))})"
    )
    return _select(conn, path, sql)


def read_name_value(
    conn: sqlite3.Connection, path: Path, schema: Schema, table: str, names: tuple[str, ...] | None = None
) -> list[tuple[str, str]]:
    """(name, value) rows of a name/value table such as META_DATA_CAPTURE."""
    if not {"name", "value"} <= set(schema.cols(table)):
        return []
    sql = f"SELECT name, value FROM {_q(table)}"
    if names:
        sql += " WHERE name IN (" + ", ".join("?" * len(names)) + ")"
    try:
        rows = conn.execute(sql, names or ()).fetchall()
    except sqlite3.DatabaseError as err:
        raise damaged(path, err) from None
    return [(str(n), "" if v is None else str(v)) for n, v in rows]
