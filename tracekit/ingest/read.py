"""Reading a run: its trace files found, parsed and checked to be one run (:func:`read_run`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tracekit.ingest.capture_manifest import load_capture_manifest
from tracekit.ingest.discovery import Discovery, find_traces
from tracekit.ingest.executor import parse_files
from tracekit.ingest.one_run import check_layout, refuse_empty, run_completeness, settle_unknown_ranks
from tracekit.ingest.options import ReadOptions
from tracekit.ingest.sniff import NSYS_REPORT

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    from tracekit.model.run import Run


def read_run(
    path: str | os.PathLike[str],
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
    from tracekit.model.run import Run, add_warning

    capture_warnings: list[str] = []
    capture = load_capture_manifest(path, capture_warnings)
    warnings: list[str] = []
    for message in found.warnings + settle_unknown_ranks(files, events) + check_layout(files) + capture_warnings:
        add_warning(warnings, message)
    refuse_empty(path, files, events)
    completeness, notes = run_completeness(files, capture)
    if not completeness.complete:  # said first: every figure after it covers only the ranks present
        warnings.insert(0, completeness.message())
    for note in notes:
        add_warning(warnings, note)
    return Run(
        source=str(path),
        files=files,
        events=events,
        capture=capture,
        completeness=completeness,
        warnings=tuple(warnings),
    )


def _readable_paths(found: Discovery, cache_dir: str | None) -> list[Path]:
    """The files to parse: each one found, or for an Nsight Systems report its SQLite export."""
    if NSYS_REPORT not in found.formats.values():
        return list(found.files)
    from tracekit.ingest.nsys_report import sqlite_export

    return [sqlite_export(f, cache_dir) if found.formats[f] == NSYS_REPORT else f for f in found.files]
