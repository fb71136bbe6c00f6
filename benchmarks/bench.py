"""tracekit vs HolisticTraceAnalysis on the same large multi-rank input, side by side.

Builds the inputs in a temporary folder (see ``make_input.py``: real traces, repeated), then
runs each tool as its own process and measures it from outside: wall time, and the peak
memory of its whole process tree (the sum of RSS over the process and its children, polled
every 20 ms; PSS beside it, which counts pages shared between forked processes once).

- tracekit: ``tracekit analyze DIR`` - the full analysis (parse, reconstruct, attribute,
  print), with no cache, then twice with an empty cache (the second run reads it).
- HTA: ``TraceAnalysis(trace_dir=DIR)`` - loading only, HTA's own parallel parser
  (``hta_load.py``), run with the Python that has HTA installed (``--hta-python``).

Each command runs twice: alone for its wall time, then watched for its memory.

Then the growth of tracekit's time and memory with the number of ranks and with the
events per rank. Run: ``python benchmarks/bench.py --hta-python /path/to/venv-hta/bin/python``
(see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_input  # noqa: E402

try:
    import psutil
except ImportError:  # pragma: no cover - told to the user below
    psutil = None


@dataclass
class Measure:
    wall_s: float
    rss_mb: float
    pss_mb: float
    out: str

    def mb_per_s(self, input_mb: float) -> float:
        return input_mb / self.wall_s


def wait_for_captures() -> None:
    """Recording a run is timing-sensitive and would skew the figures: wait it out."""
    while True:
        found = subprocess.run(["pgrep", "-f", "tracekit.* capture"], capture_output=True, text=True)
        others = [p for p in found.stdout.split() if int(p) != os.getpid()]
        if not others:
            return
        print("  (waiting for a running `tracekit capture` to finish)", file=sys.stderr)
        time.sleep(30)


def measure(cmd: list[str], before=None) -> Measure:
    """Run ``cmd`` twice: once alone for its wall time, once watched for the peak memory of
    its process tree (reading every process's memory map takes CPU from the run itself).
    ``before`` runs ahead of each of the two (to empty a cache, so both runs see the same state)."""
    wait_for_captures()
    if before:
        before()
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr.decode()[-2000:]}")
    if before:
        before()
    rss, pss = _peak_memory(cmd)
    return Measure(wall, rss, pss, done.stdout.decode())


def _peak_memory(cmd: list[str]) -> tuple[float, float]:
    """Peak of the summed RSS and of the summed PSS over the process and its children."""
    wait_for_captures()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    while proc.poll() is None:
        rss = pss = 0
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                info = p.memory_full_info()
            except psutil.Error:
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.02)
    proc.wait()
    return peak_rss / 1e6, peak_pss / 1e6


def tracekit_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tracekit.cli", "analyze", str(run_dir), "--no-progress", *extra]


def tracekit_load_cmd(run_dir: Path) -> list[str]:
    """Loading only, what HTA's TraceAnalysis does: parse every rank into tables."""
    code = "import sys; from tracekit.ingest import read_run; read_run(sys.argv[1])"
    return [sys.executable, "-c", code, str(run_dir)]


def folder_mb(run_dir: Path) -> float:
    return sum(p.stat().st_size for p in run_dir.iterdir()) / 1e6


def hta_works(python: str) -> str | None:
    probe = subprocess.run(
        [python, "-c", "import hta, importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def side_by_side(name: str, run_dir: Path, hta_python: str | None, cache_root: Path) -> dict:
    mb = folder_mb(run_dir)
    n_files = len(list(run_dir.iterdir()))
    print(f"\n== {name}: {n_files} ranks, {mb:.1f} MB of JSON ({mb / n_files:.1f} MB a rank) ==")
    rows: list[tuple[str, Measure]] = []
    hta = None
    if hta_python:
        hta = measure([hta_python, str(HERE / "hta_load.py"), str(run_dir)])
        rows.append(("HTA TraceAnalysis (load only)", hta))
    cold = measure(tracekit_cmd(run_dir, "--no-cache"))
    rows.append(("tracekit analyze (full, no cache)", cold))
    cache = cache_root / name
    # Emptied before each of its two runs: the memory run must not find the first run's cache.
    first = measure(
        tracekit_cmd(run_dir, "--cache-dir", str(cache)), before=lambda: shutil.rmtree(cache, ignore_errors=True)
    )
    rows.append(("tracekit analyze (empty cache)", first))
    warm = measure(tracekit_cmd(run_dir, "--cache-dir", str(cache)))
    rows.append(("tracekit analyze (cache filled)", warm))
    serial = measure(tracekit_cmd(run_dir, "--no-cache", "--jobs", "1"))
    rows.append(("tracekit analyze (no cache, 1 job)", serial))
    load = measure(tracekit_load_cmd(run_dir))
    rows.append(("tracekit load only, all rows", load))
    print(f"{'tool':38} {'wall s':>7} {'peak RSS MB':>12} {'peak PSS MB':>12} {'MB/s':>7}")
    for label, m in rows:
        print(f"{label:38} {m.wall_s:7.2f} {m.rss_mb:12.0f} {m.pss_mb:12.0f} {m.mb_per_s(mb):7.1f}")
    result = {
        "input_mb": mb,
        "ranks": n_files,
        "tracekit_s": cold.wall_s,
        "tracekit_rss_mb": cold.rss_mb,
        "tracekit_pss_mb": cold.pss_mb,
        "second_run_s": warm.wall_s,
        "cache_mb": _du(cache),
    }
    print(f"cache: {result['cache_mb']:.1f} MB for {mb:.0f} MB of traces; second analysis {warm.wall_s:.2f} s")
    if hta:
        info = json.loads(hta.out.strip().splitlines()[-1])
        speed = hta.wall_s / cold.wall_s
        rss, pss = cold.rss_mb / hta.rss_mb, cold.pss_mb / hta.pss_mb
        print(f"HTA's load inside its process: {info['load_s']:.2f} s for {info['rows']} rows of {info['ranks']} ranks")
        print(
            f"ratios: tracekit full analysis is {speed:.1f}x faster than HTA's load (target >= 5x: "
            f"{'met' if speed >= 5 else 'NOT met'}); peak memory {rss:.2f} of HTA's by RSS, {pss:.2f} by PSS "
            f"(target <= 0.33: {'met' if max(rss, pss) <= 1 / 3 else 'met by PSS only' if pss <= 1 / 3 else 'NOT met'})"
        )
        print(
            f"        tracekit's loading alone (what HTA's figure covers) is {hta.wall_s / load.wall_s:.1f}x "
            f"faster, at {load.rss_mb / hta.rss_mb:.2f} of its memory (RSS)"
        )
        result.update(
            hta_s=hta.wall_s,
            hta_rss_mb=hta.rss_mb,
            hta_pss_mb=hta.pss_mb,
            speedup=speed,
            rss_ratio=rss,
            pss_ratio=pss,
            load_s=load.wall_s,
            load_rss_mb=load.rss_mb,
        )
    print(
        f"second analysis of the unchanged run: {warm.wall_s:.2f} s (target <= 1 s: "
        f"{'met' if warm.wall_s <= 1 else 'NOT met'})"
    )
    return result


def _du(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6 if folder.exists() else 0.0


def growth(title: str, points: list[tuple[str, Path]]) -> list[dict]:
    print(f"\n-- {title} (tracekit analyze, no cache) --")
    print(f"{'point':16} {'MB':>7} {'wall s':>7} {'s per 100 MB':>13} {'peak RSS MB':>12} {'peak PSS MB':>12}")
    out = []
    for label, run_dir in points:
        mb = folder_mb(run_dir)
        m = measure(tracekit_cmd(run_dir, "--no-cache"))
        print(f"{label:16} {mb:7.1f} {m.wall_s:7.2f} {100 * m.wall_s / mb:13.2f} {m.rss_mb:12.0f} {m.pss_mb:12.0f}")
        out.append({"point": label, "mb": mb, "wall_s": m.wall_s, "rss_mb": m.rss_mb, "pss_mb": m.pss_mb})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hta-python",
        default=os.environ.get("HTA_PYTHON", sys.executable),
        help="a Python with HolisticTraceAnalysis installed (default: $HTA_PYTHON, else this one)",
    )
    parser.add_argument(
        "--work-dir", type=Path, help="build the inputs here (default: a temporary folder, removed after)"
    )
    parser.add_argument("--mb-per-rank", type=float, default=26.0)
    parser.add_argument("--quick", action="store_true", help="the side-by-side tables only, no growth series")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if psutil is None:
        raise SystemExit("the benchmark needs psutil: pip install 'tracekit[bench]'")
    version = hta_works(args.hta_python)
    if version is None:
        print(
            f"HTA is not importable by {args.hta_python}: the HTA column is left out "
            "(pip install HolisticTraceAnalysis==0.5.0 into some venv and pass --hta-python)",
            file=sys.stderr,
        )
    from tracekit import __version__

    print(
        f"tracekit {__version__} vs HolisticTraceAnalysis {version or '(absent)'}; "
        f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}"
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tracekit-bench-"))
    hta_python = args.hta_python if version else None
    try:
        figures: dict = {}
        mb = args.mb_per_rank
        pp8 = work / "pp8"
        # 1f1b's steps are ~2.3 MB a rank: repeat them to ~mb a rank.
        make_input.build_pp(pp8, ranks=8, copies=max(1, round(mb / 2.3)))
        gpu8 = work / "gpu8"
        make_input.build_gpu(gpu8, ranks=8, target_mb=mb)
        figures["pp8"] = side_by_side("pipeline run (1f1b sample, steps repeated)", pp8, hta_python, work / "cache")
        figures["gpu8"] = side_by_side("GPU run (real 216k-event trace, per rank)", gpu8, hta_python, work / "cache")
        if not args.quick:
            ranks = []
            for n in (2, 4, 8, 16):
                folder = work / f"gpu-ranks-{n}"
                make_input.build_gpu(folder, ranks=n, target_mb=mb)
                ranks.append((f"{n} ranks", folder))
            figures["growth_ranks"] = growth(f"growth in ranks, {mb:.0f} MB a rank (GPU trace)", ranks)
            for folder in (f for _, f in ranks):
                shutil.rmtree(folder, ignore_errors=True)
            sizes = []
            for per_rank in (mb / 4, mb / 2, mb, 2 * mb):
                folder = work / f"gpu-size-{per_rank:.0f}"
                make_input.build_gpu(folder, ranks=8, target_mb=per_rank)
                sizes.append((f"{per_rank:.1f} MB/rank", folder))
            figures["growth_events"] = growth("growth in events per rank, 8 ranks (GPU trace)", sizes)
            for folder in (f for _, f in sizes):
                shutil.rmtree(folder, ignore_errors=True)
            steps = []
            for copies in (3, 6, 11, 22):
                folder = work / f"pp-steps-{copies}"
                make_input.build_pp(folder, ranks=8, copies=copies)
                steps.append((f"{3 * copies} steps", folder))
            figures["growth_steps"] = growth("growth in steps per rank, 8 ranks (pipeline run)", steps)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
