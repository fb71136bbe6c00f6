"""The analysis of a run *while it trains*: what ``tracekit.trace_handler(..., analyze=True)``
writes, and :class:`Monitor`, which reads it back in the training loop.

Once every rank's trace of a profiled window is written, the handler of rank 0 has that
window analysed (:mod:`tracekit.monitor.window`) by its analysis worker, one process of its
own for the whole run (:mod:`tracekit.monitor.worker`, fed and awaited by a thread of
:mod:`tracekit.monitor.background`): the training step only hands that thread the window's
number. The analysis writes

- ``RUN_DIR/monitor/window_<N>.json``: the window's summary (:data:`SUMMARY_KEYS`), written
  whole or not at all, so a reader never sees half of one;
- one TensorBoard event file per window (``tensorboard=``; scalars listed in
  :mod:`tracekit.monitor.window`);

and the handler passes the same scalars, per profiled step, to ``sink(scalars, step)``.

:class:`Monitor` reads the summaries (any rank may: it only lists the folder and reads the
newest file). Standard library only, like the handler: ``import tracekit`` stays light and
the training process never imports pandas for it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

MONITOR_FOLDER = "monitor"
_SUMMARY = re.compile(r"^window_(\d+)\.json$")

# The keys of a window's summary (window_<N>.json), each documented in tracekit.monitor.window.
SUMMARY_KEYS = (
    "written_by",
    "tracekit_version",
    "window",
    "steps",
    "schedule",
    "bubble_ratio",
    "step_ms",
    "idle_ms_by_cause",
    "stage_compute_ms",
    "ranks",
    "findings",
    "suggested_microbatches",
    "microbatch_replays",
    "suggestion_note",
    "whatif_command",
    "scalars",
    "analysis_s",
    "analysis_cpu_s",
)


def summary_path(run_dir: str | os.PathLike[str], window: int) -> Path:
    """Where the summary of the window whose traces are ``iteration_<window>`` lies.

    >>> summary_path("runs/pp", 14).as_posix()
    'runs/pp/monitor/window_14.json'
    """
    return Path(run_dir) / MONITOR_FOLDER / f"window_{window}.json"


def analysed_windows(run_dir: str | os.PathLike[str]) -> list[int]:
    """The windows with a summary written, oldest first.

    >>> import pathlib, tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> analysed_windows(run)
    []
    >>> (run / "monitor").mkdir()
    >>> for n in (14, 7):
    ...     _ = (run / "monitor" / f"window_{n}.json").write_text("{}")
    >>> analysed_windows(run)
    [7, 14]
    """
    try:
        names = os.listdir(Path(run_dir) / MONITOR_FOLDER)
    except OSError:  # nothing analysed yet: the folder is made by the first analysis
        return []
    return sorted(int(found.group(1)) for found in map(_SUMMARY.match, names) if found)


class Monitor:
    """The latest findings of a run that ``tracekit.trace_handler(run_dir, ..., analyze=True)``
    analyses while it trains: cheap to ask every step (a folder listing; the newest summary
    is read once).

    >>> import tempfile
    >>> import tracekit
    >>> monitor = tracekit.Monitor(tempfile.mkdtemp())
    >>> monitor.latest() is None                # no window analysed yet
    True
    >>> monitor.suggest_microbatches() is None
    True
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._cached: tuple[int, dict[str, Any]] | None = None

    def latest(self) -> dict[str, Any] | None:
        """The summary of the newest analysed window (a dict with :data:`SUMMARY_KEYS`:
        ``window``, ``steps``, ``bubble_ratio``, ``idle_ms_by_cause``, ``stage_compute_ms``,
        ``findings``, ``suggested_microbatches``, ...), or None before the first one.

        >>> import json, pathlib, tempfile
        >>> import tracekit
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> (run / "monitor").mkdir()
        >>> _ = (run / "monitor" / "window_8.json").write_text(json.dumps({"window": 8, "bubble_ratio": 0.3}))
        >>> tracekit.Monitor(run).latest()["bubble_ratio"]
        0.3
        """
        windows = analysed_windows(self.run_dir)
        if not windows:
            return None
        newest = windows[-1]
        if self._cached is None or self._cached[0] != newest:
            summary = json.loads(summary_path(self.run_dir, newest).read_text(encoding="utf-8"))
            self._cached = (newest, summary)
        return self._cached[1]

    def suggest_microbatches(self) -> int | None:
        """The microbatch count the newest window's replay runs fastest: the measured schedule
        replayed on the window's own costs at each candidate m (``tracekit whatif RUN_DIR
        --iteration N -s SCHEDULE -m ... ``, the command the summary names in
        ``whatif_command``), the global batch kept. None before the first window, or where
        the schedule cannot be replayed (``suggestion_note`` says why).

        >>> import json, pathlib, tempfile
        >>> import tracekit
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> (run / "monitor").mkdir()
        >>> _ = (run / "monitor" / "window_4.json").write_text(json.dumps({"window": 4, "suggested_microbatches": 16}))
        >>> tracekit.Monitor(run).suggest_microbatches()
        16
        """
        summary = self.latest()
        if summary is None:
            return None
        m = summary.get("suggested_microbatches")
        return int(m) if isinstance(m, int) else None

    def __repr__(self) -> str:
        return f"Monitor({str(self.run_dir)!r}: {len(analysed_windows(self.run_dir))} window(s) analysed)"


__all__ = ["MONITOR_FOLDER", "Monitor", "SUMMARY_KEYS", "analysed_windows", "summary_path"]
