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
without). The variants alternate, each round starting with another one, so a busy spell of
the machine falls on each alike.

CPU: per run the CPU seconds of the whole process tree (the 4 ranks, the spawner and the
analysis processes, each reaped: ``getrusage(RUSAGE_CHILDREN)``; on a busy machine it moves
by a second or more between runs), and the analysis processes' own (rank 0's children,
reaped before it reports: imports included) over the windows analysed; with this tree's
worker also its CPU seconds a window after its imports (``analysis_cpu_s`` of the summaries).

``--baseline-tree PATH`` adds a third variant, "with analysis, PATH": the same ranks script
with another checkout's tracekit (e.g. the ``main`` before a change), in the same rounds.

``--spare-core``: a machine where the training leaves a core free (a GPU node's usual case),
made on this one: every rank pinned to the cores but the last (both variants), the analysis
worker to the last (``trace_handler(..., analysis_cpus=[last])``).

Run: ``python benchmarks/monitor_overhead.py`` (``--rounds 5``, ``--windows 4``,
``--json FILE``, ``--baseline-tree PATH``, ``--spare-core``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANKS_SCRIPT = ROOT / "tests" / "monitor_ranks.py"
FIRST_WINDOW = 7  # monitor_ranks.CYCLE: the first window's traces are ready after step 7
WITHOUT, WITH = "without analysis", "with analysis"


def _tree_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(variant: str, windows: int, work: Path, tree: Path | None, spare_core: bool = False) -> dict[str, object]:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    report = run_dir.with_suffix(".json")
    command = [sys.executable, str(RANKS_SCRIPT), str(run_dir), str(report), "--windows", str(windows)]
    if variant == WITHOUT:
        command.append("--no-analyze")
    if spare_core:
        last = (os.cpu_count() or 2) - 1
        command += ["--ranks-cpus", ",".join(str(c) for c in range(last)), "--analysis-cpus", str(last)]
    env = dict(os.environ, PYTHONPATH=str(tree or ROOT))
    started, cpu_before = time.perf_counter(), _tree_cpu_s()
    # run where that tracekit lies: an older one starts its analysis by "python -m", cwd first
    done = subprocess.run(command, cwd=tree or ROOT, env=env, capture_output=True, text=True, timeout=900)
    cpu_s = _tree_cpu_s() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"{variant}: the run failed:\n{done.stderr[-3000:]}")
    found = json.loads(report.read_text())
    after_first = found["step_s"][FIRST_WINDOW:]
    summaries = [json.loads(p.read_text()) for p in sorted((run_dir / "monitor").glob("window_*.json"))]
    worker_cpu = [float(s["analysis_cpu_s"]) for s in summaries if "analysis_cpu_s" in s]
    return {
        "variant": variant,
        "median_step_ms": statistics.median(after_first) * 1e3,
        "steps": len(after_first),
        "analysed": found.get("analysed", []),
        "skipped": found.get("skipped", []),
        "tree_cpu_s": cpu_s,
        "analysis_cpu_s": found.get("analysis_cpu_s"),
        "worker_cpu_s_a_window": statistics.median(worker_cpu) if worker_cpu else None,
        "wall_s": time.perf_counter() - started,
    }


def spread(values: list[float], digits: int = 1) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{min(values):.{digits}f}..{max(values):.{digits}f} (IQR {q3 - q1:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant (default 5)")
    parser.add_argument("--windows", type=int, default=4, help="profiled windows a run (default 4)")
    parser.add_argument("--json", type=Path, help="keep every run's figures in this file")
    parser.add_argument("--baseline-tree", type=Path, help="also with analysis by this checkout's tracekit")
    parser.add_argument(
        "--spare-core", action="store_true", help="ranks on every core but the last, the analysis on the last"
    )
    args = parser.parse_args()
    if args.spare_core and ((os.cpu_count() or 1) < 2 or args.baseline_tree):
        parser.error("--spare-core needs 2 cores or more, and no --baseline-tree (an older tracekit cannot pin)")
    trees: dict[str, Path | None] = {WITHOUT: None, WITH: None}
    if args.baseline_tree:
        trees[f"{WITH}, {args.baseline_tree}"] = args.baseline_tree.resolve()
    variants = list(trees)
    runs: list[dict[str, object]] = []
    print(
        f"load average at the start: {os.getloadavg()}"
        + (" (ranks on every core but the last, the analysis on the last)" if args.spare_core else ""),
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tracekit-monitor-bench-") as work:
        for round_no in range(args.rounds):
            order = variants[round_no % len(variants) :] + variants[: round_no % len(variants)]
            for variant in order:
                run = one_run(variant, args.windows, Path(work), trees[variant], args.spare_core)
                run["round"] = round_no
                runs.append(run)
                print(
                    f"round {round_no + 1}/{args.rounds} {variant:30} median step {run['median_step_ms']:.1f} ms "
                    f"over {run['steps']} steps, tree CPU {run['tree_cpu_s']:.1f} s "
                    f"(analysed {run['analysed']}, skipped {run['skipped']}; load {os.getloadavg()[0]:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
    width = max(len(v) for v in variants) + 2
    by_variant = {v: [r for r in runs if r["variant"] == v] for v in variants}
    medians = {v: [float(str(r["median_step_ms"])) for r in by_variant[v]] for v in variants}
    print(f"\nstep time after the first window, ms (median of each run's median; spread over {args.rounds} runs)")
    print(f"  {'':{width}} {'median':>8}  spread")
    for variant in variants:
        print(f"  {variant:{width}} {statistics.median(medians[variant]):8.1f}  {spread(medians[variant])}")
    for variant in variants[1:]:
        differences = [w - wo for w, wo in zip(medians[variant], medians[WITHOUT])]
        label = f"{variant} - without"
        print(f"  {label:{width}} {statistics.median(differences):8.1f}  {spread(differences)}  (per round)")
    print("\nCPU seconds: the process tree; the analysis processes a window analysed (imports included)")
    cpu = {v: [float(str(r["tree_cpu_s"])) for r in by_variant[v]] for v in variants}
    for variant in variants:
        line = f"  {variant:{width}} tree {statistics.median(cpu[variant]):6.1f} s  {spread(cpu[variant])}"
        if variant != WITHOUT:
            per_window = [
                float(str(r["analysis_cpu_s"])) / len(analysed)
                for r in by_variant[variant]
                if (analysed := r["analysed"]) and isinstance(analysed, list)
            ]
            line += f";  analysis a window {statistics.median(per_window):5.2f} s  {spread(per_window, 2)}"
        worker = [float(str(r["worker_cpu_s_a_window"])) for r in by_variant[variant] if r["worker_cpu_s_a_window"]]
        if worker:
            line += f";  after the imports {statistics.median(worker):5.2f} s"
        print(line)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
