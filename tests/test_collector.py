"""tracekit._collector: the command pauses the garbage collector while its modules load, then
freezes what loaded and collects as usual; parser workers settle as they start.

Each check runs in a fresh interpreter: the collector's state lasts for the life of a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "1f1b"


def _run(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pause_then_settle_freezes_what_loaded_and_collects_again():
    out = _run(
        """
import gc
from tracekit._collector import pause, settle, is_paused
pause()
state = [gc.isenabled(), is_paused()]
import pandas  # a module load, paused
settle()
cycle = []; cycle.append(cycle); del cycle  # made after: collected as usual
print(state, gc.isenabled(), is_paused(), gc.get_freeze_count() > 10_000, gc.collect() >= 1)
"""
    )
    assert out.split("\n")[0] == "[False, True] True False True True"


def test_settle_without_pause_leaves_the_collector_alone():
    # A library user (or CliRunner in a test) never paused: nothing is frozen, nothing disabled.
    out = _run(
        """
import gc
from tracekit._collector import settle
gc.disable()
settle()
print(gc.isenabled(), gc.get_freeze_count())
"""
    )
    assert out.split() == ["False", "0"]


_WORKERS = """
import gc, json, sys
from tracekit._collector import pause
from tracekit.ingest.executor import run_tasks
from tracekit.ingest.file_task import IngestTask
from tracekit.ingest.options import Reducer
def collector_state(parsed):
    return [gc.isenabled(), gc.get_freeze_count() > 0]
pause()
state = Reducer(collector_state)
tasks = [IngestTask(p, i, rows="reduce", reducer=state) for i, p in enumerate(sys.argv[1:])]
results = run_tasks(tasks, jobs=2, warm_up=("json",))
print(json.dumps([results, gc.isenabled()]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked parser workers need fork")
def test_forked_workers_and_the_parent_settle_before_they_parse():
    files = sorted(str(p) for p in SAMPLE.glob("rank*.json.gz"))
    assert len(files) == 4
    # four files on two processes: the parent imports its warm-up (and settles) first, the
    # worker settles as it starts; every file reports the collector running, past frozen modules
    results, parent_enabled = json.loads(_run(_WORKERS, *files))
    assert results == [[True, True]] * 4
    assert parent_enabled


def test_the_command_settles_once_its_modules_are_in():
    code = """
import atexit, gc, sys
atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 10_000, file=sys.stderr))
sys.argv = ["tracekit", "analyze", sys.argv[1], "--no-cache", "--no-progress", "--jobs", "1"]
from tracekit.cli import run
run()
"""
    out = subprocess.run([sys.executable, "-c", code, str(SAMPLE)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.split()[-2:] == ["True", "True"]
