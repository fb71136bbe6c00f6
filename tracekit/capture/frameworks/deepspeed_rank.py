"""One rank of a DeepSpeed capture: DeepSpeed's PipelineEngine trains the capture model.

Started by :func:`tracekit.capture.frameworks.deepspeed.run_capture` through
``torch.multiprocessing.spawn``. DeepSpeed does the pipelining itself: its ``TrainSchedule``
decides the order of forward, backward, send and receive, and its blocking
``deepspeed.comm`` send/recv (``runtime/pipe/p2p.py``) move activations and gradients over
gloo. tracekit only provides the model (:mod:`tracekit.capture.model`: the same layers,
split and emulated costs as the torch.distributed.pipelining captures), the data and the
profiler (:mod:`tracekit.capture.profiling`).

Nothing here labels the trace. The ground truth goes to capture.json instead: every
instruction the engine executes is logged by a plain Python wrapper around its executor
(``PipelineEngine._INSTRUCTION_MAP``, replaced on the engine instance), with its buffer and
microbatch and the wall-clock time it ran, into ``.engine.rank<R>.json`` for the parent.

Imports torch at module level and deepspeed once the environment is set (``DS_ACCELERATOR``
must be set before deepspeed is first imported), so only the capture code path may import it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from tracekit.capture.config import CaptureConfig
from tracekit.capture.files import write_text
from tracekit.capture.model import build_layers, build_stage_module, training_data
from tracekit.capture.profiling import gzip_trace, make_profiler

#: the instructions that carry a microbatch (the others run once per step)
PER_MICROBATCH = (
    "LoadMicroBatch",
    "ForwardPass",
    "BackwardPass",
    "SendActivation",
    "RecvActivation",
    "SendGrad",
    "RecvGrad",
)
#: one logged instruction: [name, buffer_id, microbatch, start_ns, end_ns] (ids -1 when none)
INSTRUCTION_FIELDS = ["instruction", "buffer_id", "microbatch", "start_unix_ns", "end_unix_ns"]


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"tracekit capture (deepspeed): {msg}", file=sys.stderr, flush=True)


def ds_config(cfg: CaptureConfig) -> dict[str, Any]:
    """The DeepSpeed config of a capture: m microbatches of ``microbatch_size`` rows per
    step (gradient accumulation), no ZeRO, fp32, nothing printed per step."""
    return {
        "train_micro_batch_size_per_gpu": cfg.microbatch_size,
        "gradient_accumulation_steps": cfg.microbatches,
        "train_batch_size": cfg.microbatch_size * cfg.microbatches,  # data-parallel size 1
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 0},
        "gradient_clipping": 0.0,
        "pipeline": {"activation_checkpoint_interval": 0},
    }


class InstructionLog:
    """Which instruction the engine ran, in order, per training step.

    The microbatch of an instruction is its rank among the instructions of its kind in the
    step: the TrainSchedule handles each kind in microbatch order, and every logged
    buffer_id is checked against ``microbatch % num_pipe_buffers``, so a schedule that
    did otherwise stops the capture instead of recording a wrong truth.
    """

    def __init__(self, num_pipe_buffers: int):
        self.num_pipe_buffers = num_pipe_buffers
        self.steps: dict[int, list[list[object]]] = {}
        self._step = -1
        self._seen: dict[str, int] = {}

    def start_step(self, step: int) -> None:
        self._step = step
        self.steps[step] = []
        self._seen = {}

    def wrap(self, name: str, execute: Callable[..., object]) -> Callable[..., object]:
        """``execute`` (an unbound executor, called as ``execute(engine, **kwargs)``) logged."""
        log = self

        def logged(engine: object, **kwargs: object) -> object:
            buffer_id = kwargs.get("buffer_id", -1)
            microbatch = -1
            if name in PER_MICROBATCH:
                microbatch = log._seen.get(name, 0)
                log._seen[name] = microbatch + 1
                if buffer_id != microbatch % log.num_pipe_buffers:
                    raise RuntimeError(
                        f"{name}(buffer_id={buffer_id}) is microbatch {microbatch} by count, "
                        f"which uses buffer {microbatch % log.num_pipe_buffers}"
                    )
            start_ns = time.time_ns()
            result = execute(engine, **kwargs)
            log.steps[log._step].append([name, buffer_id, microbatch, start_ns, time.time_ns()])
            return result

        return logged


def run_rank(rank: int, cfg_dict: dict[str, Any], out_dir: str, env: dict[str, str], port: int) -> None:
    """Entry point of one spawned process (``torch.multiprocessing.spawn`` passes ``rank``)."""
    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    # what DeepSpeed's own launcher would set; DS_ACCELERATOR before deepspeed is imported
    os.environ.update(env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(cfg.ranks),
            "LOCAL_WORLD_SIZE": str(cfg.ranks),
        }
    )
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # denormal float math is ~40x slower on CPU
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=300))
    try:
        _train_and_profile(rank, cfg, Path(out_dir), deepspeed)
    finally:
        dist.destroy_process_group()


def _train_and_profile(rank: int, cfg: CaptureConfig, out: Path, deepspeed: ModuleType) -> None:
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    layers = build_layers(cfg)
    # one DeepSpeed layer per stage, each the very module the torch captures run as that
    # stage; "uniform" over p layers gives stage s exactly layer s
    module = PipelineModule(
        layers=[build_stage_module(cfg, s, layers) for s in range(cfg.n_stages)],
        num_stages=cfg.ranks,
        loss_fn=nn.MSELoss(),
        partition_method="uniform",
    )
    del layers
    optimizer = torch.optim.SGD([p for p in module.parameters()], lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config(cfg))
    torch.set_num_threads(1)  # in case DeepSpeed's CPU accelerator set its own
    assert isinstance(engine, PipelineEngine), type(engine)

    schedule = engine._train_schedule()
    log = InstructionLog(schedule.num_pipe_buffers())
    engine._INSTRUCTION_MAP = {
        kind: log.wrap(kind.__name__, execute) for kind, execute in PipelineEngine._INSTRUCTION_MAP.items()
    }
    xs, ys = training_data(cfg)
    mbs = cfg.microbatch_size
    # sliced before profiling starts: slicing inside a step would put tiny ops at its start
    microbatches = [
        [(x[i * mbs : (i + 1) * mbs], y[i * mbs : (i + 1) * mbs]) for i in range(cfg.microbatches)]
        for x, y in zip(xs, ys)
    ]

    prof = make_profiler(cfg.profiler_schedule(), out / f"rank{rank}.json")
    step_losses: list[float] = []
    with prof:
        for step in range(cfg.steps + 2):
            phase = (
                "shape exchange + warm-up"
                if step == 0
                else ("warm-up (not recorded)" if step == 1 else f"profiling {step - 1}/{cfg.steps}")
            )
            _log(rank, f"step {step}: {phase}")
            t0 = time.perf_counter()
            log.start_step(step)
            loss = engine.train_batch(data_iter=iter(microbatches[step]))
            step_losses.append(float(loss))
            prof.step()
            _log(rank, f"step {step} took {(time.perf_counter() - t0) * 1000:.0f} ms on rank 0")
    dist.barrier()
    _log(rank, "writing traces")
    gzip_trace(out / f"rank{rank}.json")
    grid = engine.grid
    record = {
        "rank": rank,
        "stage": engine.stage_id,
        "stage_to_global_rank": [grid.stage_to_global(stage_id=s) for s in range(engine.num_stages)],
        "num_pipe_buffers": log.num_pipe_buffers,
        "partition": list(module.parts),
        "pipeline_config": engine._config.pipeline,
        "instruction_fields": INSTRUCTION_FIELDS,
        # ProfilerStep#N is training step N: steps 0 and 1 are not in the trace
        "steps": {str(s): log.steps[s] for s in range(2, cfg.steps + 2)},
    }
    write_text(out / f".engine.rank{rank}.json", json.dumps(record))
    if engine.is_last_stage():
        write_text(out / f".losses.rank{rank}.json", json.dumps(step_losses))
