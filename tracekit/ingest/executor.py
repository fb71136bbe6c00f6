"""Where per-file parsing runs: in this process, in a local process pool, or on a Dask cluster.

Each trace file is parsed independently (one rank, or one nsys report), so the files of a
run are tasks with no shared state: :func:`ingest_one` takes a path and the parse options,
looks the file up in the cache, parses it on a miss and writes the entry. The same function
runs in every executor; only the results travel back: each file's typed rows (a few MB a
rank), or with ``rows="reduce"`` what its :class:`~tracekit.ingest.options.Reducer` makes of
them (each rank's steps and actions and the few rows messages need, see
:mod:`tracekit.reconstruct.per_rank`). Cross-rank work (message matching, clock alignment,
schedule, analysis) happens after, on the gathered tables.

- ``local``: files whose digest the cache remembers are read from the cache here; the rest
  are parsed in this process (one job, or one file: a byte-level progress bar works) or by
  ``jobs - 1`` pool workers and this process together (see :func:`_run_pool`); workers are
  forked where that is safe (no other threads), else started by a fork server.
- ``dask``: ``Client(scheduler)`` (a running cluster; tracekit must be installed on its
  workers and the files readable there), or a ``LocalCluster`` when no address is given.
  Give a cache root on storage the workers share (a shared path or an fsspec URL).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import multiprocessing
import os
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tracekit.errors import TracekitError
from tracekit.ingest.columns import EventColumns
from tracekit.ingest.options import WARM_UP, Reducer
from tracekit.model.events import TraceFile

EXECUTORS = ("local", "dask")
Parsed = list[tuple[TraceFile, EventColumns]]


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

    def options(self) -> dict:
        rank_map = sorted(self.rank_map.items()) if self.rank_map else None
        options = {"rank_pattern": self.rank_pattern, "rank_map": rank_map}
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


@dataclass
class PendingEntry:
    """A cache entry to write for a file just parsed (by whoever holds the rows)."""

    cache_dir: str
    key: str
    path: str
    stamp: list[int]

    def store(self, parsed: Parsed) -> None:
        if self.unchanged():
            self._cache().store(self.key, parsed)

    def defer(self, parsed: Parsed) -> None:
        """Keep a copy of the rows (the run's table consumes them next) and write the entry
        when :func:`write_deferred_entries` runs: after the command's output, when this
        process's memory peak is behind it (Arrow and Parquet map ~30 MB of library code
        and buffers)."""
        if self.unchanged():
            if not _DEFERRED:
                atexit.register(write_deferred_entries)
            # The file facts copied too: the run lets go of a rank's reduction once read.
            _DEFERRED.append((self, [(dataclasses.replace(trace), columns.copy()) for trace, columns in parsed]))

    def unchanged(self) -> bool:
        """A file rewritten while it was parsed is not stored."""
        from tracekit.ingest.cache import file_stamp

        try:
            return file_stamp(Path(self.path)) == self.stamp
        except OSError:
            return False

    def _cache(self):
        from tracekit.ingest.cache import ParseCache

        return ParseCache(self.cache_dir)


_DEFERRED: list[tuple[PendingEntry, Parsed]] = []
_WRITER: list[threading.Thread] = []  # the background writer, while one runs


def write_deferred_entries(background: bool = False) -> None:
    """Write the cache entries kept by :meth:`PendingEntry.defer`.

    ``background``: in a thread, and return at once (Parquet encoding runs outside the
    interpreter lock, beside the single-threaded analysis that follows the parse); a later
    call without it waits for that thread and writes whatever is left."""
    if background:
        if _DEFERRED and not any(w.is_alive() for w in _WRITER):
            writer = threading.Thread(target=_drain_deferred, name="tracekit-cache-writer", daemon=True)
            _WRITER[:] = [writer]
            writer.start()
        return
    for writer in _WRITER:
        writer.join()
    _WRITER.clear()
    _drain_deferred()


def _drain_deferred() -> None:
    while True:
        try:
            entry, parsed = _DEFERRED.pop(0)
        except IndexError:
            return
        entry._cache().store(entry.key, parsed)


def parse_one(task: IngestTask, bytes_read: Callable[[int], None] | None = None) -> tuple[Parsed, PendingEntry | None]:
    """Parse one file, or read it from the cache; also say which entry to write, if any.

    Local pool workers run this and leave the writing to the parent, which has pyarrow
    loaded anyway: a worker then needs only numpy and msgspec (~30 MB, no import time)."""
    from tracekit.ingest import _parse_file

    path = Path(task.path)
    found = None
    if task.cache_dir:
        from tracekit.ingest.cache import ParseCache

        found = ParseCache(task.cache_dir).lookup(path, task.options(), task.file_id)
        if found.parsed is not None:
            if bytes_read:
                bytes_read(_size(task.path))
            return found.parsed, None
    parsed = _parse_file(path, task.file_id, task.rank_pattern, task.rank_map, bytes_read=bytes_read)
    if task.rows in ("analysis", "reduce"):
        from tracekit.ingest.working_set import working_set

        parsed = [(trace, working_set(columns)) for trace, columns in parsed]
    if task.rows == "reduce" and task.reducer is not None:
        parsed = task.reducer.function(parsed)
    if found is not None and found.key is not None:
        return parsed, PendingEntry(task.cache_dir, found.key, task.path, found.stamp)
    return parsed, None


def _cached_here(tasks: list[IngestTask], results: list, on_done, bytes_read) -> list[int]:
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
                    bytes_read(_size(task.path))
                if on_done:
                    on_done(task)
                continue
        todo.append(i)
    return todo


def default_jobs(n_tasks: int) -> int:
    """One worker per core, never more than there are files."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n_tasks))


def run_tasks(
    tasks: list[IngestTask],
    executor: str = "local",
    jobs: int | None = None,
    scheduler=None,
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
        return _run_dask(tasks, scheduler, jobs, on_done, bytes_read)
    results: list[Parsed | None] = [None] * len(tasks)
    todo = _cached_here(tasks, results, on_done, bytes_read)
    jobs = default_jobs(len(todo)) if jobs is None else min(jobs, max(1, len(todo)))
    if jobs == 1:
        for i in todo:
            results[i] = ingest_one(tasks[i], bytes_read)
            if on_done:
                on_done(tasks[i])
    else:
        _run_pool(tasks, todo, results, jobs, on_done, bytes_read, warm_up)
    return results  # type: ignore[return-value]


def _pool_context():
    methods = multiprocessing.get_all_start_methods()
    # Forking copies no interpreter start-up and no imports, but is only safe while this
    # process runs no other threads (one could hold a lock the child inherits).
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["tracekit.ingest.executor", "tracekit.ingest.kineto"])
        return ctx
    return multiprocessing.get_context("spawn")


class WorkerDied(TracekitError):
    """A parser process ended without an answer (killed, out of memory)."""


class _Cancelled(BaseException):
    """Raised inside this process's own parse when another file has already failed."""


class _RemoteTraceback(Exception):
    """The traceback of an unexpected error in a worker, kept as the ``__cause__``."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _worker_main(conn, inherited) -> None:
    """A parser process: parse each task it is sent, send back (rows, entry) or the error.

    The parent alone decides when the load ends: Ctrl-C reaches it and it ends the workers
    (SIGINT is ignored here), and a worker whose parent is gone finds its pipe closed."""
    import pickle
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    for other in inherited:  # forked: the parent's ends of the pipes, this one's included
        other.close()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            answer = ("ok", parse_one(task))
        except BaseException as err:  # noqa: BLE001 - every error goes back to the parent
            if not isinstance(err, TracekitError):
                err.__cause__ = _RemoteTraceback(traceback.format_exc())
            try:
                pickle.dumps(err)
            except Exception:  # noqa: BLE001 - an exception that cannot travel
                err = RuntimeError(f"{type(err).__name__}: {err}")
            answer = ("error", err)
        try:
            conn.send(answer)
        except (OSError, ValueError):
            return


def _die_with_parent() -> None:
    """On Linux, have the kernel end this worker if the parent is killed mid-parse."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# A parsed GPU rank's answer is ~0.8 MB. Through a socket's default send buffer (~200 KB) the
# worker stopped mid-send, several times a file, until this process's feeder thread got the
# interpreter lock to drain it: 1-6 ms a file on 2 cores, the worker idle (benchmarks/README.md).
ANSWER_BUFFER = 4 << 20


def _room_for_answers(conn) -> None:
    """Let a worker's end of its socket hold a whole answer, as far as the system allows
    (Linux caps it at ``net.core.wmem_max``); nothing where the connection is no socket."""
    import socket

    try:
        fd = os.dup(conn.fileno())
    except (OSError, AttributeError, ValueError):  # no descriptor
        return
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # a pipe, not a socket
        os.close(fd)
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ANSWER_BUFFER)
    except OSError:
        pass
    finally:
        sock.close()


class _Workers:
    """``n`` parser processes, each fed over its own pipe by a thread of this process.

    Unlike a ``ProcessPoolExecutor``, every way the load can end (all files parsed, a bad
    file here or in a worker, Ctrl-C, a worker killed) goes through :meth:`close`, which
    ends and reaps every worker before it returns: nothing is left for exit handlers to
    wait on."""

    def __init__(self, n: int):
        ctx = _pool_context()
        forked = ctx.get_start_method() == "fork"
        self.conns: list = []
        self.procs: list = []
        try:
            for _ in range(n):
                here, there = ctx.Pipe(duplex=True)
                _room_for_answers(there)
                self.conns.append(here)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(there, list(self.conns) if forked else []),
                    name="tracekit-parser",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    there.close()
                self.procs.append(proc)
        except BaseException:
            self.close(graceful=False)
            raise

    def died(self, k: int, path: str) -> WorkerDied:
        proc = self.procs[k]
        proc.join(timeout=1)
        code = proc.exitcode
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with status {code}"
            if code is not None
            else "stopped answering"
        )
        hint = " (out of memory?)" if code == -9 else ""
        return WorkerDied(
            f"{path}: the parser process reading it {how}{hint}; rerun with --jobs 1 to parse in this process"
        )

    def close(self, graceful: bool) -> None:
        """End every worker: ask them to stop after a clean load, else kill them at once
        (one may be halfway through a large file nobody needs now); then reap them."""
        if graceful:
            for conn in self.conns:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
            for proc in self.procs:
                proc.join(timeout=1)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join()
            proc.close()


def _run_pool(tasks, todo, results, jobs, on_done, bytes_read, warm_up) -> None:
    """Parse ``todo`` on ``jobs`` cores: ``jobs - 1`` worker processes and this process.

    The workers fork first, while this process has loaded neither pandas nor pyarrow, so
    each stays ~30 MB. This process takes files from the same queue and imports ``warm_up``,
    what the caller needs next (~0.17 s of lean pandas), while the workers parse: first, when the
    queue holds at least two files per core (the workers have enough to do meanwhile),
    else after its last file. Loaded last, on 8 GPU ranks of 26 MB, it ran ~0.15 s after
    the worker had finished, with one core idle; loaded first, the two cores end together
    (``benchmarks/README.md``), for ~15-30 MB more at the tree's peak (pandas and a parse's
    buffers held at once). There is one process fewer than there are cores, which is what keeps
    the peak memory of the whole process tree low. Largest files go first.

    The first failure anywhere (a bad file here or in a worker, a worker that died,
    Ctrl-C) stops the handing out of files, kills the workers and is raised here once
    every worker is reaped.
    """
    write_deferred_entries()  # no writer thread may run while the workers fork
    importlib.import_module("tracekit.ingest.kineto")  # light; forked workers start parsing at once
    queue = deque(sorted(todo, key=lambda i: -_size(tasks[i].path)))
    lock = threading.Lock()
    failure: list[BaseException] = []
    stopped = threading.Event()  # a failure was recorded: hand out nothing more
    fed = threading.Event()  # every feeder has returned, or a failure was recorded
    feeders_left = [jobs - 1]

    def take() -> int | None:
        with lock:
            return queue.popleft() if queue and not failure else None

    def fail(err: BaseException) -> None:
        with lock:
            failure.append(err)
        stopped.set()
        fed.set()  # stop waiting for the feeders: close() ends their workers

    def finish(i: int, parsed, pending, whole_file: bool) -> None:
        if pending is not None:
            pending.defer(parsed)
        with lock:
            results[i] = parsed
            if whole_file and bytes_read:
                bytes_read(_size(tasks[i].path))
            if on_done:
                on_done(tasks[i])

    workers = _Workers(jobs - 1)

    def feed(k: int) -> None:
        """Keep worker ``k`` busy: hand it files, collect its answers. While plenty are
        left, a second file waits in its pipe, so it never idles for this process's
        threads to get their turn at the interpreter lock."""
        conn = workers.conns[k]
        inflight: deque[int] = deque()
        try:
            while True:
                want = 2 if len(queue) > jobs else 1
                while len(inflight) < want and (nxt := take()) is not None:
                    inflight.append(nxt)
                    conn.send(tasks[nxt])
                if not inflight:
                    return
                i = inflight[0]
                try:
                    status, answer = conn.recv()
                except (EOFError, OSError):
                    if not stopped.is_set():  # not killed by close(): it died by itself
                        fail(workers.died(k, tasks[i].path))
                    return
                inflight.popleft()
                if status == "error":
                    fail(answer)
                    return
                finish(i, *answer, whole_file=True)
        except (BrokenPipeError, ConnectionResetError):
            if not stopped.is_set():
                fail(workers.died(k, tasks[inflight[-1]].path))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            fail(err)

    def feeding(k: int) -> None:
        try:
            feed(k)
        finally:
            with lock:
                feeders_left[0] -= 1
                if not feeders_left[0]:
                    fed.set()

    def read_here(nbytes: int) -> None:
        if stopped.is_set():  # another file failed: drop this one mid-way
            raise _Cancelled
        if bytes_read:
            with lock:
                bytes_read(nbytes)

    feeders = [
        threading.Thread(target=feeding, args=(k,), daemon=True, name=f"tracekit-feed-{k}") for k in range(jobs - 1)
    ]
    import_first = len(queue) >= 2 * jobs
    try:
        for feeder in feeders:
            feeder.start()
        if import_first:
            _import_modules(warm_up)
        while (i := take()) is not None:
            parsed, pending = parse_one(tasks[i], read_here)
            finish(i, parsed, pending, whole_file=False)
        if not import_first:
            _import_modules(warm_up)
        while not fed.wait(0.05):  # set as the last feeder returns, or by a failure; the
            pass  # timeout only keeps Ctrl-C answered
    except _Cancelled:
        pass
    except BaseException as err:
        fail(err)
    finally:
        stopped.set()
        workers.close(graceful=not failure)
        for feeder in feeders:
            if feeder.ident is not None:
                feeder.join()
    if failure:
        interrupt = next((e for e in failure if isinstance(e, KeyboardInterrupt)), None)
        raise interrupt or failure[0]


def _import_modules(names: tuple[str, ...]) -> None:
    """Import the modules the parent needs after parsing (lean pandas alone takes ~0.17 s)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # reported where they are needed
            pass


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _ingest_on_dask(task: IngestTask):
    """:func:`ingest_one` for a Dask worker: a user's bad file comes back as a value, not as a
    failed task, which Dask would log with its traceback on the worker's stderr."""
    try:
        return "ok", ingest_one(task)
    except TracekitError as err:
        return "error", err


def _run_dask(tasks, scheduler, jobs, on_done, bytes_read) -> list[Parsed]:
    try:
        from distributed import Client, KilledWorker, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise TracekitError("--executor dask needs Dask: pip install 'tracekit[dask]'") from None
    cluster = None
    if isinstance(scheduler, Client):
        client, own_client = scheduler, False
    else:
        if scheduler:
            try:
                client = Client(scheduler, timeout="30s")
            except (OSError, TimeoutError) as err:
                raise TracekitError(
                    f"--scheduler {scheduler}: cannot reach a Dask scheduler there ({err}); give "
                    "its address, e.g. tcp://host:8786"
                ) from None
        else:
            import logging
            import warnings

            # Our own private cluster shares this terminal: its logs and notices (its HTTP
            # port moved because another cluster holds 8787) are not the user's business.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cluster = LocalCluster(
                    n_workers=jobs or default_jobs(len(tasks)),
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,
                )
            client = Client(cluster)
        own_client = True
    futures = []
    try:
        futures = client.map(_ingest_on_dask, tasks, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        results: list[Parsed | None] = [None] * len(tasks)
        for future in dask_completed(futures):
            i = index[future.key]
            try:
                status, answer = future.result()
            except KilledWorker:
                raise WorkerDied(
                    f"{tasks[i].path}: the Dask workers parsing it died (out of memory?); "
                    "give the workers more memory, or parse locally (--executor local)"
                ) from None
            if status == "error":
                raise answer
            results[i] = answer
            if bytes_read:
                bytes_read(_size(tasks[i].path))
            if on_done:
                on_done(tasks[i])
        return results  # type: ignore[return-value]
    finally:
        if futures:
            client.cancel([f for f in futures if not f.done()])
        if own_client:
            client.close()
        if cluster is not None:
            cluster.close()
