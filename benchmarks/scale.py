"""tracekit's time and memory as a pipeline job grows to thousands of ranks.

Each point is the real 4-rank ``sample_traces/1f1b`` capture laid out as N/4 data-parallel
replicas by ``make_input.build_pp`` (its 3 steps once, ~2.3 MB of Kineto JSON a rank: 1,024
ranks are 2.3 GB, 4,096 ranks 9.4 GB), analysed by ``tracekit analyze DIR --no-cache`` in its
own process. Measured from outside: the wall time, process start to exit, the CPU time of
the whole tree (user + system; on a shared machine it moves less than the wall time), and the peak of the
whole process tree's memory (RSS summed over the process and its children, and PSS, which
counts pages shared by forked workers once), polled every ``--poll`` seconds in the same run
(reading every process's memory map costs CPU; at 0.2 s that is well under 1% of a run).

Then a least-squares line through the points: ``wall = fixed + per_rank x ranks`` (and the
same for memory), with the constant and the slope printed and each point's distance from
the line, so whether growth is linear is read off the table, not assumed. Against the
target: 4,096 ranks in under 60 s and 2 GB.

Run: ``python benchmarks/scale.py`` (default 256, 512, 1024, 2048, 4096 ranks; each folder
is built, measured and removed before the next), ``--ranks 256,512`` for fewer, ``--gz`` for
.json.gz files, ``--json FILE`` to keep the figures.

``--gpu MB``: GPU (device-timeline) ranks instead, data-parallel copies of the real V100
trace (``shared/real-traces/kineto-gpu``, HTA's test data), each its first MB of JSON in time
order (``make_input.build_gpu(window=True)``: host ops, launches and kernels of one stretch
of the run). The 60 s / 2 GB target is the pipeline sample's; for GPU ranks the line's
value at 4,096 ranks is printed beside it.

``--generated-gpu-pipeline K``: a GENERATED GPU pipeline instead (not real: no real multi-rank
GPU pipeline trace is at hand), ``tests/gpu_tracegen.py``'s 4-rank 1F1B on NCCL with K kernels a
forward and 2K a backward, as N/4 data-parallel replicas (``make_input.build_generated_gpu_pipeline``):
the device pipeline path (actions' device spans, folded steps, SendRecv kernels) at scale.

Bytecode: with ``PYTHONDONTWRITEBYTECODE`` set (some containers set it), an editable
checkout compiles its ~60 modules on every start (~0.1 s); as :mod:`bench` does, the measured
processes run without it, so tracekit starts as an installed package does.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import make_input  # noqa: E402

try:
    import psutil
except ImportError:  # pragma: no cover - told to the user below
    psutil = None

TARGET_RANKS, TARGET_S, TARGET_MB = 4096, 60.0, 2000.0


@dataclass
class Point:
    ranks: int
    input_mb: float
    wall_s: float
    cpu_s: float
    rss_mb: float
    pss_mb: float
    build_s: float


def watched(cmd: list[str], poll_s: float) -> tuple[float, float, float, float]:
    """Run ``cmd`` once: its wall time, CPU time (user + system, its whole tree) and the peak
    summed RSS and PSS of its process tree."""
    errors = tempfile.TemporaryFile()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors)
    peak_rss, peak_pss = bench.watch_tree(proc, poll_s)
    wall = time.perf_counter() - started
    if proc.wait() != 0:
        errors.seek(0)
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{errors.read().decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak_rss / 1e6, peak_pss / 1e6


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def series(
    ranks: list[int],
    work: Path,
    gz: bool,
    poll_s: float,
    extra: list[str],
    gpu_mb: float | None = None,
    gpu_pipeline_kernels: int | None = None,
) -> list[Point]:
    print(
        f"{'ranks':>6} {'MB':>8} {'build s':>8} {'wall s':>8} {'ms/rank':>8} {'CPU s':>8} "
        f"{'peak RSS MB':>12} {'peak PSS MB':>12}"
    )
    points = []
    for n in ranks:
        folder = work / (f"generated_gpu_pp{n}" if gpu_pipeline_kernels else f"pp{n}")
        started = time.perf_counter()
        if gpu_pipeline_kernels:
            make_input.build_generated_gpu_pipeline(folder, ranks=n, kernels=gpu_pipeline_kernels)
        elif gpu_mb:
            make_input.build_gpu(folder, ranks=n, target_mb=gpu_mb, gz=gz, window=True)
        else:
            make_input.build_pp(folder, ranks=n, copies=1, gz=gz)
        build_s = time.perf_counter() - started
        mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        bench.wait_for_captures()  # a run being recorded would skew both
        cmd = [sys.executable, "-m", "tracekit", "analyze", str(folder), "--no-progress", "--no-cache", *extra]
        wall, cpu, rss, pss = watched(cmd, poll_s)
        shutil.rmtree(folder, ignore_errors=True)
        points.append(Point(n, mb, wall, cpu, rss, pss, build_s))
        print(
            f"{n:6d} {mb:8.0f} {build_s:8.1f} {wall:8.2f} {1000 * wall / n:8.2f} {cpu:8.2f} {rss:12.0f} {pss:12.0f}",
            flush=True,
        )
    return points


def report(points: list[Point]) -> dict:
    xs = [float(p.ranks) for p in points]
    out: dict = {"points": [asdict(p) for p in points]}
    if len(points) >= 2:
        for name, ys, unit, scale, per in (
            ("wall_s", [p.wall_s for p in points], "s", 1000, "ms a rank"),
            ("cpu_s", [p.cpu_s for p in points], "s", 1000, "ms a rank"),
            ("rss_mb", [p.rss_mb for p in points], "MB", 1000, "MB per 1,000 ranks"),
        ):
            a, b = fit(xs, ys)
            off = ", ".join(f"{int(x)}: {y - (a + b * x):+.1f}" for x, y in zip(xs, ys))
            print(f"linear fit {name}: {a:.2f} {unit} + {scale * b:.2f} {per} (point - line: {off})")
            out[f"fit_{name}"] = {"fixed": a, "per_rank": b}
        a, b = out["fit_wall_s"]["fixed"], out["fit_wall_s"]["per_rank"]
        ra, rb = out["fit_rss_mb"]["fixed"], out["fit_rss_mb"]["per_rank"]
        print(
            f"at {TARGET_RANKS} ranks the lines give {a + b * TARGET_RANKS:.1f} s and {ra + rb * TARGET_RANKS:.0f} MB "
            f"(target < {TARGET_S:.0f} s, < {TARGET_MB:.0f} MB)"
        )
    biggest = max(points, key=lambda p: p.ranks)
    if biggest.ranks == TARGET_RANKS:
        met = biggest.wall_s < TARGET_S and max(biggest.rss_mb, biggest.pss_mb) < TARGET_MB
        print(
            f"{TARGET_RANKS} ranks measured: {biggest.wall_s:.1f} s, {biggest.rss_mb:.0f} MB RSS, "
            f"{biggest.pss_mb:.0f} MB PSS: target {'met' if met else 'NOT met'}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ranks", default="256,512,1024,2048,4096", help="comma-separated rank counts (multiples of 4)"
    )
    parser.add_argument("--work-dir", type=Path, help="build the inputs here (default: a temporary folder)")
    parser.add_argument("--gz", action="store_true", help="write .json.gz files (default: .json)")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between memory readings")
    parser.add_argument("--jobs", type=int, help="tracekit --jobs (default: one per core)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--gpu", type=float, metavar="MB", help="GPU ranks: the real V100 trace, a time window of MB of JSON a rank"
    )
    parser.add_argument(
        "--generated-gpu-pipeline",
        type=int,
        metavar="K",
        help="GENERATED GPU pipeline ranks (tests/gpu_tracegen.py, not real), K kernels a forward",
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="measure even while a `tracekit capture` runs (figures noisier)"
    )
    args = parser.parse_args()
    bench.WAIT_FOR_CAPTURES = not args.no_wait
    bytecode = bench.bytecode_as_installed()
    if psutil is None:
        raise SystemExit("the benchmark needs psutil: pip install 'tracekit[bench]'")
    ranks = [int(r) for r in args.ranks.split(",")]
    from tracekit import __version__

    what = (
        f"a GENERATED 4-rank GPU 1F1B pipeline ({args.generated_gpu_pipeline} kernels a forward) as N/4 replicas"
        if args.generated_gpu_pipeline
        else f"the real V100 GPU trace, {args.gpu:g} MB a rank (time window)"
        if args.gpu
        else "sample_traces/1f1b as N/4 replicas"
    )
    print(
        f"tracekit {__version__}: {what}, analyze --no-cache; "
        f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
        f"load average {' '.join(f'{x:.1f}' for x in psutil.getloadavg())}"
    )
    if bytecode:
        print(bytecode)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tracekit-scale-"))
    try:
        extra = ["--jobs", str(args.jobs)] if args.jobs else []
        figures = report(series(ranks, work, args.gz, args.poll, extra, args.gpu, args.generated_gpu_pipeline))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
