"""Ingest: find the trace files of a run, parse each, and build one :class:`Run` of their events.

Each parser turns one file into ``(TraceFile, events)`` pairs (an nsys report may hold
several ranks); this module checks that the files make one run (no duplicate or missing
ranks, one job). :func:`tracekit.load` then hands the run to the reconstructor.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

    from tracekit.model.run import Completeness, Run

from tracekit.errors import RunLayoutError
from tracekit.ingest.executor import parse_files

# IGNORED_NAMES and the suffixes are also tracekit.commands.outputs': what may be written into a run folder.
from tracekit.ingest.discovery import IGNORED_NAMES, Discovery, find_traces
from tracekit.ingest.options import ReadOptions
from tracekit.ingest.sniff import KINETO_SUFFIXES, NSYS_JSON, NSYS_REPORT, NSYS_SUFFIXES, trace_format
from tracekit.model.events import TraceFile


def discover(path: Path, iteration: int | None = None, rank_pattern: str | None = None) -> list[Path]:
    """The trace files of a run folder (or the one file given), in a stable order; see
    :func:`tracekit.ingest.discovery.find_traces` for how they are found."""
    return find_traces(path, iteration, rank_pattern).files


def settle_unknown_ranks(files: list[TraceFile], events: pd.DataFrame) -> list[str]:
    """A lone file that names no rank is rank 0; several such files are an error."""
    unknown = [t for t in files if t.rank < 0]
    if not unknown:
        return []
    if len(files) > 1:
        names = ", ".join(t.path.name for t in unknown[:3])
        raise RunLayoutError(
            f"cannot tell which rank wrote {names} (no distributedInfo, no rank in the file "
            "name); rename them like rank3.json.gz or pass --rank-from REGEX"
        )
    trace = unknown[0]
    trace.rank, trace.ranks, trace.rank_source = 0, [0], "assumed (single file)"
    events["rank"] = 0
    return [f"{trace.path.name}: names no rank (no distributedInfo, no rank in its name); read as rank 0"]


def check_layout(files: list[TraceFile]) -> list[str]:
    """Raise on files that cannot be one run; return warnings for what is merely odd."""
    warnings: list[str] = []
    seen: dict[int, Path] = {}
    for trace in files:
        for rank in trace.ranks or [trace.rank]:
            if rank in seen:
                raise RunLayoutError(
                    f"rank {rank} appears in both {seen[rank].name} and {trace.path.name}; a run "
                    "folder must hold one trace per rank (move one of them out)"
                )
            seen[rank] = trace.path
    stated = _stated_world_sizes(files)
    if len(stated) > 1:
        says = "; ".join(
            f"{_name_list(names)} {'say' if len(names) > 1 else 'says'} {size}"
            for size, names in sorted(stated.items())
        )
        raise RunLayoutError(
            f"files disagree on world size ({says}): they come from different jobs; keep one job's traces per folder"
        )
    if stated:
        world = next(iter(stated))
        beyond = sorted(rank for rank in seen if rank >= world)
        if beyond:
            raise RunLayoutError(
                f"{seen[beyond[0]].name} holds rank {beyond[0]}, yet the files say the world size is "
                f"{world} (ranks 0-{world - 1}): it comes from another job, or --rank-from / "
                "--rank-map read the wrong number; keep one job's traces per folder"
            )
    for trace in files:
        warnings.extend(trace.warnings)
    return warnings


# Where a file's world size comes from, by its format.
_WORLD_SIZE_SOURCES = {
    "kineto": "distributedInfo",
    "nsys-sqlite": "the nsys report's rank marks",
    "nsys-json": "the nsys report's rank marks",
}


def _stated_world_sizes(files: list[TraceFile]) -> dict[int, list[str]]:
    """Each world size the files state, with the names of the files that state it."""
    stated: dict[int, list[str]] = {}
    for trace in files:
        if trace.world_size:
            names = stated.setdefault(int(trace.world_size), [])
            if trace.path.name not in names:  # an nsys report holds several ranks
                names.append(trace.path.name)
    return stated


def _name_list(names: list[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def run_completeness(files: list[TraceFile], capture: dict | None) -> tuple[Completeness, list[str]]:
    """Which ranks of the job left a trace here, and warnings about conflicting sources.

    The world size is the one the files state (after :func:`check_layout`, at most one),
    else ``capture.json``'s rank count, else, when the ranks present have a gap, at least
    the highest rank + 1. A run whose ranks are 0..n-1 and that states nothing is complete.
    """
    from tracekit.model.run import INFERRED_WORLD_SIZE, Completeness

    present = sorted({int(r) for t in files for r in (t.ranks or [t.rank])})
    warnings: list[str] = []
    stated = _stated_world_sizes(files)
    world, source = None, ""
    captured = _captured_ranks(capture)
    if stated:
        world = next(iter(stated))
        source = " and ".join(sorted({_WORLD_SIZE_SOURCES.get(t.format, t.format) for t in files if t.world_size}))
        if captured is not None and captured != world:
            warnings.append(
                f"capture.json says {captured} ranks, the traces say world size {world}: "
                "capture.json is from another run; the traces' world size is used"
            )
    elif captured is not None and (not present or present[-1] < captured):
        world, source = captured, "capture.json"
    elif present and present != list(range(len(present))):
        world, source = present[-1] + 1, INFERRED_WORLD_SIZE
    missing = sorted(set(range(world)) - set(present)) if world else []
    cut_short = {
        int(rank): f"{trace.path.name} ends early: {trace.n_events_raw:,} complete events read"
        for trace in files
        if trace.truncated
        for rank in (trace.ranks or [trace.rank])
    }
    return Completeness(world, source, present, missing, cut_short), warnings


def _captured_ranks(capture: dict | None) -> int | None:
    """The rank count capture.json states: ``world_size`` (tracekit.trace_handler; it counts
    data-parallel replicas too), else ``p`` (tracekit capture runs one pipeline), if it is one."""
    ranks = capture.get("world_size", capture.get("p")) if isinstance(capture, dict) else None
    return ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 0 else None


def refuse_empty(path: Path, files: list[TraceFile], events: pd.DataFrame) -> None:
    """No events at all in any file: nothing any command can say about the run."""
    if len(events):
        return
    names = _name_list(sorted({t.path.name for t in files}))
    raise RunLayoutError(
        f"{path}: no events were read from {names}: the traces hold no profiled intervals "
        "(was the profiler's active window empty?); profile at least one step"
    )


def load_capture_manifest(folder: Path, warnings: list[str] | None = None) -> dict | None:
    """``capture.json`` beside the traces (what ran: optional metadata), or None. One that
    cannot be read (not UTF-8, not JSON, not an object) is ignored with a warning."""
    manifest = folder / "capture.json"
    if not (folder.is_dir() and manifest.is_file()):
        return None
    try:
        document = json.loads(manifest.read_bytes().decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except UnicodeDecodeError:
        problem = "is not UTF-8 text"
    except (ValueError, RecursionError):  # JSONDecodeError, or NaN / Infinity (not JSON)
        problem = "is not JSON (NaN, Infinity or 1e999 in it, or it nests deeper than any manifest)"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    else:
        if isinstance(document, dict):
            return _encodable(document)
        problem = f"holds a JSON {type(document).__name__}, not an object"
    if warnings is not None:
        warnings.append(f"{manifest.name} {problem}; ignored it (it only describes the capture)")
    return None


def _not_json(token: str):
    """Python's json reads NaN and Infinity; JSON has no such numbers, and the documents
    that carry the manifest on must stay JSON."""
    raise ValueError(f"{token} is not JSON")


def _finite(token: str) -> float:
    """A JSON number, refused when it does not fit a float (1e999 would read as Infinity)."""
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is beyond any float")
    return value


def _encodable(document: dict) -> dict:
    """The manifest with every string encodable as UTF-8 (JSON's escapes allow lone
    surrogates; the writers that show the manifest do not)."""
    text = json.dumps(document, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        from tracekit.ingest.validate import valid_text

        return json.loads(valid_text(text))
    return document


def read_run(
    path,
    options: ReadOptions | None = None,
    *,
    progress: Callable[[Path], None] | None = None,
    bytes_read: Callable[[int], None] | None = None,
) -> Run:
    """Read a run folder (or one file) into a :class:`Run` of its events, checked to be one
    run; not yet reconstructed (:func:`tracekit.load` does both).

    ``options``: which files and how (:class:`~tracekit.ingest.options.ReadOptions`; a
    :class:`tracekit.loading.LoadOptions` is one). ``progress`` is called with each file's
    path when it is done, ``bytes_read`` with counts of input bytes consumed.
    """
    options = options or ReadOptions()
    path = Path(path)
    found = find_traces(path, options.iteration, options.rank_from)
    paths = _readable_paths(found, options.cache_dir)
    files, events = parse_files(
        paths,
        options.rank_from,
        options.rank_map,
        progress,
        executor=options.executor,
        jobs=options.jobs,
        scheduler=options.scheduler,
        cache_dir=options.cache_dir,
        bytes_read=bytes_read,
        rows=options.rows,
        defer_cache_writes=options.defer_cache_writes,
        reducer=options.reducer,
        warm_up=options.warm_up,
    )
    # Files read through an export are named by the user's file, not the export in the cache.
    exported = {read: given for read, given in zip(paths, found.files) if read != given}
    for trace in files:
        trace.path = exported.get(trace.path, trace.path)
    # Imported after parsing: parser workers fork while this process has no pandas (the
    # executor loads it while they parse), so each stays ~30-50 MB.
    from tracekit.model.run import Run

    capture_warnings: list[str] = []
    run = Run(source=str(path), files=files, events=events, capture=load_capture_manifest(path, capture_warnings))
    for message in found.warnings + settle_unknown_ranks(files, events) + check_layout(files) + capture_warnings:
        run.warn(message)
    refuse_empty(path, files, events)
    run.completeness, notes = run_completeness(files, run.capture)
    if not run.completeness.complete:  # said first: every figure after it covers only the ranks present
        run.warnings.insert(0, run.completeness.message())
    for note in notes:
        run.warn(note)
    return run


def read_files(path, options: ReadOptions, file_ids: list[int]) -> pd.DataFrame:
    """The events of some of a run's files, read again as ``options`` says (e.g. another
    ``rows``): ``file_ids`` as :func:`read_run` numbered the files of the folder ``path``
    (the file ids of its rows), and kept so in the table returned."""
    found = find_traces(Path(path), options.iteration, options.rank_from)
    paths = _readable_paths(found, options.cache_dir)
    file_ids = sorted(set(file_ids))
    _, events = parse_files(
        [paths[i] for i in file_ids],
        options.rank_from,
        options.rank_map,
        executor=options.executor,
        jobs=options.jobs,
        scheduler=options.scheduler,
        cache_dir=options.cache_dir,
        rows=options.rows,
        reducer=options.reducer,
    )
    import numpy as np  # (the package imports no numpy at its top: a cached analysis reads none of this)

    events["file_id"] = np.asarray(file_ids, dtype=np.int64)[events["file_id"].to_numpy()].astype(
        events["file_id"].dtype
    )
    return events


def _readable_paths(found: Discovery, cache_dir: str | None) -> list[Path]:
    """The files to parse: each one found, or for an Nsight Systems report its SQLite export."""
    if NSYS_REPORT not in found.formats.values():
        return list(found.files)
    from tracekit.ingest.nsys_report import sqlite_export

    return [sqlite_export(f, cache_dir) if found.formats[f] == NSYS_REPORT else f for f in found.files]
