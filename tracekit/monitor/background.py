"""The training process's side of the analysis while training: a queue of one.

:meth:`WindowAnalyses.submit` is all the training step does (from the handler, inside
``prof.step()``): it notes the window's number under a lock and returns. A thread of this
process starts ``python -m tracekit.monitor.window`` for it (a process of its own, on one
core, given only the CPU time the training leaves), waits for that process outside the GIL, then hands the window's
scalars to the sink. One analysis is in flight at a time; a window that arrives meanwhile
waits, and a newer one replaces it (the older is skipped, with a log line): the newest
figures are what a training loop wants. A failed analysis, a failing sink or a process
that cannot be started is a warning on the ``tracekit.monitor`` logger, never an exception
in the training.

An analysis in flight when the training process ends finishes in its own process (its
summary and event file are written; the sink, in the ended process, is not called); a window
still waiting then is not analysed. :meth:`WindowAnalyses.wait` (``handler.wait()``) at the
end of a script waits for both.

Standard library only, like :mod:`tracekit.handler`.
"""

from __future__ import annotations

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


class WindowAnalyses:
    """The windows of one run analysed in the background, one at a time (see the module).

        ``world_size``: the ranks whose traces make a window (None: those there when its
        analysis starts); ``tensorboard``: the event files' folder (None: none written);
        ``microbatches``: the m values replayed for the suggestion (empty: half, once, twice and
        four times the measured m); ``idle``: the analysis runs only on CPU time the training
    leaves (Linux's ``SCHED_IDLE``, else the lowest priority; False: at the training's own).
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
    ) -> None:
        self.run_dir = run_dir
        self.world_size = world_size
        self.tensorboard = tensorboard
        self.sink = sink
        self.microbatches = tuple(microbatches)
        self.wait_s = wait_s
        self.idle = idle
        self.analysed: list[int] = []  # windows whose summary was written, in order
        self.failed: list[int] = []
        self.skipped: list[int] = []
        self._lock = threading.Condition()
        self._pending: int | None = None
        self._running: int | None = None
        self._thread: threading.Thread | None = None

    def submit(self, window: int) -> None:
        """Analyse ``window`` when the one in flight is done; never waits."""
        with self._lock:
            if self._pending is not None:
                self.skipped.append(self._pending)
                LOG.info(
                    "tracekit: window %d not analysed: window %d came while window %s was still being analysed",
                    self._pending,
                    window,
                    self._running,
                )
            self._pending = window
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="tracekit-monitor", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    @property
    def in_flight(self) -> int | None:
        """The window being analysed now, if any."""
        with self._lock:
            return self._running

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted window is analysed or skipped (for the end of a
        script, never inside a training step); False if ``timeout`` seconds passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._pending is None and self._running is None, timeout)

    def _work(self) -> None:
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
        folder = self.run_dir / MONITOR_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"window_{window}.log"
        with open(log_path, "wb") as log:
            done = subprocess.run(
                self.command(window), stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=_child_env(), check=False
            )
        if done.returncode != 0:
            self.failed.append(window)
            lines = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            LOG.warning(
                "tracekit: window %d not analysed: %s (exit status %d; %s)",
                window,
                lines[-1] if lines else "no message",
                done.returncode,
                log_path,
            )
            return
        log_path.unlink(missing_ok=True)
        self.analysed.append(window)
        if self.sink is not None:
            self._to_sink(window)

    def command(self, window: int) -> list[str]:
        """The analysis process's command line for ``window``."""
        command = [sys.executable, "-m", "tracekit.monitor.window", str(self.run_dir), "--iteration", str(window)]
        command += ["--wait-s", str(self.wait_s)] + ([] if self.idle else ["--no-idle"])
        if self.world_size is not None:
            command += ["--world-size", str(self.world_size)]
        if self.tensorboard is not None:
            command += ["--tensorboard", str(self.tensorboard)]
        if self.microbatches:
            command += ["--microbatches", ",".join(str(m) for m in self.microbatches)]
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
