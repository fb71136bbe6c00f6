"""tracekit's device busy/idle beside HolisticTraceAnalysis's temporal breakdown, on the real
GPU traces in ../shared/real-traces/kineto-gpu.

    python benchmarks/hta_compare.py                                  # HTA in this Python
    python benchmarks/hta_compare.py --hta-python /tmp/hta-venv/bin/python

HTA runs in its own process (``hta_breakdown.py``), in whichever Python has it; without HTA
the script says so and exits 0. Each trace set is a folder of links to the shared files (read
in place): the two ``hta_trace_filter_sampled`` ranks together, the other GPU traces alone.

The figures are not the same quantity, and the columns say how far apart the definitions are:

* HTA: one span per rank, first to last GPU op it kept (ops launched by CPU events up to the
  end of the last ProfilerStep, ``include_last_profiler_step=True``; ops whose launch is not in
  the trace are dropped); idle = span - union of all GPU ops; compute = union of kernels that are
  neither NCCL nor memcpy/memset; non-compute = the rest. Integer microseconds.
* tracekit: per step, a window over all ranks (first to last compute op of the step), busy =
  union of the rank's compute ops of the step, memcpy/memset included, NCCL excluded; summed
  here over the steps. Ops of one step can overlap the next step's window (a GPU that runs
  behind the host on one stream and not on another), so the sums can exceed one span.
* "union": tracekit's compute ops (its definition) as one union over the whole trace, no steps.
* "HTA rules on tracekit's rows": HTA's compute definition applied to tracekit's own event
  table (with HTA's launch filter when tracekit kept the launches: "filter" yes/no). When it
  equals HTA's compute to within HTA's microsecond rounding, the gap between the first two is
  definitional, not a misread trace. On traces with fractional-microsecond times (the NCCL
  2.17.1 and MI250 ones) HTA rounds each op inward to whole microseconds (start up, end down:
  hta/common/trace_parser.py ``round_down_time_stamps``), so its compute comes out ~1 us per
  kernel short; on integer-microsecond traces the two agree to the microsecond.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KINETO_GPU = ROOT.parent / "shared" / "real-traces" / "kineto-gpu"
TRACE_SETS = {
    "sampled ranks 0+1 (A100?, 2 of 128)": [
        "hta_trace_filter_sampled_rank-0.json.gz",
        "hta_trace_filter_sampled_rank-1.json.gz",
    ],
    "A100 rank 0 of 16 (GPU ~160 ms behind)": ["hta_negative_queue_length_values_check_rank0.json.gz"],
    "V100 DDP rank 1 of 2": ["hta_df_index_resolver_df_index_resolver.json.gz"],
    "NCCL 2.17.1 rank 0 of 2": ["hta_nccl_parser_config_nccl_data.json.gz"],
    "MI250 ROCm": ["hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"],
}
# HTA's own patterns (hta/utils/utils.py): NCCL kernels, memory ops and syncs are not compute
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _has_hta(python: str) -> bool:
    return subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True).returncode == 0


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """tracekit's own union of intervals over their whole extent."""
    from tracekit.model.intervals import union_length

    return union_length(starts, ends, int(starts.min()), int(ends.max())) if len(starts) else 0


def tracekit_figures(folder: Path) -> dict[int, dict]:
    """Per rank: tracekit's device windows and busy summed over steps, and HTA's compute rule
    applied to tracekit's event rows."""
    from tracekit.analyze import analyze
    from tracekit import LoadOptions, load

    run = load(folder, LoadOptions(rows="all"))
    bubbles = analyze(run).bubbles
    events = run.events
    names = events["name"].astype(str)
    out = {}
    for rank, rows in bubbles.groupby("rank"):
        mine = events["rank"] == rank
        steps = mine & (events["cat"] == "user_annotation") & names.str.startswith("ProfilerStep#")
        last_step_end = int(events.loc[steps, "end_ns"].max())
        device = mine & events["on_gpu"] & events["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])
        ours = events[device & ~names.str.contains("nccl|rccl", case=False)]
        launches = mine & events["cat"].isin(["cuda_runtime", "cuda_driver", "runtime"])
        filtered = bool(launches.any())
        if filtered:  # HTA keeps the ops launched up to the end of the last step
            launched = events.loc[launches & (events["start_ns"] <= last_step_end), "correlation"]
            device &= events["correlation"].isin(set(launched))
        gpu = events[device]
        compute = gpu[~names[gpu.index].str.match(_HTA_NOT_COMPUTE) & (gpu["cat"] == "kernel")]
        out[int(rank)] = {
            "steps": len(rows),
            "windows_ns": int(rows["window_ns"].sum()),
            "busy_ns": int(rows["busy_ns"].sum()),
            "idle_ns": int(rows["idle_ns"].sum()),
            "span_ns": int(rows["window_end_ns"].max() - rows["window_start_ns"].min()),
            "union_ns": _union_ns(ours["start_ns"].to_numpy(), ours["end_ns"].to_numpy()),
            "hta_rule_filtered": filtered,
            "hta_rule_span_ns": int(gpu["end_ns"].max() - gpu["start_ns"].min()) if len(gpu) else 0,
            "hta_rule_compute_ns": _union_ns(compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy()),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hta-python",
        default=sys.executable,
        help="a Python that has HolisticTraceAnalysis installed (default: this one)",
    )
    args = parser.parse_args()
    if not KINETO_GPU.exists():
        print(f"skipped: {KINETO_GPU} is absent (the shared real traces are not beside this checkout)")
        return 0
    if not _has_hta(args.hta_python):
        print(
            f"skipped: HolisticTraceAnalysis is not importable by {args.hta_python}; install it in a venv "
            "of its own (python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install "
            "HolisticTraceAnalysis) and pass --hta-python /tmp/hta-venv/bin/python"
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="hta-compare-") as work:
        folders = {}
        for i, (label, files) in enumerate(TRACE_SETS.items()):
            folder = Path(work) / f"set{i}"
            folder.mkdir()
            for name in files:
                (folder / name).symlink_to(KINETO_GPU / name)
            folders[label] = folder
        done = subprocess.run(
            [args.hta_python, str(ROOT / "benchmarks" / "hta_breakdown.py"), *map(str, folders.values())],
            capture_output=True,
            text=True,
            check=True,
        )
        hta = json.loads(done.stdout.strip().splitlines()[-1])
        ms = 1e-6
        print("all figures in ms; tracekit sums over its steps; HTA is one span per rank (see the docstring)")
        print(
            f"{'trace set':40} {'rank':>4} | {'HTA span':>9} {'idle':>9} {'compute':>9} {'non-comp':>9} | "
            f"{'tk steps':>8} {'windows':>9} {'busy':>9} {'idle':>9} {'span':>9} {'union':>9} | "
            f"{'HTA rules: filter':>17} {'span':>9} {'compute':>9} {'- HTA us':>8}"
        )
        for label, folder in folders.items():
            theirs = hta[str(folder)]
            ours = tracekit_figures(folder)
            if isinstance(theirs, dict):
                print(f"{label:40} HTA failed: {theirs['error']}")
                continue
            for row in theirs:
                tk = ours.get(row["rank"])
                if tk is None:
                    print(f"{label:40} {row['rank']:>4} | tracekit has no device rows for this rank")
                    continue
                diff_us = tk["hta_rule_compute_ns"] / 1000 - row["compute_us"]
                print(
                    f"{label:40} {row['rank']:>4} | {row['kernel_us'] / 1000:9.3f} {row['idle_us'] / 1000:9.3f} "
                    f"{row['compute_us'] / 1000:9.3f} {row['non_compute_us'] / 1000:9.3f} | "
                    f"{tk['steps']:>8} {tk['windows_ns'] * ms:9.3f} {tk['busy_ns'] * ms:9.3f} "
                    f"{tk['idle_ns'] * ms:9.3f} {tk['span_ns'] * ms:9.3f} {tk['union_ns'] * ms:9.3f} | "
                    f"{'yes' if tk['hta_rule_filtered'] else 'no':>17} {tk['hta_rule_span_ns'] * ms:9.3f} "
                    f"{tk['hta_rule_compute_ns'] * ms:9.3f} {diff_us:8.1f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
