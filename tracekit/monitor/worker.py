"""The analysis worker: one process per handler that analyses the profiled windows while the
training goes on, ``python -m tracekit.monitor.worker RUN_DIR --world-size W ...``, started
by :mod:`tracekit.monitor.background` (never by hand; its options are that module's).

It takes only CPU time the training leaves (:func:`tracekit.monitor.window.run_when_idle`),
imports pandas and the analysis once, then waits, asleep, for a window's number: one line on
its standard input. For each it analyses the window (:func:`tracekit.monitor.window.analyse_window`,
which writes the summary and the event file) and answers with one line of JSON on its
standard output: ``{"window": N, "ok": true, "cpu_s": ...}``, or ``{"window": N, "error":
"..."}`` with the traceback on standard error (the handler's ``monitor/worker.log``). The
handler sends the next number only after the answer, so one window is analysed at a time.

It exits when its standard input ends (the training process closed it, or ended: its pipe
closes with it) or when the process that started it is gone (checked each second while it
waits, for a pipe kept open by a process the training forked): a window in flight then is
finished first, and no worker outlives its training by more than that.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from tracekit.errors import TracekitError
from tracekit.monitor.window import analyse_window, run_when_idle

PARENT_CHECK_S = 1.0  # how often a waiting worker looks whether its training process is still there


def window_numbers(fd: int, parent: int) -> Iterator[int]:
    """The window numbers read from ``fd``, one a line, until it ends or ``parent`` is no
    longer this process's parent."""
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], PARENT_CHECK_S)
        if not ready:
            if os.getppid() != parent:
                return
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield int(line)


def answer(window: int, analyse: Callable[[int], object]) -> dict[str, object]:
    """Analyse one window (``analyse(window)``); the answer line's object. Any failure is the
    answer's ``error``, one line, with the traceback on standard error."""
    started_cpu_s = time.process_time()
    try:
        analyse(window)
    except Exception as err:  # noqa: BLE001 - one line for the training's log, whatever went wrong
        if not isinstance(err, TracekitError):
            traceback.print_exc(file=sys.stderr)
        line = str(err) if isinstance(err, TracekitError) else f"{type(err).__name__}: {err}"
        print(f"window {window}: {line}", file=sys.stderr, flush=True)
        return {"window": window, "error": line}
    return {"window": window, "ok": True, "cpu_s": round(time.process_time() - started_cpu_s, 3)}


def serve(analyse: Callable[[int], object], requests_fd: int, replies: TextIO, parent: int) -> None:
    """Answer each window number read from ``requests_fd`` on ``replies``, until the input ends."""
    for window in window_numbers(requests_fd, parent):
        reply = answer(window, analyse)
        try:
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
        except BrokenPipeError:  # the training process is gone; the summary is written all the same
            return


def warm_up() -> None:
    """Import what every window needs now, once, while the worker has nothing else to do."""
    import pandas  # noqa: F401

    import tracekit.analyze  # noqa: F401
    import tracekit.analyze.whatif  # noqa: F401
    import tracekit.loading  # noqa: F401


def _numbers(text: str) -> list[int]:
    """A comma-separated list of integers from the command line (empty: none)."""
    return [int(n) for n in text.split(",") if n]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracekit.monitor.worker", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--wait-s", type=float, default=600.0)
    parser.add_argument("--tensorboard", type=Path)
    parser.add_argument("--microbatches", default="", help="candidate m values, comma-separated")
    parser.add_argument("--no-idle", dest="idle", action="store_false", help="run at the caller's priority")
    parser.add_argument("--cpus", default="", help="the cores to run on, comma-separated (default: the caller's)")
    args = parser.parse_args(argv)
    parent = os.getppid()
    if args.idle:
        run_when_idle()
    if args.cpus:
        # the training's process may be pinned elsewhere: these cores are the user's choice
        os.sched_setaffinity(0, set(_numbers(args.cpus)))
    # the answers keep standard output to themselves: anything else printed goes to the log
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    warm_up()
    ms = _numbers(args.microbatches)

    def analyse(window: int) -> object:
        return analyse_window(args.run_dir, window, args.world_size, args.wait_s, args.tensorboard, ms)

    serve(analyse, sys.stdin.fileno(), replies, parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
