"""A run of many ranks analysed on a Dask ``LocalCluster``, the parse cache on storage the
workers share (a local folder stands in for it).

The input is built from real events (``make_input.py pp``: the 4-rank ``sample_traces/1f1b``
capture, its steps repeated ``--copies`` times, its ranks repeated as data-parallel
replicas). Each measurement runs in a fresh process: it starts the cluster, loads the run
through it (``executor="dask"``: each file parsed, cut to its working set and, with
``rows="reduce"``, reduced to its ranks' steps, actions and message rows on a worker),
analyses it in the client, and reports its wall time (load + analysis, cluster start
aside) and the peak memory, sampled every 50 ms, of the client process alone and of the
workers (their sum, and the largest). It runs first with an empty cache, then again with
the cache the first run filled; ``--rows analysis`` adds the same two runs with the
workers sending working sets (events) back instead, for the client's memory before the reduce.

    python benchmarks/dask_scale.py --ranks 1024 --copies 1 --workers 2
    python benchmarks/dask_scale.py --ranks 64 --rows reduce analysis      # quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent


class Watcher:
    """Peak RSS of this process, and of its child processes (the cluster's workers and
    their nannies), sampled every ``period_s`` in a thread."""

    def __init__(self, period_s: float = 0.05):
        self.period_s = period_s
        self.client_mb = 0.0
        self.workers_mb = 0.0
        self.largest_worker_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                self.client_mb = max(self.client_mb, me.memory_info().rss / 1e6)
                sizes = []
                for child in me.children(recursive=True):
                    try:
                        sizes.append(child.memory_info().rss / 1e6)
                    except psutil.Error:
                        continue
                self.workers_mb = max(self.workers_mb, sum(sizes))
                self.largest_worker_mb = max(self.largest_worker_mb, max(sizes, default=0.0))
            except psutil.Error:
                pass
            self._stop.wait(self.period_s)


def one_run(run_dir: Path, cache_dir: Path, rows: str, workers: int) -> dict:
    """Start a LocalCluster, load and analyse ``run_dir`` through it; the figures."""
    import logging

    from distributed import Client, LocalCluster

    from tracekit import LoadOptions, load
    from tracekit.analyze import analyze

    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    )
    client = Client(cluster)
    try:
        with Watcher() as watch:
            started = time.perf_counter()
            run = load(run_dir, LoadOptions(executor="dask", scheduler=client, cache_dir=str(cache_dir), rows=rows))
            loaded = time.perf_counter()
            analysis = analyze(run)
            done = time.perf_counter()
        return {
            "rows": rows,
            "load_s": loaded - started,
            "analyze_s": done - loaded,
            "total_s": done - started,
            "client_peak_mb": watch.client_mb,
            "workers_peak_mb": watch.workers_mb,
            "largest_worker_mb": watch.largest_worker_mb,
            "ranks": len(run.ranks),
            "events_in_client": len(run.events),
            "actions": len(run.actions),
            "messages": len(run.messages),
            "schedule": _schedule(run),
            "bubble_ratio": analysis.summary.bubble_ratio,
        }
    finally:
        client.close()
        cluster.close()


def _schedule(run) -> str:
    s = run.schedule
    return f"{s.name} p={s.p} v={s.v} m={s.m} x {s.replicas} replicas" if s is not None else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--copies", type=int, default=1, help="step repeats per rank (make_input.py pp)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (one thread each)")
    parser.add_argument("--rows", nargs="+", default=["reduce"], choices=["reduce", "analysis"])
    parser.add_argument("--work-dir", type=Path, help="keep the input and the cache here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--one", nargs=3, metavar=("RUN_DIR", "CACHE_DIR", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        figures = one_run(Path(args.one[0]), Path(args.one[1]), args.one[2], args.workers)
        print(json.dumps(figures))
        return
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tk-dask-"))
    run_dir = work / f"pp{args.ranks}x{args.copies}"
    try:
        if not run_dir.is_dir():
            sys.path.insert(0, str(HERE))
            from make_input import build_pp

            t = time.perf_counter()
            paths = build_pp(run_dir, args.ranks, args.copies)
            size = sum(p.stat().st_size for p in paths) / 1e6
            print(f"built {len(paths)} ranks, {size:.0f} MB of Kineto JSON, in {time.perf_counter() - t:.0f} s")
        size_mb = sum(p.stat().st_size for p in run_dir.iterdir()) / 1e6
        results = []
        for rows in args.rows:
            cache = work / f"cache-{rows}"
            shutil.rmtree(cache, ignore_errors=True)
            for phase in ("first (cache empty)", "again (cache filled)"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--workers",
                    str(args.workers),
                    "--one",
                    str(run_dir),
                    str(cache),
                    rows,
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
                if out.returncode != 0:
                    raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                figures["phase"] = phase
                results.append(figures)
        print(
            f"\n{args.ranks} ranks ({size_mb:.0f} MB), LocalCluster of {args.workers} worker processes x 1 thread, "
            f"cache in a local folder; {os.cpu_count()} cores here"
        )
        header = (
            "| rows | run | load | analyze | total | client peak | workers peak (sum / largest) | events in client |"
        )
        print(header)
        print("|---" * 8 + "|")
        for r in results:
            print(
                f"| {r['rows']} | {r['phase']} | {r['load_s']:.1f} s | {r['analyze_s']:.1f} s | {r['total_s']:.1f} s "
                f"| {r['client_peak_mb']:.0f} MB | {r['workers_peak_mb']:.0f} / {r['largest_worker_mb']:.0f} MB "
                f"| {r['events_in_client']:,} |"
            )
        first = results[0]
        print(
            f"\nschedule: {first['schedule']}; {first['actions']:,} actions, {first['messages']:,} messages, "
            f"bubble ratio {first['bubble_ratio']:.3f}"
        )
        if args.json:
            args.json.write_text(json.dumps({"ranks": args.ranks, "mb": size_mb, "results": results}, indent=1))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
