"""A small live pipeline run profiled through ``tracekit.trace_handler`` (tests/test_trace_handler.py).

``python tests/handler_ranks.py OUT SCHEDULE P V M`` spawns P ranks (gloo over 127.0.0.1)
that train tracekit capture's emulated model (``tracekit.capture.model``: real matmuls, real
gloo P2P and SGD, each layer's cost set by sleeps) with a torch.distributed.pipelining
schedule, under ``torch.profiler.profile(..., on_trace_ready=tracekit.trace_handler(OUT,
schedule=sched))``: what a user puts into a training script.
"""

from __future__ import annotations

import sys
from datetime import timedelta


def rank_main(rank: int, out: str, schedule: str, p: int, v: int, m: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as pp
    from torch import nn

    import tracekit
    from tracekit.capture.config import SCHEDULES, SINGLE_STAGE, CaptureConfig
    from tracekit.capture.model import build_layers, build_stage_module, training_data
    from tracekit.capture.worker import train_step

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p, timeout=timedelta(seconds=120)
    )
    try:
        # 1 ms per layer and 2 layers per stage: actions of a few ms, a run of well under a second
        cfg = CaptureConfig(
            schedule=schedule, ranks=p, microbatches=m, stages_per_rank=v, layers=2 * p * v, layer_ms=1.0, steps=2
        ).validate()
        layers = build_layers(cfg)
        stages = [
            pp.PipelineStage(build_stage_module(cfg, s, layers), s, cfg.n_stages, torch.device("cpu"))
            for s in cfg.stages_of_rank(rank)
        ]
        cls = getattr(pp, SCHEDULES[cfg.schedule])
        sched = cls(stages[0] if cfg.schedule in SINGLE_STAGE else stages, n_microbatches=m, loss_fn=nn.MSELoss())
        optimizer = torch.optim.SGD([w for st in stages for w in st.submod.parameters()], lr=1e-3)
        first, last = 0 in cfg.stages_of_rank(rank), cfg.n_stages - 1 in cfg.stages_of_rank(rank)
        xs, ys = training_data(cfg)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            record_shapes=True,
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=cfg.steps, repeat=1),
            on_trace_ready=tracekit.trace_handler(out, schedule=sched),
        ) as prof:
            for step in range(cfg.steps + 2):
                train_step(sched, optimizer, xs[step], ys[step], first, last)
                prof.step()
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp

    from tracekit.capture.runner import _free_port

    out, schedule, p, v, m = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    mp.spawn(rank_main, args=(out, schedule, p, v, m, _free_port()), nprocs=p, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])
