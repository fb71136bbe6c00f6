"""The program nsys launches (``python -m tracekit.capture.nsys CONFIG_JSON OUT_DIR``): it spawns
the ranks, each training as the Kineto capture does (:func:`tracekit.capture.worker.build_pipeline`)
with NVTX ranges instead of torch.profiler, and records which pid is which rank."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from tracekit.capture.config import CaptureConfig
from tracekit.capture.nsys.emitter import emitter_for_this_torch
from tracekit.capture.files import write_text

RANK_MARK = "tracekit:rank={rank} world_size={world}"


def _log(msg: str) -> None:
    print(f"tracekit capture (nsys): {msg}", file=sys.stderr, flush=True)


def run_rank_under_nsys(rank: int, cfg_dict: dict[str, Any], out_dir: str, port: int) -> None:
    """One spawned rank: the Kineto worker's training, with NVTX ranges instead of torch.profiler."""
    from datetime import timedelta

    import nvtx
    import torch
    import torch.distributed as dist

    from tracekit.capture import worker

    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.ranks, timeout=timedelta(seconds=300)
    )
    sender = worker.install_p2p_delay(cfg.p2p_delay_ms) if cfg.p2p_delay_ms > 0 else None
    out = Path(out_dir)
    try:
        nvtx.mark(RANK_MARK.format(rank=rank, world=cfg.ranks))
        write_text(out / f"pid.rank{rank}", str(os.getpid()))
        losses = _train_with_nvtx(rank, cfg, out)
        if losses is not None:
            write_text(out / "losses.json", json.dumps(losses))
        dist.barrier()
    finally:
        if sender is not None:
            sender.close()
        dist.destroy_process_group()


def _train_with_nvtx(rank: int, cfg: CaptureConfig, out: Path) -> list[float] | None:
    from torch.profiler import record_function

    from tracekit.capture import worker

    pipeline = worker.build_pipeline(rank, cfg)
    emitter, how = emitter_for_this_torch()
    if rank == 0:
        write_text(out / "emitter.txt", how)
    step_losses: list[float] = []
    entered = False
    try:
        for step in range(cfg.steps + 2):
            traced = step >= 2  # as the Kineto capture's schedule(wait=1, warmup=1, active=steps)
            if traced and not entered:
                emitter.__enter__()
                entered = True
            with record_function(f"ProfilerStep#{step}") if traced else contextlib.nullcontext():
                loss = pipeline.step(step)
            if loss is not None:
                step_losses.append(loss)
            if rank == 0:
                _log(f"step {step} done{' (traced)' if traced else ''}")
    finally:
        if entered:
            emitter.__exit__(None, None, None)
    return step_losses if pipeline.last else None


def spawn_ranks(config_path: str, out_dir: str) -> None:
    """The program nsys launches: start the ranks, then record which pid is which rank."""
    import socket

    from collections.abc import Callable

    from torch.multiprocessing.spawn import spawn as torch_spawn

    # torch's spawn has no annotations: typed as called here (it returns None with join=True)
    spawn = cast("Callable[..., object]", torch_spawn)

    cfg = json.loads(Path(config_path).read_text())
    out = Path(out_dir)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn(run_rank_under_nsys, args=(cfg, out_dir, port), nprocs=cfg["ranks"], join=True)
    pids = {r: int((out / f"pid.rank{r}").read_text()) for r in range(cfg["ranks"])}
    write_text(out / "rank_pids.json", json.dumps(pids))
