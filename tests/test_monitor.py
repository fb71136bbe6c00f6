"""The analysis while training (``trace_handler(..., analyze=True)``, :mod:`tracekit.monitor`):
a live 4-rank pipelining run whose windows are analysed while it trains (TensorBoard scalars
read back during the training, the sink, ``suggest_microbatches()`` against ``tracekit
whatif`` on the same traces); the queue of one (newest first) and its failures as warnings,
on the real sample traces; the handler's refusals; the docstrings' examples."""

from __future__ import annotations

import doctest
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLES

import tracekit
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.monitor import Monitor, analysed_windows, summary_path
from tracekit.monitor.background import WindowAnalyses

WINDOWS = (7, 14)  # tests/monitor_ranks.py --windows 2: traces ready at steps 7 and 14
CANDIDATES = (2, 4, 8, 16)  # half, once, twice and four times its m=4


def _whatif_fastest_m(run_dir: Path, window: int, ms) -> int:
    """The m of ``tracekit whatif``'s fastest prediction, read from its JSON (the shortest step)."""
    args = ["whatif", str(run_dir), "--iteration", str(window), "-s", "1F1B", "--json", "--no-progress"]
    result = CliRunner().invoke(main, args + [a for m in ms for a in ("-m", str(m))])
    assert result.exit_code == 0, result.output
    predictions = json.loads(result.stdout)["predictions"]
    assert sorted(p["m"] for p in predictions) == sorted(ms)
    return min(predictions, key=lambda p: p["step_ns"])["m"]


# --------------------------------------------------------------------------------------
# live: torch.distributed.pipelining, 4 ranks, gloo, analysed while it trains
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tracekit[capture]')")
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'tracekit[tensorboard]')")
    folder = tmp_path_factory.mktemp("live")
    run_dir, report = folder / "run", folder / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "monitor_ranks.py"),
            str(run_dir),
            str(report),
            "--until-analysed",
            "300",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, json.loads(report.read_text()), done.stderr


def test_scalars_are_read_back_while_the_run_trains(live):
    run_dir, report, _ = live
    # rank 0 saw a window's summary, read the event files, and the training went on after it
    assert report["first_seen_step"] is not None and report["first_seen_step"] < report["steps"]
    window = report["first_seen_window"]
    summary = json.loads(summary_path(run_dir, window).read_text())
    read_back = report["read_back"]
    for step in summary["steps"]:
        figures = summary["scalars"][str(step)]
        for tag in ("pipeline/bubble_ratio", "pipeline/step_ms", "pipeline/idle_comm_ms", "pipeline/idle_warmup_ms"):
            assert [step, pytest.approx(figures[tag], rel=1e-6)] in read_back[tag], tag
        for stage in range(4):
            tag = f"pipeline/stage_{stage}/compute_ms"
            assert [step, pytest.approx(figures[tag], rel=1e-6)] in read_back[tag], tag
        # the causes of every rank add up to its idle time
        for rank in range(4):
            causes = sum(
                v
                for k, v in figures.items()
                if k.startswith(f"pipeline/rank_{rank}/idle_") and k != f"pipeline/rank_{rank}/idle_ms"
            )
            assert causes == pytest.approx(figures[f"pipeline/rank_{rank}/idle_ms"], abs=1e-3)


def test_every_window_is_analysed_or_said_skipped_and_the_sink_gets_each_step(live):
    run_dir, report, stderr = live
    assert report["all_analysed"]
    assert sorted(report["analysed"] + report["skipped"]) == list(WINDOWS)
    assert report["analysed"][-1] == WINDOWS[-1] and report["latest_window"] == WINDOWS[-1]
    for window in report["skipped"]:
        assert f"window {window} not analysed" in stderr
    assert analysed_windows(run_dir) == report["analysed"]
    sunk = {step: scalars for step, scalars in report["sink"]}
    for window in report["analysed"]:
        summary = json.loads(summary_path(run_dir, window).read_text())
        assert summary["window"] == window and summary["schedule"] == {"name": "1F1B", "p": 4, "v": 1, "m": 4}
        assert len(summary["steps"]) == 2 and all(str(s) in summary["scalars"] for s in summary["steps"])
        assert summary["findings"] and {"cause", "severity", "headline", "advice"} <= set(summary["findings"][0])
        # per cause over every rank and step: the sum of the per-step scalars
        for cause, ms in summary["idle_ms_by_cause"].items():
            per_step = sum(summary["scalars"][str(s)][f"pipeline/idle_{cause}_ms"] for s in summary["steps"])
            assert per_step == pytest.approx(ms, abs=1e-3)
        for step in summary["steps"]:
            assert sunk[step] == summary["scalars"][str(step)]


def test_suggest_microbatches_is_tracekit_whatifs_answer(live):
    run_dir, report, _ = live
    last = report["latest_window"]
    summary = json.loads(summary_path(run_dir, last).read_text())
    assert summary["whatif_command"] == f"tracekit whatif {run_dir} --iteration {last} -s 1F1B -m 2 -m 4 -m 8 -m 16"
    assert (
        report["suggested"] == Monitor(run_dir).suggest_microbatches() == _whatif_fastest_m(run_dir, last, CANDIDATES)
    )
    scalars = summary["scalars"][str(max(summary["steps"]))]
    assert scalars["pipeline/suggested_microbatches"] == report["suggested"]
    for window in report["analysed"]:  # every window, not only the last
        expected = _whatif_fastest_m(run_dir, window, CANDIDATES)
        assert json.loads(summary_path(run_dir, window).read_text())["suggested_microbatches"] == expected


# --------------------------------------------------------------------------------------
# the queue of one, on the sample run's real traces
# --------------------------------------------------------------------------------------
def _in_flight(analyses: WindowAnalyses, window: int, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while analyses.in_flight != window:
        assert time.monotonic() < deadline, f"window {window} never started"
        time.sleep(0.05)


def _traces_of(run_dir: Path, window: int) -> None:
    folder = run_dir / f"iteration_{window}"
    folder.mkdir(parents=True)
    for trace in sorted((SAMPLES / "1f1b").glob("rank*.json.gz")):
        shutil.copy(trace, folder / trace.name)


def test_a_newer_window_replaces_the_waiting_one_and_the_sink_gets_every_analysed_step(tmp_path, caplog):
    run_dir = tmp_path / "run"
    sunk: list[tuple[int, dict[str, float]]] = []
    analyses = WindowAnalyses(run_dir, 4, sink=lambda scalars, step: sunk.append((step, scalars)), idle=False)
    caplog.set_level(logging.INFO, logger="tracekit.monitor")
    analyses.submit(3)  # its traces are not there yet: its analysis waits for them
    _in_flight(analyses, 3)
    analyses.submit(6)
    analyses.submit(9)  # 6 never started: 9 is newer
    assert analyses.skipped == [6]
    assert "window 6 not analysed: window 9 came while window 3 was still being analysed" in caplog.text
    _traces_of(run_dir, 3)
    _traces_of(run_dir, 9)
    assert analyses.wait(timeout=300)
    assert analyses.analysed == [3, 9] and analysed_windows(run_dir) == [3, 9] and analyses.failed == []
    assert analyses.workers_started == 1 and set(analyses.cpu_s) == {3, 9}  # one worker for both
    summary = Monitor(run_dir).latest()
    assert summary is not None and summary["window"] == 9
    assert [step for step, _ in sunk] == summary["steps"] * 2  # the same traces twice
    assert all(scalars == summary["scalars"][str(step)] for step, scalars in sunk)
    # the suggestion is whatif's, the figures add up
    assert summary["suggested_microbatches"] == _whatif_fastest_m(run_dir, 9, (4, 8, 16, 32))
    assert sum(summary["idle_ms_by_cause"].values()) == pytest.approx(
        sum(r["idle_ms"] for r in summary["ranks"].values()), abs=1e-3
    )


def test_a_failed_analysis_and_a_failing_sink_are_warnings(tmp_path, caplog):
    run_dir = tmp_path / "run"
    (run_dir / "iteration_2").mkdir(parents=True)
    with gzip.open(run_dir / "iteration_2" / "rank0.json.gz", "wt") as f:
        f.write("this is no trace")

    def sink(scalars, step):
        raise RuntimeError("the logger is down")

    analyses = WindowAnalyses(run_dir, None, sink=sink, idle=False)  # the ranks there: 1, then 4
    caplog.set_level(logging.INFO, logger="tracekit.monitor")
    analyses.submit(2)  # returns at once; the analysis fails in the worker
    assert analyses.wait(timeout=120)
    assert analyses.failed == [2] and analyses.analysed == []
    assert "window 2 not analysed:" in caplog.text and "worker.log" in caplog.text
    assert "window 2:" in (run_dir / "monitor" / "worker.log").read_text()
    assert Monitor(run_dir).latest() is None

    _traces_of(run_dir, 5)
    analyses.submit(5)
    assert analyses.wait(timeout=300)
    assert analyses.analysed == [5] and analyses.workers_started == 1  # the worker outlived the failure
    assert "window 5: the sink failed at step" in caplog.text and "the logger is down" in caplog.text
    assert analyses.close(timeout=60)


def test_a_window_whose_ranks_never_all_arrive_is_given_up(tmp_path, caplog):
    run_dir = tmp_path / "run"
    _traces_of(run_dir, 4)
    (run_dir / "iteration_4" / "rank3.json.gz").unlink()
    analyses = WindowAnalyses(run_dir, 4, wait_s=1, idle=False)
    caplog.set_level(logging.WARNING, logger="tracekit.monitor")
    analyses.submit(4)
    assert analyses.wait(timeout=120)
    assert analyses.failed == [4]
    assert "window 4 not analysed: window 4: 3 of 4 ranks' traces" in caplog.text


# --------------------------------------------------------------------------------------
# the worker's lifecycle: one per handler, started again if it dies, gone with the training
# --------------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _until_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_that_dies_is_a_warning_and_the_next_window_starts_another(tmp_path, caplog):
    run_dir = tmp_path / "run"
    analyses = WindowAnalyses(run_dir, 4, idle=False)
    caplog.set_level(logging.WARNING, logger="tracekit.monitor")
    analyses.submit(3)  # no traces yet: the worker waits for them
    _in_flight(analyses, 3)
    deadline = time.monotonic() + 60
    while analyses.worker_pid is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first = analyses.worker_pid
    os.kill(first, signal.SIGKILL)
    assert analyses.wait(timeout=60)
    assert analyses.failed == [3] and "window 3 not analysed: the analysis worker ended (exit status -9)" in caplog.text
    _traces_of(run_dir, 6)
    analyses.submit(6)
    assert analyses.wait(timeout=300)
    assert analyses.analysed == [6] and analyses.workers_started == 2 and analyses.worker_pid != first
    assert analyses.close(timeout=60) and analyses.worker_pid is None


def test_where_the_world_size_is_known_the_handler_starts_the_worker_before_the_first_window(tmp_path, monkeypatch):
    initialised = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, get_world_size=lambda: 4
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", initialised)  # as after init_process_group
    handler = tracekit.trace_handler(tmp_path / "run", rank=0, analyze=True, tensorboard=False)
    analyses = handler._analyses
    assert analyses is not None and analyses.world_size == 4
    deadline = time.monotonic() + 60
    while analyses.worker_pid is None:  # started by the thread, not by trace_handler
        assert time.monotonic() < deadline, "no worker before the first window"
        time.sleep(0.05)
    worker = analyses.worker_pid
    _traces_of(tmp_path / "run", 7)
    analyses.submit(7)
    assert handler.wait(timeout=300) and handler.analysed == [7]
    assert analyses.workers_started == 1 and analyses.worker_pid == worker
    assert handler.close(timeout=60) and _gone(worker)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="pinning a process to cores is Linux's")
def test_the_worker_runs_on_the_cores_given_and_analyses_there(tmp_path):
    # the training's process keeps its own cores; the worker moves to the one given
    mine = os.sched_getaffinity(0)
    last = max(mine)
    handler = tracekit.trace_handler(tmp_path / "run", rank=0, analyze=True, tensorboard=False, analysis_cpus=[last])
    _traces_of(tmp_path / "run", 7)
    analyses = handler._start_analyses(4)
    analyses.submit(7)
    deadline = time.monotonic() + 60
    while analyses.worker_pid is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = analyses.worker_pid
    while os.sched_getaffinity(pid) != {last}:  # set by the worker as it starts
        assert time.monotonic() < deadline, os.sched_getaffinity(pid)
        time.sleep(0.05)
    assert handler.wait(timeout=300) and analyses.analysed == [7]
    assert os.sched_getaffinity(0) == mine
    assert handler.close(timeout=60)


# A training process of its own: one window analysed, then an exit of each kind, the worker's pid on stdout.
_TRAINING = """
import os, signal, sys, time
from pathlib import Path
from tracekit.monitor.background import WindowAnalyses
run_dir, how = Path(sys.argv[1]), sys.argv[2]
analyses = WindowAnalyses(run_dir, 4, idle=False, wait_s=5)
analyses.submit(1)
assert analyses.wait(timeout=300) and analyses.analysed == [1], analyses.failed
print(analyses.worker_pid, flush=True)
if how == "in flight":
    analyses.submit(2)  # no traces: in flight until the worker gives up after wait_s
    while analyses.in_flight != 2:
        time.sleep(0.05)
if how == "forked child":  # a child that keeps the worker's pipe open and outlives us
    child = os.fork()
    if child == 0:
        # the test's stdout and stderr let go (else the test waits for this child to end),
        # the worker's pipes kept
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        time.sleep(120)
        os._exit(0)
    print(child, flush=True)
if how in ("killed", "forked child"):
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["normal", "in flight", "killed", "forked child"])
def test_the_worker_does_not_outlive_the_training(tmp_path, how):
    run_dir = tmp_path / "run"
    _traces_of(run_dir, 1)
    done = subprocess.run(
        [sys.executable, "-c", _TRAINING, str(run_dir), how], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    pids = [int(line) for line in done.stdout.split()]
    try:
        assert done.returncode == (-signal.SIGKILL if how in ("killed", "forked child") else 0), done.stderr
        worker = pids[0]
        # an idle worker goes at once; one in flight finishes its window (wait_s=5) first
        assert _until_gone(worker, 30 if how == "in flight" else 10), f"worker {worker} still runs"
        if how == "in flight":
            assert "window 2: 0 of 4 ranks' traces" in (run_dir / "monitor" / "worker.log").read_text()
    finally:
        for pid in pids[1:]:  # the forked child, which we started
            os.kill(pid, signal.SIGKILL)


def test_a_tracekit_folder_where_the_training_runs_does_not_stand_in_for_the_workers(tmp_path):
    """``python train.py`` finds tracekit by its path; the worker must find the same one, not
    a folder of that name in the working folder (``python -m`` would put it first)."""
    decoy = tmp_path / "work"
    (decoy / "tracekit" / "monitor").mkdir(parents=True)
    (decoy / "tracekit" / "__init__.py").write_text("raise ImportError('the decoy tracekit')\n")
    (decoy / "tracekit" / "monitor" / "__init__.py").write_text("")
    run_dir = tmp_path / "run"
    _traces_of(run_dir, 1)
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom tracekit.monitor.background import WindowAnalyses\n"
        "analyses = WindowAnalyses(Path(sys.argv[1]), 4, idle=False)\nanalyses.submit(1)\n"
        "assert analyses.wait(timeout=300) and analyses.close(timeout=60)\nprint(analyses.analysed, analyses.failed)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script), str(run_dir)], cwd=decoy, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.split("\n")[0] == "[1] []", done.stdout + done.stderr


# --------------------------------------------------------------------------------------
# the handler's options
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"sink": print}, "are for analyze=True"),
        ({"tensorboard": "logs"}, "are for analyze=True"),
        ({"analyze": True, "microbatches": [8, 0]}, "positive integers"),
        ({"analysis_cpus": [0]}, "are for analyze=True"),
        ({"analyze": True, "analysis_cpus": [-1]}, "CPU numbers"),
        ({"analyze": True, "analysis_cpus": [10_000]}, "this machine has CPUs 0-"),
    ],
)
def test_analysis_options_are_checked_when_the_handler_is_made(tmp_path, options, words):
    with pytest.raises(TracekitError, match=words):
        tracekit.trace_handler(tmp_path / "run", rank=0, **options)


def test_without_tensorboard_a_folder_asked_for_is_refused_and_the_default_is_left_out(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(TracekitError, match=r"needs the tensorboard package: pip install 'tracekit\[tensorboard\]'"):
        tracekit.trace_handler(tmp_path / "a", rank=0, analyze=True, tensorboard=tmp_path / "logs")
    caplog.set_level(logging.WARNING, logger="tracekit.monitor")
    handler = tracekit.trace_handler(tmp_path / "b", rank=0, analyze=True)
    assert handler.tensorboard is None and "no TensorBoard scalars while training" in caplog.text


def test_the_handler_and_monitor_import_neither_torch_nor_pandas():
    code = (
        "import sys, tempfile, tracekit\n"
        "h = tracekit.trace_handler(tempfile.mkdtemp(), rank=0, analyze=True)\n"
        "tracekit.Monitor(h.run_dir).latest()\n"
        "print(sorted({'torch', 'pandas', 'numpy'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize("module", ["tracekit.monitor", "tracekit.monitor.window", "tracekit.handler"])
def test_the_docstring_examples_run(module):
    import importlib

    found = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert found.failed == 0 and found.attempted > 0


def test_the_monitored_run_folder_still_analyses_without_options(live):
    run_dir, report, _ = live
    result = CliRunner().invoke(main, ["analyze", str(run_dir), "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {Path(f["path"]).parent.name for f in document["files"]} == {f"iteration_{WINDOWS[-1]}"}
    # the summaries, logs and event files beside the traces are no traces, and not even worth a warning
    assert not [w for w in document["warnings"] if "monitor" in w or "tensorboard" in w or "tfevents" in w]
