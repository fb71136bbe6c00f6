"""One trace file's parse: the task every executor runs, in this process, in a pool worker
or on a Dask worker (:mod:`tracekit.ingest.executor`).

:func:`parse_file` picks the parser by the file's format. :func:`parse_one` looks the file
up in the parse cache first, keeps its working set or runs the reducer where it was parsed
(``IngestTask.rows``), and says which cache entry to write, so that a pool worker can leave
the writing to its parent; :func:`ingest_one` writes it at once. What the executors share
besides: :class:`WorkerDied`, :func:`file_size`, :func:`default_jobs`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tracekit.errors import TracekitError, TraceFormatError
from tracekit.ingest.columns import EventColumns, Parsed
from tracekit.ingest.options import Reducer
from tracekit.ingest.sniff import KINETO_SUFFIXES, NSYS_JSON, NSYS_SUFFIXES, trace_format

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

    from tracekit.ingest.cache_writes import PendingEntry
    from tracekit.model.events import TraceFile


def parse_file(
    path: Path,
    file_id: int,
    rank_pattern: str | None,
    rank_map: dict[int, int] | None,
    bytes_read: Callable[[int], None] | None = None,
) -> Parsed:
    """The parse of one file by the parser its format asks for (an nsys report may hold
    several ranks: one pair each)."""
    name = path.name
    if name.endswith(NSYS_SUFFIXES) or _is_sqlite(path):
        from tracekit.ingest import nsys

        return _as_columns(nsys.parse_nsys_sqlite(path, file_id, rank_map=rank_map))
    if name.endswith(KINETO_SUFFIXES):
        if _looks_like_nsys_json(path):
            from tracekit.ingest import nsys

            return _as_columns(nsys.parse_nsys_json(path, file_id, rank_map=rank_map))
        from tracekit.ingest.kineto import read_kineto

        return [read_kineto(path, file_id, rank_pattern, progress=bytes_read)]
    raise TraceFormatError(f"{path}: unknown trace format; expected .json(.gz) or .sqlite")


def _as_columns(parsed: list[tuple[TraceFile, pd.DataFrame]]) -> Parsed:
    return [(trace, EventColumns.from_frame(events)) for trace, events in parsed]


def _is_sqlite(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"


def _looks_like_nsys_json(path: Path) -> bool:
    """nsys JSON exports are line-delimited objects, not a Chrome trace document."""
    return trace_format(path, claimed=True) == NSYS_JSON


@dataclass(frozen=True)
class IngestTask:
    """One file to parse, with everything that decides its rows."""

    path: str
    file_id: int
    rank_pattern: str | None = None
    rank_map: dict[int, int] | None = field(default=None, hash=False)
    cache_dir: str | None = None
    rows: str = "all"  # "all", "analysis": the working set (ingest.working_set), or "reduce"
    reducer: Reducer | None = None  # rows="reduce": run on the working set (ingest.options)

    def options(self) -> dict[str, Any]:
        rank_map = sorted(self.rank_map.items()) if self.rank_map else None
        options: dict[str, Any] = {"rank_pattern": self.rank_pattern, "rank_map": rank_map}
        if self.rows != "all":
            options["rows"] = self.rows
        if self.rows == "reduce" and self.reducer is not None:
            options["reducer"] = self.reducer.key  # its options and code decide the entry too
        return options


def ingest_one(task: IngestTask, bytes_read: Callable[[int], None] | None = None) -> Parsed:
    """Parse one file, through the cache when the task names one."""
    parsed, pending = parse_one(task, bytes_read)
    if pending is not None:
        pending.store(parsed)
    return parsed


def parse_one(task: IngestTask, bytes_read: Callable[[int], None] | None = None) -> tuple[Parsed, PendingEntry | None]:
    """Parse one file, or read it from the cache; also say which entry to write, if any.

    Local pool workers run this and leave the writing to the parent, which has pyarrow
    loaded anyway: a worker then needs only numpy and msgspec (~30 MB, no import time)."""
    path = Path(task.path)
    found = None
    if task.cache_dir:
        from tracekit.ingest.cache import ParseCache

        found = ParseCache(task.cache_dir).lookup(path, task.options(), task.file_id)
        if found.parsed is not None:
            if bytes_read:
                bytes_read(file_size(task.path))
            return found.parsed, None
    parsed = parse_file(path, task.file_id, task.rank_pattern, task.rank_map, bytes_read=bytes_read)
    if task.rows in ("analysis", "reduce"):
        from tracekit.ingest.working_set import working_set

        parsed = [(trace, working_set(columns)) for trace, columns in parsed]
    if task.rows == "reduce" and task.reducer is not None:
        parsed = task.reducer.function(parsed)
    if found is not None and found.key is not None:
        from tracekit.ingest.cache_writes import PendingEntry

        assert task.cache_dir is not None  # found is the cache's answer
        return parsed, PendingEntry(task.cache_dir, found.key, task.path, found.stamp)
    return parsed, None


class WorkerDied(TracekitError):
    """A parser process ended without an answer (killed, out of memory)."""


def file_size(path: str) -> int:
    """The bytes of a task's file (what its progress counts), 0 where it cannot be read."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def default_jobs(n_tasks: int) -> int:
    """One worker per core, never more than there are files."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n_tasks))
