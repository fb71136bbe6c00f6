"""Does a runtime tuning of the command pay? ``tracekit analyze`` with and without it, in turn.

The ``tracekit`` command tunes its own process in ``tracekit/_lean.py`` (pandas without its
pyarrow string backend). Each variant here is the command as shipped with one tuning
switched off: the launcher replaces its entry point with a no-op before the command starts
(every variant imports the tuning modules first, so none pays an import the others do not).
Three more tunings were measured this way and removed, their gain below the noise
(benchmarks/README.md; ``git show 254a424:benchmarks/tuning_ab.py`` measures them).

Inputs and harness are the benchmark's (``bench.py``): 8 ranks of ~26 MB built by
``make_input.py``, ``analyze DIR --no-progress --no-cache``, bytecode as installed, a running
``tracekit capture`` waited for, wall time by ``perf_counter`` around the process. The
variants run in turn, ``--runs`` rounds (default 20), each round starting one variant later,
so a busy spell of the machine falls on all of them alike. Per variant: median and IQR of the
wall time, of the CPU time of the process and its workers (user + system, from ``wait4``)
and of the largest process' peak RSS; per tuning: the median of its rounds' differences
(off - on: what it saves) beside their IQR (the noise), and the rounds in which the
shipped command was faster (wall, CPU). ``--json FILE`` keeps every run.

Run: ``python benchmarks/tuning_ab.py`` (``--inputs gpu``, ``--runs 10``, ``--work-dir DIR``
to keep the inputs; see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import make_input  # noqa: E402

# What switches each tuning off: its entry point, called by tracekit.cli, made a no-op.
OFF = {"_lean": "tracekit._lean.pandas_without_pyarrow = lambda: None"}
VARIANTS = ("as shipped", *OFF)


def command(variant: str, run_dir: Path) -> list[str]:
    lines = ["import tracekit._lean"]
    if variant in OFF:
        lines.append(OFF[variant])
    lines.append("from tracekit.cli import run; run()")
    return [sys.executable, "-c", "\n".join(lines), "analyze", str(run_dir), "--no-progress", "--no-cache"]


def once(cmd: list[str]) -> tuple[float, float, float]:
    """Wall s, CPU s (user + system of the process and the workers it waited for), peak RSS MB."""
    bench.wait_for_captures()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd[3:])}\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def quartiles(values: list[float]) -> tuple[float, float]:
    """Median and interquartile range."""
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q3 - q1


def compare(name: str, run_dir: Path, variants: tuple[str, ...], runs: int) -> dict:
    figures: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    for _ in range(2):  # warm the page cache and the bytecode; not counted
        once(command(variants[0], run_dir))
    for round_ in range(runs):
        shift = round_ % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            figures[variant].append(once(command(variant, run_dir)))
        print(f"  round {round_ + 1}/{runs}", file=sys.stderr, end="\r")
    print(f"\n== {name}: {runs} rounds, the variants in turn ==")
    print(f"{'variant':<22}{'wall median (IQR) s':>22}{'CPU median (IQR) s':>22}{'peak RSS median (IQR) MB':>28}")
    for variant in variants:
        cells = []
        for i, fmt in ((0, "{:.3f} ({:.3f})"), (1, "{:.3f} ({:.3f})"), (2, "{:.0f} ({:.0f})")):
            cells.append(fmt.format(*quartiles([r[i] for r in figures[variant]])))
        print(f"{variant:<22}{cells[0]:>22}{cells[1]:>22}{cells[2]:>28}")
    print(
        f"\n{'tuning switched off':<22}{'saves wall (IQR) s':>22}{'saves CPU (IQR) s':>22}{'saves RSS (IQR) MB':>22}  wins wall, CPU"
    )
    shipped = figures["as shipped"]
    for variant in variants:
        if variant == "as shipped":
            continue
        cells = []
        for i, fmt in ((0, "{:+.3f} ({:.3f})"), (1, "{:+.3f} ({:.3f})"), (2, "{:+.0f} ({:.0f})")):
            # each round's own difference: off - on (positive: the module saves that much)
            cells.append(fmt.format(*quartiles([off[i] - on[i] for off, on in zip(figures[variant], shipped)])))
        wins = [sum(on[i] < off[i] for off, on in zip(figures[variant], shipped)) for i in (0, 1)]
        print(f"{variant:<22}{cells[0]:>22}{cells[1]:>22}{cells[2]:>22}  {wins[0]}/{runs}, {wins[1]}/{runs}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds of every variant (default 20)")
    parser.add_argument("--inputs", default="gpu,pp", help="gpu, pp or both (default gpu,pp)")
    parser.add_argument("--mb-per-rank", type=float, default=26.0)
    parser.add_argument("--gpu-trace", type=Path, default=make_input.GPU_TRACE, help="the real GPU trace to repeat")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which, comma-separated (default all)")
    parser.add_argument("--json", type=Path, help="also write every run (wall s, CPU s, peak RSS MB) to this file")
    parser.add_argument(
        "--work-dir", type=Path, help="build the inputs here and keep them (default: a temporary folder)"
    )
    args = parser.parse_args()
    variants = tuple(v.strip() for v in args.variants.split(","))
    if variants[0] != "as shipped" or any(v not in VARIANTS for v in variants):
        raise SystemExit(f"--variants: 'as shipped' first, then any of {', '.join(OFF)}")
    bytecode = bench.bytecode_as_installed()
    print(f"{os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if bytecode:
        print(bytecode)
    runs: dict[str, dict] = {}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tracekit-tuning-"))
    try:
        for kind in args.inputs.split(","):
            folder = work / f"{kind}8"
            if not folder.exists():
                if kind == "gpu":
                    make_input.build_gpu(folder, ranks=8, target_mb=args.mb_per_rank, source=args.gpu_trace)
                else:
                    make_input.build_pp(folder, ranks=8, copies=max(1, round(args.mb_per_rank / 2.3)))
            title = {"gpu": "GPU run (real 216k-event trace, per rank)", "pp": "pipeline run (1f1b sample)"}[kind]
            runs[kind] = compare(f"{title}, 8 ranks, {bench.folder_mb(folder):.0f} MB", folder, variants, args.runs)
        if args.json:
            args.json.write_text(json.dumps(runs, indent=1))
        print(f"\nload average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
