"""``tracekit capture --framework deepspeed``: DeepSpeed's PipelineEngine on local CPU ranks.

The ranks (:mod:`tracekit.capture.frameworks.deepspeed_rank`) run DeepSpeed unpatched:
``DS_ACCELERATOR=cpu``, ``deepspeed.init_distributed(dist_backend="gloo")``, its
``TrainSchedule`` (1F1B-like) and its own blocking P2P. DeepSpeed writes no labels into a
CPU trace (its NVTX ranges are no-ops there), so the folder is an unlabelled pipeline; what
the engine really did is in capture.json's ``engine`` section: per rank and profiled step,
every instruction it executed, in order, with buffer, microbatch and wall-clock span.

At start DeepSpeed JIT-compiles a small C++ op (its shared-memory comm op, g++ + ninja);
``TORCH_EXTENSIONS_DIR`` points it at a folder under the system's temp folder (kept for the
next capture) unless the caller set one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracekit.capture.config import CaptureConfig, manifest_head
from tracekit.capture.runner import (
    compute_manifest,
    faults_manifest,
    import_torch,
    prepare_out_dir,
    profiler_manifest,
    spawn_ranks,
    take_losses,
    trace_files,
    utc_now,
    write_manifest,
)
from tracekit.errors import CaptureError

DEEPSPEED_HOW = (
    "deepspeed.initialize() on a deepspeed.pipe.PipelineModule of p layers, layer s being the "
    "very nn.Sequential the torch.distributed.pipelining captures run as stage s "
    "(partition_method='uniform'); engine.train_batch() once per step with m microbatches of "
    "microbatch_size rows (gradient accumulation), SGD as the client optimizer; ranks started "
    "by torch.multiprocessing.spawn with MASTER_ADDR/MASTER_PORT/RANK/LOCAL_RANK/WORLD_SIZE "
    "set as DeepSpeed's launcher would, DS_ACCELERATOR=cpu, "
    "deepspeed.init_distributed(dist_backend='gloo'); DeepSpeed itself unpatched"
)
ENGINE_HOW = (
    "PipelineEngine._INSTRUCTION_MAP replaced on the engine instance by the same executors, "
    "each wrapped in a plain Python function that logs the instruction (no profiler event): "
    "its class name, buffer_id, microbatch (its rank among the instructions of its kind in "
    "the step, checked against buffer_id = microbatch % num_pipe_buffers) and the time.time_ns() "
    "before and after it ran (the same clock as the trace's baseTimeNanoseconds + ts); "
    "ids are -1 for ReduceTiedGrads, ReduceGrads and OptimizerStep"
)


def _log(msg: str) -> None:
    print(f"tracekit capture (deepspeed): {msg}", file=sys.stderr, flush=True)


def run_capture(config: CaptureConfig, out_dir: str | Path, profiler: str) -> Path:
    """Run the capture of ``config`` under DeepSpeed; writes rank<R>.json.gz + capture.json."""
    config.validate()
    if profiler != "torch":
        raise CaptureError(f"--framework deepspeed records with the PyTorch profiler only; drop --profiler {profiler}")
    import_torch()
    import deepspeed
    import torch

    from tracekit.capture.frameworks import deepspeed_rank

    out = prepare_out_dir(out_dir)
    cmd = config.command or config.command_line(str(out))
    env = {
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR")
        or str(Path(tempfile.gettempdir()) / "tracekit-torch-extensions"),
    }
    _log(
        f"spawning {config.ranks} ranks: DeepSpeed {deepspeed.__version__} PipelineEngine "
        f"(TrainSchedule), p={config.ranks} m={config.microbatches}, {config.compute} compute, "
        "gloo on 127.0.0.1"
    )
    t0 = time.perf_counter()
    spawn_ranks(deepspeed_rank.run_rank, (config.to_dict(), str(out.resolve()), env), config.ranks)
    _log(f"ranks finished in {time.perf_counter() - t0:.1f} s; writing capture.json")
    files = trace_files(out, config.ranks)
    losses = take_losses(out)
    engine = _take_engine_logs(out, config.ranks)

    head = manifest_head(config, cmd, torch.__version__)
    head["schedule_class"] = "deepspeed.runtime.pipe.schedule.TrainSchedule"
    # DeepSpeed's own grid, not tracekit's placement rule (they agree: stage s on rank s)
    head["stage_to_rank"] = engine["stage_to_rank"]
    meta = {
        **head,
        "deepspeed_version": deepspeed.__version__,
        "deepspeed": {
            "how": DEEPSPEED_HOW,
            "config": deepspeed_rank.ds_config(config),
            "env": env | {"TORCH_EXTENSIONS_DIR": "<temp folder>"},
        },
        "profiler": profiler_manifest(config),
        "backend": "gloo",
        "compute": compute_manifest(config),
        "faults": faults_manifest(config),
        "seed": config.seed,
        "losses_per_step": losses,
        "engine": engine,
        "created": utc_now(),
        "files": files,
    }
    write_manifest(out, meta, files)
    return out


def _take_engine_logs(out: Path, ranks: int) -> dict[str, Any]:
    """The ranks' ``.engine.rank<R>.json`` as capture.json's ``engine`` section (files removed)."""
    per_rank: dict[int, dict[str, Any]] = {}
    for r in range(ranks):
        path = out / f".engine.rank{r}.json"
        if not path.exists():
            raise CaptureError(f"capture finished but rank {r} left no engine log in {out}")
        per_rank[r] = json.loads(path.read_text())
        path.unlink()
    first = per_rank[0]
    return {
        "how": ENGINE_HOW,
        "stage_to_rank": first["stage_to_global_rank"],
        "pipeline_config": first["pipeline_config"],
        "partition": first["partition"],
        "instruction_fields": first["instruction_fields"],
        "ranks": {
            str(r): {"stage": rec["stage"], "num_pipe_buffers": rec["num_pipe_buffers"], "steps": rec["steps"]}
            for r, rec in per_rank.items()
        },
    }
