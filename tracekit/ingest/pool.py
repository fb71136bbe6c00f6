"""The local process pool: a run's files parsed by ``jobs - 1`` worker processes and this
process together (:func:`run_pool`).

Workers are forked where that is safe (no other threads), else started by a fork server;
each is fed over its own pipe by a thread of this process. Every way a load can end (all
files parsed, a bad file here or in a worker, Ctrl-C, a worker killed) ends and reaps every
worker before :func:`run_pool` returns or raises.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext
from typing import Any

from tracekit.errors import TracekitError

# parse_one is looked up at each call, so that a wrapper around it (a test's injected fault)
# reaches this process and the forked workers alike
from tracekit.ingest import file_task
from tracekit.ingest.cache_writes import PendingEntry, write_deferred_entries
from tracekit.ingest.columns import Parsed
from tracekit.ingest.file_task import IngestTask, WorkerDied, file_size


def _pool_context() -> ForkContext | ForkServerContext | SpawnContext:
    methods = multiprocessing.get_all_start_methods()
    # Forking copies no interpreter start-up and no imports, but is only safe while this
    # process runs no other threads (one could hold a lock the child inherits).
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["tracekit.ingest.pool", "tracekit.ingest.kineto"])
        return ctx
    return multiprocessing.get_context("spawn")


class _Cancelled(BaseException):
    """Raised inside this process's own parse when another file has already failed."""


class _RemoteTraceback(Exception):
    """The traceback of an unexpected error in a worker, kept as the ``__cause__``."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _worker_main(conn: Connection, inherited: list[Connection]) -> None:
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
            answer: tuple[str, Any] = ("ok", file_task.parse_one(task))
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


def _room_for_answers(conn: Connection) -> None:
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
        self.conns: list[Any] = []
        self.procs: list[Any] = []
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


def run_pool(
    tasks: list[IngestTask],
    todo: list[int],
    results: list[Any],
    jobs: int,
    on_done: Callable[[IngestTask], None] | None,
    bytes_read: Callable[[int], None] | None,
    warm_up: tuple[str, ...],
) -> None:
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
    queue = deque(sorted(todo, key=lambda i: -file_size(tasks[i].path)))
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

    def finish(i: int, parsed: Parsed, pending: PendingEntry | None, whole_file: bool) -> None:
        if pending is not None:
            pending.defer(parsed)
        with lock:
            results[i] = parsed
            if whole_file and bytes_read:
                bytes_read(file_size(tasks[i].path))
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
                parsed, pending = answer
                finish(i, parsed, pending, whole_file=True)
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
            parsed, pending = file_task.parse_one(tasks[i], read_here)
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
