"""What keeps tracekit usable at thousands of ranks, checked on small real runs.

The multi-replica fixture is the project's real 1F1B sample laid out as a DP x PP job by the
benchmark's input builder (``benchmarks/make_input.py``): real events, replicated.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, SAMPLES
from tracekit import LoadOptions, load
from tracekit.analyze import analyze, attribution

sys.path.insert(0, str(ROOT / "benchmarks"))
import make_input  # noqa: E402


def test_comm_blame_stays_inside_each_replica(tmp_path, monkeypatch):
    """A rank that no replayed link helps shares its comm among its own replica's links, not
    every link of the job (which at 4,096 ranks was a row per rank and link)."""
    folder = tmp_path / "1f1b_x3"
    make_input.build_pp(folder, ranks=12, copies=1, sample="1f1b")
    # one link replayed per step: most ranks take the fallback
    monkeypatch.setattr(attribution, "MAX_BLAME_REPLAYS", 1)
    result = analyze(load(folder, LoadOptions(jobs=1, rows="analysis")))
    links = result.attribution.link_blame
    assert len(links) and (links["comm_ns"] > 0).all()
    replica = links["rank"] // 4
    assert ((links["src_rank"] // 4 == replica) & (links["dst_rank"] // 4 == replica)).all()
    # all three replicas get their comm blamed, each on its own links
    assert set(replica) == {0, 1, 2}


def _tracekit(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_the_command_line_imports_no_pandas_or_plotting():
    """`tracekit --help` (and any command's start) must not pay for pandas, holoviews, bokeh
    or jinja2: those load on the paths that use them."""
    code = (
        "import sys, tracekit.cli; "
        "print(' '.join(m for m in ('pandas', 'holoviews', 'bokeh', 'jinja2', 'pyarrow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_a_cached_analysis_imports_no_pandas(tmp_path):
    """The second analysis of an unchanged run is answered from the cache without
    importing pandas (0.3 s and more of a cached start)."""
    cache = tmp_path / "cache"
    first = _tracekit("analyze", str(SAMPLES / "1f1b"), "--cache-dir", str(cache), "--no-progress", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tracekit.cli", "analyze", str(SAMPLES / "1f1b")]
        + ["--cache-dir", str(cache), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert second.returncode == 0 and second.stdout == first.stdout
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in second.stderr.splitlines() if line.startswith("import time")
    }
    assert "tracekit.ingest.cache" in imported  # the log is read right, and the cache was
    assert "pandas" not in imported and "tracekit.reconstruct" not in imported


def test_long_steps_after_loading_report_progress_on_stderr_only(tmp_path):
    """With --progress, the replays of each step, the diagnosis and (whatif, report) each
    target's replays are announced on stderr; --json stdout stays one JSON document."""
    run = str(SAMPLES / "1f1b")
    analysed = _tracekit("analyze", run, "--no-cache", "--progress", "--json", cwd=tmp_path)
    assert analysed.returncode == 0, analysed.stderr
    json.loads(analysed.stdout)  # nothing but the document
    # the three small steps side by side, in one walk (analyze.replay.replay_steps)
    assert "tracekit: attribution: replaying steps 2-4 (1-3 of 3, 192 actions)" in analysed.stderr
    assert "tracekit: diagnosing" in analysed.stderr
    quiet = _tracekit("analyze", run, "--no-cache", "--no-progress", "--json", cwd=tmp_path)
    assert quiet.stdout == analysed.stdout and "tracekit:" not in quiet.stderr
    whatif = _tracekit("whatif", run, "--no-cache", "--progress", "-s", "1F1B", "-m", "8", "-m", "16", "--json")
    assert whatif.returncode == 0, whatif.stderr
    json.loads(whatif.stdout)
    assert "what-if: 1F1B v=1 m=8 (1 of 2" in whatif.stderr and "what-if: 1F1B v=1 m=16 (2 of 2" in whatif.stderr
    report = _tracekit("report", run, "--no-cache", "--progress", "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "tracekit: what-if: " in report.stderr and "tracekit: rendering the report" in report.stderr


def test_parser_workers_fork_before_pandas_is_loaded(tmp_path):
    """Workers fork while the parent has no pandas, so each stays small (read_run imported
    the run model, and with it pandas, before parsing)."""
    code = (
        "import os, sys\n"
        "real = os.fork\n"
        "def fork():\n"
        "    print('pandas' if 'pandas' in sys.modules else 'lean', file=sys.stderr)\n"
        "    return real()\n"
        "os.fork = fork\n"
        "from tracekit.cli import main\n"
        "main(sys.argv[1:], standalone_mode=False)\n"
    )
    args = ["analyze", str(SAMPLES / "1f1b"), "--no-cache", "--no-progress", "--jobs", "2"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    forks = [line for line in done.stderr.splitlines() if line in ("pandas", "lean")]
    assert forks and set(forks) == {"lean"}
