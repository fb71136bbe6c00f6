"""PyTorch profiler (Kineto) Chrome-trace JSON: ``.json`` and ``.json.gz``, one file per rank.

Reads only what the analysis needs from each complete (``ph: "X"``) event and turns it into
rows of the normalised event table (:mod:`tracekit.model.events`). Files are streamed in
bounded chunks and decoded into typed structs (:mod:`tracekit.ingest.kineto_stream`), so a
file larger than memory still loads. A truncated file (a profiler killed mid-write) yields
the events it holds, with a warning.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tracekit.errors import TraceFormatError
from tracekit.ingest.columns import EventColumns
from tracekit.ingest.kineto_document import read_json_document
from tracekit.ingest.kineto_rows import _NUMBER, _RowBuilder
from tracekit.ingest.kineto_stream import ChromeTraceStream
from tracekit.ingest.validate import is_wall_clock, offset_fits, plural, valid_text
from tracekit.model.events import TraceFile

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

# A rank written in a file name: rank3, worker-3, rank_3.
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def parse_kineto(
    path: Path, file_id: int, rank_pattern: str | None = None, progress: Callable[[int], None] | None = None
) -> tuple[TraceFile, pd.DataFrame]:
    """Parse one Kineto trace file into its :class:`TraceFile` and event rows."""
    trace, columns = read_kineto(path, file_id, rank_pattern, progress)
    return trace, columns.to_frame()


def read_kineto(
    path: Path, file_id: int, rank_pattern: str | None = None, progress: Callable[[int], None] | None = None
) -> tuple[TraceFile, EventColumns]:
    """Parse one Kineto trace file into its :class:`TraceFile` and typed event columns.

    The file is streamed (see :mod:`tracekit.ingest.kineto_stream`): memory holds one chunk
    of it plus the rows kept so far. ``progress`` is called with each count of file bytes read.
    """
    if rank_pattern:
        _decide_rank(path, {}, rank_pattern)  # a pattern that cannot match fails before reading
    rows = _RowBuilder()
    stream = ChromeTraceStream(
        path, progress=progress, whole_document=read_json_document, scanner=rows.native_scanner()
    )
    for batch in stream:
        rows.add(batch)
    doc = stream.header
    trace = TraceFile(path=path, format="kineto", rank=-1, truncated=stream.truncated)
    if stream.truncated and not stream.n_elements:
        # Nothing salvageable: analysing the run without this rank's events would read it as
        # a rank that did nothing (or a smaller pipeline), a wrong answer rather than a warning.
        raise TraceFormatError(
            f"{path}: damaged before its first complete event (not a whole JSON trace, nothing "
            "to salvage); copy the file again or re-export it from the profiler"
        )
    if stream.truncated:
        trace.warnings.append(
            f"{path.name}: the file ends early or is damaged (profiler stopped mid-write?); "
            f"read the {stream.n_elements} complete events before that point; re-export the trace "
            "if you need the rest"
        )
    if stream.n_elements and not rows.n_rows and "schemaVersion" not in doc:
        # A rank that recorded nothing still writes Kineto's header; this file has neither.
        raise TraceFormatError(
            f"{path}: {stream.n_elements:,} events but none tracekit reads ({rows.why_none()}); "
            f"tracekit reads {_WHAT_WE_READ}"
        )
    if rows.n_begin_end:
        trace.warnings.append(
            f"{path.name}: skipped {plural(rows.n_begin_end, 'duration event')} written as begin/end "
            "pairs (ph B and E): tracekit reads complete events (ph X), as PyTorch's profiler writes "
            "them, so the work they mark is not counted; export the trace with complete events"
        )
    if stream.unknown_phases:
        shown = ", ".join(f"{what} x{n:,}" for what, n in stream.unknown_phases.most_common(4))
        trace.warnings.append(
            f"{path.name}: skipped {plural(sum(stream.unknown_phases.values()), 'event')} of no "
            f"Chrome-trace phase ({shown}); read the rest"
        )
    info = doc.get("distributedInfo") or {}
    if not isinstance(info, dict):
        trace.warnings.append(f"{path.name}: distributedInfo is not an object; ignored it")
        info = {}
    trace.rank, trace.rank_source = _decide_rank(path, info, rank_pattern, trace.warnings)
    trace.ranks = [trace.rank]
    trace.world_size = _header_count(path, info, "world_size", 1, trace.warnings)
    trace.backend = _header_text(info.get("backend"))
    trace.host = _header_text(doc.get("host_name"))
    trace.profiler = {k: doc[k] for k in ("schemaVersion", "trace_id", "record_shapes", "displayTimeUnit") if k in doc}
    if info.get("nccl_version"):
        trace.profiler["nccl_version"] = info["nccl_version"]
    base_ns, trace.clock = _time_base(path, doc, rows.first_x_ts, trace.warnings)
    if trace.clock == "relative":
        trace.warnings.append(
            f"{path.name}: no baseTimeNanoseconds and timestamps are not epoch times; they are "
            "aligned across ranks only if all ranks share this file's origin"
        )
    trace.n_events_raw = stream.n_elements
    group_ranks = _group_rank_maps(path, info, trace.warnings)
    trace.process_groups = _process_groups(info, group_ranks)
    columns = rows.columns(base_ns, group_ranks, trace.rank, file_id)
    if rows.dropped.total and not len(columns):
        raise TraceFormatError(
            f"{path}: none of its {rows.dropped.of_rows:,} events tracekit reads can be real "
            f"({rows.dropped.reasons()}); the file is damaged: re-export the trace"
        )
    dropped = rows.dropped.warning(path.name)
    if dropped:
        trace.warnings.append(dropped)
    if rows.odd_identities:
        trace.warnings.append(
            f"{path.name}: {plural(rows.odd_identities, 'event')} with a name that is not text "
            "or a pid/tid that is no integer (a number beyond int64, a float, an object); "
            "read them with their value's text as name or id"
        )
    return trace, columns


_WHAT_WE_READ = "PyTorch profiler (Kineto) traces and Nsight Systems SQLite exports"
# More ranks than any job has run: a larger rank or world size in a header is damage.
_MAX_RANKS = 1 << 24


def _header_count(path: Path, info: dict[str, Any], key: str, least: int, warnings: list[str]) -> int | None:
    """An integer of ``distributedInfo`` (``world_size``, ``rank``): a number written as
    text is read as one; a value of another type is ignored with a warning; a number no
    job can have is a damaged header (one line)."""
    value = info.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal():
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)  # orjson reads an integer beyond 64 bits as a float
    if type(value) is not int:
        warnings.append(f"{path.name}: distributedInfo.{key} is {_shown(value)}, not a number; ignored it")
        return None
    if not least <= value < _MAX_RANKS:
        raise TraceFormatError(
            f"{path}: distributedInfo.{key} is {value}, which no job can have; the file's header is "
            "damaged: re-export the trace"
        )
    return value


def _shown(value: object) -> str:
    text = valid_text(repr(value))
    return text if len(text) <= 40 else text[:40] + "..."


def _header_text(value: object) -> str | None:
    """A header string (host name, backend) as text every writer can encode; None if absent
    or not a string."""
    return valid_text(value) if isinstance(value, str) else None


_EPOCH_US_FLOOR = 9.0e14


def _time_base(path: Path, doc: dict[str, Any], first_x_ts: int | float | None, warnings: list[str]) -> tuple[int, str]:
    """The ns to add to ``ts * 1000``, and whether the result is Unix time."""
    base_ns = doc.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) and base_ns > 0:
        if math.isfinite(base_ns) and offset_fits(int(base_ns)) and is_wall_clock(int(base_ns)):
            return int(base_ns), "unix"
        warnings.append(
            f"{path.name}: baseTimeNanoseconds {_shown(base_ns)} is no wall-clock time (not 2000-2100); ignored it"
        )
    if isinstance(first_x_ts, _NUMBER) and math.isfinite(first_x_ts):
        return 0, ("unix" if first_x_ts > _EPOCH_US_FLOOR else "relative")
    return 0, "relative"


def _decide_rank(
    path: Path, info: dict[str, Any], rank_pattern: str | None, warnings: list[str] | None = None
) -> tuple[int, str]:
    if rank_pattern:
        match = re.search(rank_pattern, path.name)
        if not match or not match.groups():
            raise TraceFormatError(
                f"{path}: --rank-from pattern {rank_pattern!r} does not match this file name "
                "with a group; give a regex like 'rank(\\d+)'"
            )
        if not (match.group(1) or "").isdecimal():
            raise TraceFormatError(
                f"{path}: --rank-from pattern {rank_pattern!r} matches {match.group(1)!r} "
                "here, not a rank number; make its group match digits only"
            )
        return int(match.group(1)), "--rank-from"
    stated = _header_count(path, info, "rank", 0, [] if warnings is None else warnings)
    if stated is not None:
        return stated, "distributedInfo"
    from_name = rank_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    return -1, "unknown"


def _process_groups(info: dict[str, Any], group_ranks: dict[str, list[int]]) -> list[dict[str, Any]]:
    """The groups of pg_config that :func:`_group_rank_maps` read, with their descriptions."""
    described = {}
    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict):
            described[valid_text(str(pg.get("pg_name")))] = valid_text(str(pg.get("pg_desc") or ""))[:200]
    return [
        {"name": name, "description": described.get(name, ""), "ranks": ranks} for name, ranks in group_ranks.items()
    ]


def _group_rank_maps(path: Path, info: dict[str, Any], warnings: list[str]) -> dict[str, list[int]]:
    """Process group name -> its global ranks, from ``distributedInfo.pg_config``; entries
    that are not a group with a list of ranks are ignored (with one warning)."""
    groups = info.get("pg_config") or []
    if not isinstance(groups, list):
        warnings.append(f"{path.name}: distributedInfo.pg_config is not a list; ignored it")
        return {}
    maps = {}
    ignored = 0
    for pg in groups:
        ranks = pg.get("ranks") if isinstance(pg, dict) else None
        if isinstance(ranks, list) and all(type(r) is int and 0 <= r < _MAX_RANKS for r in ranks):
            maps[valid_text(str(pg.get("pg_name")))] = ranks
        elif not (isinstance(pg, dict) and ranks is None):
            ignored += 1
    if ignored:
        warnings.append(
            f"{path.name}: ignored {ignored} entries of distributedInfo.pg_config that are "
            "not a process group with a list of ranks"
        )
    return maps
