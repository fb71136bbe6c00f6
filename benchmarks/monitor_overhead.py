"""Does analysing the windows while training slow the training step? The same live run with
``trace_handler(..., analyze=True)`` and without it, in turn.

Each run is ``tests/monitor_ranks.py``: 4 ranks of torch.distributed.pipelining (Schedule1F1B,
m=4, gloo on this machine's CPUs, tracekit capture's emulated model), profiled through
``tracekit.trace_handler`` in windows of 2 steps every 7 steps (``--windows`` of them), both
variants writing the same traces; with the analysis, rank 0's handler also has each window
analysed in the background, so every step after the first window trains while an analysis
runs or waits. Rank 0 times each training step (``train_step`` and ``prof.step()``, the
handler's own work inside). Per run: the median step time over the steps after the first
window (where an analysis can be in flight); per variant: the median and the spread (min to
max, and IQR) of those run medians, side by side, and per round the difference (with minus
without). The variants alternate, each round starting with the other one, so a busy spell of
the machine falls on both alike.

Run: ``python benchmarks/monitor_overhead.py`` (``--rounds 5``, ``--windows 4``, ``--json FILE``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS_SCRIPT = ROOT / "tests" / "monitor_ranks.py"
FIRST_WINDOW = 7  # monitor_ranks.CYCLE: the first window's traces are ready after step 7
VARIANTS = ("without analysis", "with analysis")


def one_run(variant: str, windows: int, work: Path) -> dict[str, object]:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    report = run_dir.with_suffix(".json")
    command = [sys.executable, str(RANKS_SCRIPT), str(run_dir), str(report), "--windows", str(windows)]
    if variant == "without analysis":
        command.append("--no-analyze")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{variant}: the run failed:\n{done.stderr[-3000:]}")
    found = json.loads(report.read_text())
    after_first = found["step_s"][FIRST_WINDOW:]
    return {
        "variant": variant,
        "median_step_ms": statistics.median(after_first) * 1e3,
        "steps": len(after_first),
        "analysed": found.get("analysed", []),
        "skipped": found.get("skipped", []),
        "wall_s": time.perf_counter() - started,
    }


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.1f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{min(values):.1f}..{max(values):.1f} (IQR {q3 - q1:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant (default 5)")
    parser.add_argument("--windows", type=int, default=4, help="profiled windows a run (default 4)")
    parser.add_argument("--json", type=Path, help="keep every run's figures in this file")
    args = parser.parse_args()
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="tracekit-monitor-bench-") as work:
        for round_no in range(args.rounds):
            order = VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                run = one_run(variant, args.windows, Path(work))
                run["round"] = round_no
                runs.append(run)
                print(
                    f"round {round_no + 1}/{args.rounds} {variant:17} median step {run['median_step_ms']:.1f} ms "
                    f"over {run['steps']} steps (analysed {run['analysed']}, skipped {run['skipped']})",
                    file=sys.stderr,
                    flush=True,
                )
    medians = {v: [float(str(r["median_step_ms"])) for r in runs if r["variant"] == v] for v in VARIANTS}
    print(f"\nstep time after the first window, ms (median of each run's median; spread over {args.rounds} runs)")
    print(f"  {'':20} {'median':>8}  spread")
    for variant in VARIANTS:
        print(f"  {variant:20} {statistics.median(medians[variant]):8.1f}  {spread(medians[variant])}")
    differences = [w - wo for w, wo in zip(medians["with analysis"], medians["without analysis"])]
    print(f"  {'with - without':20} {statistics.median(differences):8.1f}  {spread(differences)}  (per round)")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
