"""Every way a parallel load can end (a bad file in this process or in a worker, a worker
stuck or killed, Ctrl-C) ends the command promptly, with the right error and exit status,
and leaves no worker process behind.

Each scenario runs in a fresh interpreter under a timeout, so a hang fails the test instead
of stalling the suite, and so the pool forks from a process with one thread (as the command
line does). Faults a real file cannot cause on demand (a worker that never finishes, one
that is killed, Ctrl-C during a parse) are injected by wrapping the real ``parse_one`` in
that fresh interpreter; the pool and its cleanup are the real code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SAMPLES

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import run; run()"]
HANG_GUARD_S = 120  # far above any healthy run here; reaching it means a hang


def _run_with_bad_file(tmp_path: Path, position: int) -> tuple[Path, Path]:
    """A copy of the 1f1b sample in which one rank file is replaced by bytes that are not a
    trace (a text line, then random bytes), sized so that it comes ``position``-th in the
    pool's largest-first queue."""
    run = tmp_path / f"run-bad-at-{position}"
    shutil.copytree(SAMPLES / "1f1b", run)
    victim = run / f"rank{position}.json.gz"
    others = sorted((p.stat().st_size for p in run.glob("rank*.json.gz") if p != victim), reverse=True)
    bounds = [others[0] + 4096] + others + [64]
    size = (bounds[position] + bounds[position + 1]) // 2  # between its neighbours in the queue
    prefix = b"this is not a trace\n"
    victim.write_bytes(prefix + os.urandom(size - len(prefix)))
    return run, victim


def _survivors(marker: str) -> list[int]:
    """Processes still running whose command line names ``marker`` (a worker left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to look for left-over workers")
@pytest.mark.parametrize("jobs", [2, 4])
@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_a_bad_file_anywhere_ends_the_command(tmp_path, position, jobs):
    run, victim = _run_with_bad_file(tmp_path, position)
    done = subprocess.run(
        TRACEKIT + ["analyze", str(run), "--no-cache", "--no-progress", "-j", str(jobs)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and victim.name in lines[0], done.stderr
    assert _survivors(str(run)) == []


DRIVER = textwrap.dedent("""
    import json, os, signal, sys, threading, multiprocessing
    from pathlib import Path
    from tracekit.ingest import discover, file_task, parse_files

    config = json.loads(sys.argv[1])
    parent = os.getpid()
    # Ctrl-C as in a terminal, however this was started: a background job of a shell without
    # job control (CI launched with `&`) starts with SIGINT ignored, and Python keeps that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    real_parse_one = file_task.parse_one

    def faulty_parse_one(task, bytes_read=None):
        name = Path(task.path).name
        here = "parent" if os.getpid() == parent else "worker"
        fault = config["faults"].get(f"{here}:{name}")
        if fault == "stuck":
            threading.Event().wait()          # a parse that never finishes
        if fault == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "ctrl-c":                 # Ctrl-C in a terminal: the whole process group
            os.killpg(os.getpgrp(), signal.SIGINT)
            threading.Event().wait(30)        # the KeyboardInterrupt arrives meanwhile
        if fault == "bad":
            from tracekit.errors import TraceFormatError
            raise TraceFormatError(f"{task.path}: injected bad file")
        return real_parse_one(task, bytes_read)

    file_task.parse_one = faulty_parse_one
    outcome = "ok"
    try:
        parse_files(discover(Path(config["run"])), jobs=config["jobs"])
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    print(json.dumps({"outcome": outcome, "children": len(multiprocessing.active_children())}))
""")


def _drive(tmp_path: Path, faults: dict[str, str], jobs: int = 2) -> dict:
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(SAMPLES / "1f1b", run)
    config = {"run": str(run), "jobs": jobs, "faults": faults}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert _survivors(str(run)) == []
    return json.loads(done.stdout.strip().splitlines()[-1])


def _every_file(fault: str, where: str) -> dict[str, str]:
    return {f"{where}:rank{r}.json.gz": fault for r in range(4)}


def test_a_bad_file_in_the_parent_does_not_wait_for_a_stuck_worker(tmp_path):
    faults = {**_every_file("stuck", "worker"), **_every_file("bad", "parent")}
    result = _drive(tmp_path, faults)
    assert result["outcome"].startswith("TraceFormatError") and "injected bad file" in result["outcome"]
    assert result["children"] == 0


def test_a_bad_file_in_a_worker_stops_the_parent_and_the_other_workers(tmp_path):
    result = _drive(tmp_path, _every_file("bad", "worker"), jobs=3)  # the parent parses for real
    assert result["outcome"].startswith("TraceFormatError"), result
    assert result["children"] == 0


def test_a_killed_worker_is_one_clear_error(tmp_path):
    result = _drive(tmp_path, _every_file("killed", "worker"))
    assert result["outcome"].startswith("WorkerDied"), result
    assert "killed by signal 9" in result["outcome"] and "--jobs 1" in result["outcome"]
    assert ".json.gz" in result["outcome"] and "\n" not in result["outcome"]
    assert result["children"] == 0


def test_ctrl_c_during_the_parse_ends_the_load_and_every_worker(tmp_path):
    faults = {**_every_file("stuck", "worker"), **_every_file("ctrl-c", "parent")}
    result = _drive(tmp_path, faults)
    assert result == {"outcome": "KeyboardInterrupt", "children": 0}


def test_a_clean_parallel_load_leaves_no_worker(tmp_path):
    assert _drive(tmp_path, {}, jobs=4) == {"outcome": "ok", "children": 0}


def test_a_rank_pattern_that_matches_no_file_ends_the_command(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    for trace in run.glob("rank*.json.gz"):  # names without a rank, no distributedInfo needed
        trace.rename(run / trace.name.replace("rank", "part-"))
    for _ in range(3):
        done = subprocess.run(
            TRACEKIT + ["analyze", str(run), "--no-cache", "--no-progress", "-j", "2", "--rank-from", "x(\\d+)"],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert _survivors(str(run)) == []


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_a_bad_file_anywhere_under_dask_is_one_clear_error(tmp_path, dask_client, position):
    from tracekit.errors import TracekitError
    from tracekit.ingest import discover, parse_files

    run, victim = _run_with_bad_file(tmp_path, position)
    with pytest.raises(TracekitError) as err:
        parse_files(discover(run), executor="dask", scheduler=dask_client)
    assert victim.name in str(err.value) and "\n" not in str(err.value)
    # the cluster is still usable afterwards
    files, _ = parse_files([SAMPLES / "1f1b" / "rank0.json.gz"], executor="dask", scheduler=dask_client)
    assert [f.rank for f in files] == [0]


def test_a_bad_file_under_a_local_dask_cluster_ends_the_command(tmp_path):
    pytest.importorskip("distributed", reason="dask[distributed] is not installed (pip install 'tracekit[dask]')")
    run, victim = _run_with_bad_file(tmp_path, 0)
    done = subprocess.run(
        TRACEKIT + ["analyze", str(run), "--no-cache", "--no-progress", "--executor", "dask", "-j", "2"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()  # no worker log, no traceback: the one line
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and victim.name in lines[0], done.stderr
