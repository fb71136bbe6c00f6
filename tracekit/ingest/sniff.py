"""Which kind of trace a file is, from its name and its first bytes (never the whole file).

A run folder holds more than traces: a ``config.json``, a tracekit ``--json`` document, a
baseline. Those are told apart from traces by a look at the start of each file (the start
of a ``.gz`` is decompressed), so a stray file is skipped, while a file that claims to be a
trace, by its name or by its content, is parsed and fails loudly when it is broken.
"""

from __future__ import annotations

import contextlib
import re
import zlib
from pathlib import Path

from tracekit.errors import TraceFormatError

KINETO = "kineto"
NSYS_SQLITE = "nsys-sqlite"
NSYS_JSON = "nsys-json"
NSYS_REPORT = "nsys-rep"

KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys.sqlite")
# Nsight Systems' own report (".qdrep" before 2021.3): read through its SQLite export.
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")

SQLITE_MAGIC = b"SQLite format 3\x00"
# Tables of an nsys SQLite export, as tracekit.ingest.nsys tells an export from other databases.
_NSYS_TABLES = {"NVTX_EVENTS", "StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA"}
_NSYS_TABLE_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "TARGET_INFO_")
_GZIP_MAGIC = b"\x1f\x8b"
# Enough for a Kineto header (deviceProperties of 8 GPUs come before traceEvents) and for
# the start of an nsys JSON export's second line.
_SNIFF_BYTES = 64 << 10

# Names that say "trace": rank3.json.gz, rank-3, worker_3, *.pt.trace.json.gz, *trace*.json.
_TRACE_NAME = re.compile(r"(?:rank|worker)[-_.]?\d|trace", re.IGNORECASE)
# Top-level keys a Kineto (Chrome trace) document starts with, as keys: a tracekit document
# holds "distributedInfo" as a value (rank_source).
_KINETO_KEY = re.compile(
    rb'(?<!\\)"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo|'
    rb'displayTimeUnit|baseTimeNanoseconds)"\s*:'
)


def trace_format(path: Path, rank_pattern: re.Pattern[str] | None = None, claimed: bool = False) -> str | None:
    """The format of ``path`` (:data:`KINETO`, :data:`NSYS_SQLITE`, :data:`NSYS_JSON`,
    :data:`NSYS_REPORT`), or None when it is not a trace.

    A file claims to be a trace by its name (a trace suffix for SQLite and reports; for
    JSON a name like ``rank3``, ``*trace*`` or one ``rank_pattern`` finds) or by its
    content; ``claimed`` says the user named this very file. A claimed file is never None:
    if it is broken, its parser says how."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(REPORT_SUFFIXES):
        return NSYS_REPORT
    head = _head(path)
    named = bool(_TRACE_NAME.search(path.name) or (rank_pattern is not None and rank_pattern.search(path.name)))
    if head.startswith(SQLITE_MAGIC):
        # some other tool's database (optuna.sqlite) beside the traces is a stray file
        return NSYS_SQLITE if claimed or named or _holds_nsys_tables(path) else None
    if name.endswith(NSYS_SUFFIXES):
        return NSYS_SQLITE  # not SQLite at all: broken, and the parser says so
    if not (claimed or name.endswith(KINETO_SUFFIXES)):
        return None
    text = _decompressed_start(head)
    if text is None:  # gzip that does not even start to decompress: a broken file, not a stray one
        return KINETO
    if _is_nsys_json(text):
        return NSYS_JSON
    if claimed or named or _is_kineto(text):
        return KINETO
    return None


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(_SNIFF_BYTES)
    except OSError as err:
        raise TraceFormatError(f"{path}: cannot be read ({err.strerror}); check its permissions") from None


def _holds_nsys_tables(path: Path) -> bool:
    """An SQLite file with a table only nsys exports write, or one that cannot be read
    (damaged: its parser says how)."""
    import sqlite3

    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"  # nothing written beside it
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.Error:
        return True
    return any(n in _NSYS_TABLES or n.startswith(_NSYS_TABLE_PREFIXES) for n in names)


def _decompressed_start(head: bytes) -> bytes | None:
    if not head.startswith(_GZIP_MAGIC):
        return head
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _SNIFF_BYTES)
    except zlib.error:
        return None


def _is_kineto(text: bytes) -> bool:
    start = text.lstrip()
    if start.startswith(b"{"):
        return _KINETO_KEY.search(start) is not None
    # the bare event-array form of the Chrome trace format
    return start.startswith(b"[") and b'"ph"' in start


def _is_nsys_json(text: bytes) -> bool:
    """``nsys export --type json``: one object a line, a string table first, then records
    with a "Type"; the string table can be longer than the bytes looked at."""
    start = text.lstrip()
    if start.startswith(b'{"Type":'):
        return True
    one_long_line = b"\n" not in start and len(text) >= _SNIFF_BYTES
    return start.startswith(b'{"data": [') and (b'\n{"Type":' in start or one_long_line)
