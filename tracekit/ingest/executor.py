"""Where per-file parsing runs: in this process, in a local process pool, or on a Dask cluster.

Each trace file is parsed independently (one rank, or one nsys report), so the files of a
run are tasks with no shared state: :func:`~tracekit.ingest.file_task.ingest_one` takes a
path and the parse options, looks the file up in the cache, parses it on a miss and writes
the entry. The same function runs in every executor; only the results travel back: each
file's typed rows (a few MB a rank), or with ``rows="reduce"`` what its
:class:`~tracekit.ingest.options.Reducer` makes of them (each rank's steps and actions and
the few rows messages need, see :mod:`tracekit.reconstruct.per_rank`). Cross-rank work
(message matching, clock alignment, schedule, analysis) happens after, on the gathered tables.

- ``local``: files whose digest the cache remembers are read from the cache here; the rest
  are parsed in this process (one job, or one file: a byte-level progress bar works) or by
  ``jobs - 1`` pool workers and this process together (:mod:`tracekit.ingest.pool`).
- ``dask``: on a Dask cluster (:mod:`tracekit.ingest.dask_cluster`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tracekit.errors import TracekitError
from tracekit.ingest.cache_writes import write_deferred_entries
from tracekit.ingest.columns import EventColumns, Parsed, events_frame
from tracekit.ingest.file_task import IngestTask, default_jobs, file_size, ingest_one
from tracekit.ingest.options import WARM_UP, Reducer

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

    from tracekit.model.events import TraceFile

EXECUTORS = ("local", "dask")


def parse_files(
    paths: list[Path],
    rank_pattern: str | None = None,
    rank_map: dict[int, int] | None = None,
    progress: Callable[[Path], None] | None = None,
    *,
    executor: str = "local",
    jobs: int | None = None,
    scheduler: Any = None,  # an address or a distributed.Client
    cache_dir: str | None = None,
    bytes_read: Callable[[int], None] | None = None,
    rows: str = "all",
    defer_cache_writes: bool = False,
    reducer: Reducer | None = None,
    warm_up: tuple[str, ...] = WARM_UP,
) -> tuple[list[TraceFile], pd.DataFrame]:
    """Parse every file; return the per-file facts and one events table for all ranks.

    Files are parsed independently: ``executor`` ``"local"`` runs them in this process
    (``jobs=1``) or a pool of ``jobs`` processes (default: one per core, at most one per
    file); ``"dask"`` on the Dask cluster at ``scheduler``. With ``cache_dir`` each file's
    rows are read from / written to the parse cache (:mod:`tracekit.ingest.cache`).
    ``progress`` is called with each file's path when it is done, ``bytes_read`` with counts
    of input bytes consumed. ``rows="analysis"`` keeps only the rows the analysis reads (see
    :mod:`tracekit.ingest.working_set`), dropped in the process that parsed the file;
    ``rows="reduce"`` then runs ``reducer`` there too (one file alone: the working set only,
    as there is nothing to gather across ranks). ``warm_up``: modules this process imports
    while pool workers parse.
    Cache entries of files parsed by pool workers are written before this returns, or with
    ``defer_cache_writes`` by a background thread while the caller goes on (the command line
    waits for it with :func:`tracekit.ingest.cache_writes.write_deferred_entries` after its
    output; at exit at the latest).
    """
    from tracekit.ingest.working_set import ROWS

    if rows not in ROWS:
        raise ValueError(f"rows={rows!r}: choose one of {ROWS}")
    if rows == "reduce" and (reducer is None or len(paths) < 2):
        rows, reducer = "analysis", None
    tasks = [
        IngestTask(str(path), file_id, rank_pattern, rank_map, cache_dir, rows, reducer)
        for file_id, path in enumerate(paths)
    ]
    on_done = (lambda task: progress(Path(task.path))) if progress else None
    results = run_tasks(
        tasks,
        executor=executor,
        jobs=jobs,
        scheduler=scheduler,
        on_done=on_done,
        bytes_read=bytes_read,
        warm_up=warm_up,
    )
    # Deferred: written by a background thread, finished by the command after its output.
    write_deferred_entries(background=defer_cache_writes)
    files: list[TraceFile] = []
    parts: list[EventColumns] = []
    for parsed in results:
        for trace, columns in parsed:
            files.append(trace)
            parts.append(columns)
    del results
    return files, events_frame(parts)


def run_tasks(
    tasks: list[IngestTask],
    executor: str = "local",
    jobs: int | None = None,
    scheduler: Any = None,  # an address or a distributed.Client
    on_done: Callable[[IngestTask], None] | None = None,
    bytes_read: Callable[[int], None] | None = None,
    warm_up: tuple[str, ...] = WARM_UP,
) -> list[Parsed]:
    """Run ``tasks``; return their results in task order.

    ``on_done`` is called as each task finishes; ``bytes_read`` with counts of input bytes
    consumed (as they are read when parsing here, per whole file from workers). ``warm_up``:
    the modules this process imports while pool workers parse (what the caller needs next).
    """
    if executor not in EXECUTORS:
        raise TracekitError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise TracekitError(f"--jobs {jobs}: give a number of worker processes, 1 or more")
    if executor == "dask":
        from tracekit.ingest.dask_cluster import run_on_dask

        return run_on_dask(tasks, scheduler, jobs, on_done, bytes_read)
    results: list[Parsed | None] = [None] * len(tasks)
    todo = _cached_here(tasks, results, on_done, bytes_read)
    jobs = default_jobs(len(todo)) if jobs is None else min(jobs, max(1, len(todo)))
    if jobs == 1:
        for i in todo:
            results[i] = ingest_one(tasks[i], bytes_read)
            if on_done:
                on_done(tasks[i])
    else:
        from tracekit.ingest.pool import run_pool

        run_pool(tasks, todo, results, jobs, on_done, bytes_read, warm_up)
    return results  # type: ignore[return-value]


def _cached_here(
    tasks: list[IngestTask],
    results: list[Any],
    on_done: Callable[[IngestTask], None] | None,
    bytes_read: Callable[[int], None] | None,
) -> list[int]:
    """Fill ``results`` with the parses the cache holds for files whose digest is already
    known (no hashing here); return the indices still to parse."""
    if not any(task.cache_dir for task in tasks):  # nothing to look up: no cache to import
        return list(range(len(tasks)))
    from tracekit.ingest.cache import ParseCache

    todo = []
    caches: dict[str, ParseCache] = {}
    for i, task in enumerate(tasks):
        if task.cache_dir:
            cache = caches.setdefault(task.cache_dir, ParseCache(task.cache_dir))
            found = cache.lookup(Path(task.path), task.options(), task.file_id, hash_file=False)
            if found.parsed is not None:
                results[i] = found.parsed
                if bytes_read:
                    bytes_read(file_size(task.path))
                if on_done:
                    on_done(task)
                continue
        todo.append(i)
    return todo
