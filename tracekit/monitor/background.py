"""The training process's side of the analysis while training: a queue of one, and one worker.

:meth:`WindowAnalyses.submit` is all the training step does (from the handler, inside
``prof.step()``): it notes the window's number under a lock and returns. A thread of this
process hands the number to the analysis worker (``python -m tracekit.monitor.worker``, a
process of its own on one core, given only the CPU time the training leaves; see
:mod:`tracekit.monitor.worker`), waits for its answer outside the GIL, then hands the
window's scalars to the sink. The worker is started by that thread when the handler is made where
the world size is known then (:meth:`WindowAnalyses.start`), else at the first window (the
training step never waits for it), imports the analysis once, sleeps between windows, and
is started again at the next window if it died. One analysis is in flight at a time; a
window that arrives meanwhile waits, and a newer one replaces it (the older is skipped, with
a log line): the newest figures are what a training loop wants. A failed analysis, a failing
sink or a worker that cannot be started or dies is a warning on the ``tracekit.monitor``
logger, never an exception in the training.

The worker exits when the training process ends (its standard input, this process's pipe,
closes; at a normal exit :meth:`WindowAnalyses.close` also waits a moment for it): an
analysis in flight then finishes first (its summary and event file are written; the sink, in
the ended process, is not called); a window still waiting then is not analysed.
:meth:`WindowAnalyses.wait` (``handler.wait()``) at the end of a script waits for both. The
worker's standard error (tracebacks, anything it prints) is ``RUN_DIR/monitor/worker.log``.

Standard library only, like :mod:`tracekit.handler`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracekit.monitor import MONITOR_FOLDER, summary_path

LOG = logging.getLogger("tracekit.monitor")
#: ``sink(scalars, step)``: one call per profiled step, its scalars by tag (W&B's ``wandb.log`` fits)
Sink = Callable[[dict[str, float], int], object]
DEFAULT_WAIT_S = 600.0  # how long an analysis waits for the last rank's trace of its window
WORKER_LOG = "worker.log"
CLOSE_WAIT_S = 1.0  # how long a normal exit of the training waits for an idle worker to go


class WindowAnalyses:
    """The windows of one run analysed in the background, one at a time (see the module).

        ``world_size``: the ranks whose traces make a window (None: those there when its
        analysis starts); ``tensorboard``: the event files' folder (None: none written);
        ``microbatches``: the m values replayed for the suggestion (empty: half, once, twice and
        four times the measured m); ``idle``: the analysis runs only on CPU time the training
    leaves (Linux's ``SCHED_IDLE``, else the lowest priority; False: at the training's own);
    ``cpus``: the cores the worker runs on (empty: those of the training's process).
    """

    def __init__(
        self,
        run_dir: Path,
        world_size: int | None,
        *,
        tensorboard: Path | None = None,
        sink: Sink | None = None,
        microbatches: Sequence[int] = (),
        wait_s: float = DEFAULT_WAIT_S,
        idle: bool = True,
        cpus: Sequence[int] = (),
    ) -> None:
        self.run_dir = run_dir
        self.world_size = world_size
        self.tensorboard = tensorboard
        self.sink = sink
        self.microbatches = tuple(microbatches)
        self.wait_s = wait_s
        self.idle = idle
        self.cpus = tuple(cpus)
        self.analysed: list[int] = []  # windows whose summary was written, in order
        self.failed: list[int] = []
        self.skipped: list[int] = []
        self.cpu_s: dict[int, float] = {}  # the worker's CPU seconds for each analysed window
        self.workers_started = 0
        self._worker: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._lock = threading.Condition()
        self._pending: int | None = None
        self._running: int | None = None
        self._thread: threading.Thread | None = None

    def submit(self, window: int) -> None:
        """Analyse ``window`` when the one in flight is done; never waits."""
        with self._lock:
            if self._closed:
                LOG.info("tracekit: window %d not analysed: the analysis is closed", window)
                return
            if self._pending is not None:
                self.skipped.append(self._pending)
                LOG.info(
                    "tracekit: window %d not analysed: window %d came while window %s was still being analysed",
                    self._pending,
                    window,
                    self._running,
                )
            self._pending = window
            self._start_thread(early=False)
            self._lock.notify_all()

    def start(self) -> None:
        """Start the worker now, before the first window, so that its imports are done when
        that window comes; returns at once (the thread starts it). A worker that cannot start
        is a warning, and is tried again at the first window."""
        with self._lock:
            self._start_thread(early=True)

    def _start_thread(self, early: bool) -> None:
        """The thread that talks to the worker, started once (called under the lock)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._work, args=(early,), name="tracekit-monitor", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    @property
    def in_flight(self) -> int | None:
        """The window being analysed now, if any."""
        with self._lock:
            return self._running

    @property
    def worker_pid(self) -> int | None:
        """The analysis worker's process id while it runs (None before the first window)."""
        worker = self._worker
        return None if worker is None or worker.poll() is not None else worker.pid

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Take no more windows and let the worker go: it exits once the window in flight, if
        any, is analysed. Waits up to ``timeout`` seconds for it (run at the training
        process's exit); True if no worker is left."""
        with self._lock:
            self._closed = True
            self._pending = None
            worker = self._worker
        if worker is None:
            return True
        if worker.stdin is not None:
            try:
                worker.stdin.close()
            except OSError:  # a pipe the worker has already closed: it is gone
                pass
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted window is analysed or skipped (for the end of a
        script, never inside a training step); False if ``timeout`` seconds passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._pending is None and self._running is None, timeout)

    def _work(self, early: bool) -> None:
        if early:
            try:
                self._running_worker()
            except Exception as err:  # noqa: BLE001 - tried again at the first window
                LOG.warning("tracekit: the analysis worker could not start: %s", err)
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending is not None)
                window, self._pending = self._pending, None
                self._running = window
            assert window is not None
            try:
                self._analyse(window)
            except Exception as err:  # noqa: BLE001 - whatever it is, the training goes on
                LOG.warning("tracekit: window %d: the analysis while training failed: %s", window, err)
            finally:
                with self._lock:
                    self._running = None
                    self._lock.notify_all()

    def _analyse(self, window: int) -> None:
        worker = self._running_worker()
        assert worker.stdin is not None and worker.stdout is not None
        try:
            worker.stdin.write(f"{window}\n".encode())
            worker.stdin.flush()
            line = worker.stdout.readline()
        except (OSError, ValueError):  # a worker gone, or closed meanwhile
            line = b""
        reply: dict[str, Any] = json.loads(line) if line else {}
        if reply.get("window") != window or not reply.get("ok"):
            self.failed.append(window)
            if not line:
                self._worker = None
                try:  # its output ended: it is ending, or has ended
                    status: int | None = worker.wait(CLOSE_WAIT_S * 5)
                except subprocess.TimeoutExpired:
                    status = None
                reason = f"the analysis worker ended (exit status {status})" if status is not None else "no answer"
            else:
                reason = str(reply.get("error", "no message"))
            LOG.warning(
                "tracekit: window %d not analysed: %s (%s)", window, reason, self.run_dir / MONITOR_FOLDER / WORKER_LOG
            )
            return
        self.analysed.append(window)
        self.cpu_s[window] = float(reply.get("cpu_s", 0.0))
        if self.sink is not None:
            self._to_sink(window)

    def _running_worker(self) -> subprocess.Popen[bytes]:
        """The worker, started now if there is none or it died (not after :meth:`close`)."""
        if self._worker is not None and self._worker.poll() is None:
            return self._worker
        folder = self.run_dir / MONITOR_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / WORKER_LOG, "ab") as log:
            worker = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=_child_env(),
            )
        with self._lock:  # not started under the lock: submit(), in the training step, takes it
            self._worker = worker
            self.workers_started += 1
            closed = self._closed
        if closed and worker.stdin is not None:
            worker.stdin.close()  # it goes at once; this window is a warning
        return worker

    def command(self) -> list[str]:
        """The analysis worker's command line. ``-P``: the working folder is not on its path, so
        a ``tracekit`` folder there cannot stand in for this one (found by ``PYTHONPATH``)."""
        command = [sys.executable, "-P", "-m", "tracekit.monitor.worker", str(self.run_dir)]
        command += ["--wait-s", str(self.wait_s)] + ([] if self.idle else ["--no-idle"])
        if self.world_size is not None:
            command += ["--world-size", str(self.world_size)]
        if self.tensorboard is not None:
            command += ["--tensorboard", str(self.tensorboard)]
        if self.microbatches:
            command += ["--microbatches", _listed(self.microbatches)]
        if self.cpus:
            command += ["--cpus", _listed(self.cpus)]
        return command

    def _to_sink(self, window: int) -> None:
        assert self.sink is not None
        summary: dict[str, Any] = json.loads(summary_path(self.run_dir, window).read_text(encoding="utf-8"))
        for step, scalars in sorted(summary["scalars"].items(), key=lambda item: int(item[0])):
            try:
                self.sink(dict(scalars), int(step))
            except Exception as err:  # noqa: BLE001 - a sink's failure is the sink's, not the training's
                LOG.warning("tracekit: window %d: the sink failed at step %s: %s", window, step, err)
                return


def _child_env() -> dict[str, str]:
    """This environment, with this tracekit first on the path (the training may have found it
    by a path of its own) and one thread for numpy's libraries (the training's cores are the
    training's)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def _listed(numbers: Sequence[int]) -> str:
    """Integers as the worker's command line takes them (tracekit.monitor.worker._numbers)."""
    return ",".join(str(n) for n in numbers)
