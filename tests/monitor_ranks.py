"""A live 4-rank pipeline run analysed while it trains (tests/test_monitor.py, benchmarks/monitor_overhead.py).

``python tests/monitor_ranks.py OUT REPORT [--no-analyze] [--steps N] [--until-analysed S]
[--ranks-cpus 0 --analysis-cpus 1]``
spawns 4 ranks (gloo over 127.0.0.1) that train tracekit capture's emulated model
(``tracekit.capture.model``: real matmuls, real gloo P2P and SGD, each layer's cost set by
sleeps; 2 layers of 1 ms a stage) with torch.distributed.pipelining's Schedule1F1B, m=4,
under ``torch.profiler.profile(schedule=schedule(wait=4, warmup=1, active=2, repeat=R),
on_trace_ready=tracekit.trace_handler(OUT, schedule=sched, analyze=...))``: what a user puts
into a training script. Windows end at steps 7, 14, 21, ...

Rank 0 times every training step (``train_step`` and ``prof.step()``, the handler's work
included) and writes REPORT (JSON): the step times, and with the analysis: the step at which
``handler.monitor.latest()`` first gave a window, the TensorBoard scalars read back from the
event files at that moment (the training still running), the windows analysed and skipped,
what the handler's ``sink`` was given (step, scalars), the last ``suggest_microbatches()`` and
the CPU seconds of the analysis processes (rank 0's children). ``--until-analysed S``: keep training (unprofiled
steps) until the last profiled window is analysed, at most S seconds, then 3 steps more;
every rank stops at the same step (rank 0 decides, a broadcast tells the others).
``--ranks-cpus``: the ranks pinned to these cores; ``--analysis-cpus``: the handler's
``analysis_cpus`` (a core the training leaves free).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

P = 4
M = 4
CYCLE = 7  # wait 4 + warmup 1 + active 2: a window's traces are ready every 7 steps


def read_scalars(logdir: Path) -> dict[str, list[list[float]]]:
    """Every scalar in ``logdir``'s event files, by tag: [step, value] pairs (TensorBoard's own reader)."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def rank_main(
    rank: int,
    out: str,
    report: str,
    analyze: bool,
    windows: int,
    until_s: float,
    port: int,
    ranks_cpus: tuple[int, ...] = (),
    analysis_cpus: tuple[int, ...] = (),
) -> None:
    import os

    if ranks_cpus:
        os.sched_setaffinity(0, set(ranks_cpus))
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pp
    from torch import nn

    import tracekit
    from tracekit.capture.config import CaptureConfig
    from tracekit.capture.model import build_layers, build_stage_module, training_data
    from tracekit.capture.worker import train_step

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="rank %d: %%(message)s" % rank)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P, timeout=timedelta(seconds=300)
    )
    try:
        profiled_steps = windows * CYCLE
        cfg = CaptureConfig(
            schedule="1F1B", ranks=P, microbatches=M, layers=2 * P, layer_ms=1.0, steps=profiled_steps
        ).validate()
        layers = build_layers(cfg)
        stage = pp.PipelineStage(build_stage_module(cfg, rank, layers), rank, P, torch.device("cpu"))
        sched = pp.Schedule1F1B(stage, n_microbatches=M, loss_fn=nn.MSELoss())
        optimizer = torch.optim.SGD(list(stage.submod.parameters()), lr=1e-3)
        xs, ys = training_data(cfg)
        found: dict[str, Any] = {"step_s": [], "first_seen_step": None, "read_back": None, "sink": []}

        def sink(scalars: dict[str, float], step: int) -> None:  # what a W&B logger would be given
            found["sink"].append([step, scalars])

        options: dict[str, Any] = {"analyze": True, "sink": sink} if analyze else {}
        if analyze and analysis_cpus:
            options["analysis_cpus"] = analysis_cpus
        handler = tracekit.trace_handler(out, schedule=sched, **options)
        last_window = windows * CYCLE
        started = time.monotonic()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            record_shapes=True,
            schedule=torch.profiler.schedule(wait=4, warmup=1, active=2, repeat=windows),
            on_trace_ready=handler,
        ) as prof:
            step, stop_at = 0, None
            while stop_at is None or step < stop_at:
                t0 = time.perf_counter()
                train_step(sched, optimizer, xs[step % len(xs)], ys[step % len(ys)], rank == 0, rank == P - 1)
                prof.step()
                found["step_s"].append(time.perf_counter() - t0)
                step += 1
                decided = torch.zeros(1, dtype=torch.int64)
                if rank == 0 and stop_at is None and step >= last_window:
                    latest = handler.monitor.latest()
                    if analyze and latest is not None and found["first_seen_step"] is None:
                        found["first_seen_step"] = step
                        found["first_seen_window"] = latest["window"]
                        found["read_back"] = read_scalars(Path(out) / "tensorboard")
                    done = latest is not None and latest["window"] == last_window
                    if not analyze or done or time.monotonic() - started > until_s:
                        decided[0] = step + 3  # a few steps more: the training goes on after the read-back
                dist.broadcast(decided, 0)
                if stop_at is None and int(decided[0]):
                    stop_at = int(decided[0])
        if rank == 0:
            found["steps"] = step
            if analyze:
                found["all_analysed"] = handler.wait(timeout=300)
                found["analysed"], found["skipped"] = handler.analysed, handler.skipped
                found["suggested"] = handler.monitor.suggest_microbatches()
                found["latest_window"] = (handler.monitor.latest() or {}).get("window")
                # a tracekit without close() ran a process a window, each reaped when done
                getattr(handler, "close", lambda timeout: True)(timeout=60)
                # rank 0's only children are the analysis processes: their CPU, imports included
                usage = resource.getrusage(resource.RUSAGE_CHILDREN)
                found["analysis_cpu_s"] = usage.ru_utime + usage.ru_stime
            Path(report).write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp

    from tracekit.capture.runner import _free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("report")
    parser.add_argument("--no-analyze", dest="analyze", action="store_false")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--until-analysed", type=float, default=0.0, metavar="S")
    parser.add_argument("--ranks-cpus", default="", help="pin the ranks to these cores (comma-separated)")
    parser.add_argument("--analysis-cpus", default="", help="the analysis worker's cores (comma-separated)")
    args = parser.parse_args(argv)

    def cpus(text: str) -> tuple[int, ...]:
        return tuple(int(c) for c in text.split(",") if c)

    mp.spawn(
        rank_main,
        args=(
            args.out,
            args.report,
            args.analyze,
            args.windows,
            args.until_analysed,
            _free_port(),
            cpus(args.ranks_cpus),
            cpus(args.analysis_cpus),
        ),
        nprocs=P,
        join=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
