"""One pipeline rank of a capture: real training under torch.distributed.pipelining, profiled.

Started by :func:`tracekit.capture.runner.run_capture` through ``torch.multiprocessing.spawn``;
imports torch at module level, so only the capture code path may import this module.

What each rank does:
  * joins a gloo process group over 127.0.0.1,
  * builds the same small MLP on every rank (same seed) and keeps its own stages,
  * runs ``2 + steps`` training steps (schedule.step + SGD), profiling with
    ``schedule(wait=1, warmup=1, active=steps)`` so step 0 (shape inference) is not traced,
  * writes ``rank<R>.json.gz`` (Chrome trace, gzip) into the output folder.

The model and its emulated compute live in :mod:`tracekit.capture.model`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from tracekit.capture.config import DESIGNS, SCHEDULES, CaptureConfig
from tracekit.capture.files import write_text
from tracekit.capture.model import OnDevice, build_layers, build_stage_module, training_data
from tracekit.capture.parallel import (
    CommClock,
    GradBuckets,
    Recomputed,
    build_tp_stage_module,
    make_groups,
    stage_buckets,
)
from tracekit.capture.profiling import gzip_trace, make_profiler

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineSchedule  # every schedule's base

P2P_DELAY_MARKER = "tracekit:p2p_delay"
P2P_DELAY_SLEEP = "tracekit:p2p_delay_sleep"


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"tracekit capture: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# injected link latency
# ---------------------------------------------------------------------------------------
class _DelayedSend:
    """What ``isend`` returns under ``--p2p-delay-ms``: waits for the post, then the real work."""

    __slots__ = ("due", "args", "kwargs", "work", "error", "posted")

    def __init__(self, due: float, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        self.due, self.args, self.kwargs = due, args, kwargs
        self.work: dist.Work | None = None
        self.error: BaseException | None = None
        self.posted = threading.Event()

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.posted.wait()
        if self.error is not None:
            raise self.error
        assert self.work is not None  # c10d.isend returns None only on a rank outside the group
        return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self) -> bool:
        return self.posted.is_set() and (self.work is None or self.work.is_completed())

    def __bool__(self) -> bool:
        return True


class DelayedSender:
    """Posts every ``isend`` ``delay_ms`` after it was requested, in request order.

    The main thread only enqueues (inside a ``tracekit:p2p_delay`` marker, a few µs);
    one sender thread per process sleeps until the send is due (``tracekit:p2p_delay_sleep``)
    and then calls the real ``isend``, so the message leaves D ms late while the sender's
    compute goes on. FIFO keeps gloo's per-(peer, tag) ordering. The real ``c10d::send`` and
    its ``gloo:send`` therefore appear on the sender thread, D ms after the marker.
    """

    def __init__(self, delay_ms: float, real_isend: Callable[..., dist.Work | None]) -> None:
        self.delay_s = delay_ms / 1000.0
        self.real_isend = real_isend
        self.q: queue.Queue[_DelayedSend | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="tracekit-p2p-delay", daemon=True)
        self.thread.start()

    def isend(self, *args: object, **kwargs: object) -> _DelayedSend:
        with record_function(P2P_DELAY_MARKER):
            item = _DelayedSend(time.perf_counter() + self.delay_s, args, kwargs)
            self.q.put(item)
        return item

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            try:
                left = item.due - time.perf_counter()
                if left > 0:
                    with record_function(P2P_DELAY_SLEEP):
                        time.sleep(left)
                item.work = self.real_isend(*item.args, **item.kwargs)
            except BaseException as err:  # surfaced on wait()
                item.error = err
            finally:
                item.posted.set()

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=10)


def install_p2p_delay(delay_ms: float) -> DelayedSender:
    """Route torch.distributed.isend (used by every pipelining send) through a DelayedSender."""
    import torch.distributed.distributed_c10d as c10d

    sender = DelayedSender(delay_ms, c10d.isend)

    def isend(
        tensor: torch.Tensor,
        dst: int | None = None,
        group: dist.ProcessGroup | None = None,
        tag: int = 0,
        group_dst: int | None = None,
    ) -> _DelayedSend:
        return sender.isend(tensor, dst=dst, group=group, tag=tag, group_dst=group_dst)

    isend.__wrapped__ = c10d.isend  # type: ignore[attr-defined]
    # batch_isend_irecv tells sends from receives with `op is isend` against c10d's global,
    # and pipelining builds P2POp(dist.isend, ...): patch both names.
    # a _DelayedSend stands in for the Work c10d.isend returns (wait, is_completed): typed as that
    patched = cast("Callable[..., dist.Work | None]", isend)
    c10d.isend = patched
    dist.isend = patched
    return sender


# ---------------------------------------------------------------------------------------
# the rank
# ---------------------------------------------------------------------------------------
def _make_schedule(
    cfg: CaptureConfig, stages: list[PipelineStage], loss_fn: Callable[..., torch.Tensor]
) -> _PipelineSchedule:
    import torch.distributed.pipelining as pp

    cls = getattr(pp, SCHEDULES[cfg.schedule])
    if cfg.schedule in ("GPipe", "1F1B"):
        single: _PipelineSchedule = cls(stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
        return single
    multi: _PipelineSchedule = cls(stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)  # getattr: Any
    return multi


def run_rank(rank: int, cfg_dict: dict[str, Any], out_dir: str, port: int) -> None:
    """Entry point of one spawned process (``torch.multiprocessing.spawn`` passes ``rank``,
    the global rank: pipeline rank x TP x DP in Megatron's order tp-dp-pp)."""
    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    out = Path(out_dir)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # denormal float math is ~40x slower on CPU
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=cfg.world_size,
        timeout=timedelta(seconds=300),
    )
    sender = install_p2p_delay(cfg.p2p_delay_ms) if cfg.p2p_delay_ms > 0 else None
    try:
        _train_and_profile(rank, cfg, out)
    finally:
        if sender is not None:
            sender.close()
        dist.destroy_process_group()


def _train_and_profile(rank: int, cfg: CaptureConfig, out: Path) -> None:
    prof = make_profiler(
        cfg.profiler_schedule(),
        out / f"rank{rank}.json",
        cfg.profile_memory,
        cuda=cfg.device == "cuda",
        with_stack=cfg.with_stack,
    )
    with prof:
        if cfg.schedule in DESIGNS:
            from tracekit.capture import designs

            step_losses = designs.RUNNERS[cfg.schedule](rank, cfg, prof, lambda msg: _log(rank, msg))
            last = rank == cfg.ranks - 1
        else:
            step_losses, last, clock = _run_torch_schedule(rank, cfg, prof)
            if clock is not None:
                first_profiled = cfg.profiler_schedule()["wait"] + cfg.profiler_schedule()["warmup"]
                buckets = [b for b in clock.dp_buckets if b["step"] >= first_profiled]
                times = {"per_step": clock.per_step(first_profiled), "dp_buckets": buckets}
                write_text(out / f".parallel.rank{rank}.json", json.dumps(times))
    dist.barrier()
    _log(rank, "writing traces")
    gzip_trace(out / f"rank{rank}.json")
    tp_rank, dp_rank, _ = cfg.coords(rank)
    if last and tp_rank == 0 and dp_rank == 0:  # the first pipeline's losses
        write_text(out / f".losses.rank{rank}.json", json.dumps(step_losses))


def _run_torch_schedule(
    rank: int, cfg: CaptureConfig, prof: torch.profiler.profile
) -> tuple[list[float], bool, CommClock | None]:
    """``2 + steps`` training steps of a torch.distributed.pipelining schedule; the step
    losses (last stage), whether this rank holds the last stage, and the 3-D clock (None
    for a plain pipeline)."""
    pipeline = build_pipeline(rank, cfg)
    clock = pipeline.clock
    step_losses: list[float] = []
    for step in range(cfg.steps + 2):
        if clock is not None:
            clock.step = step
        if pipeline.grad_buckets is not None:
            pipeline.grad_buckets.armed = step > 0  # step 0's shape inference runs one more backward
        phase = (
            "shape inference + warm-up"
            if step == 0
            else ("warm-up (not recorded)" if step == 1 else f"profiling {step - 1}/{cfg.steps}")
        )
        _log(rank, f"step {step}: {phase}")
        t0, c0 = time.perf_counter(), time.process_time()
        with record_function(cfg.schedule) if cfg.layer_labels else contextlib.nullcontext():
            loss = pipeline.step(step)
        if loss is not None:
            step_losses.append(loss)
        prof.step()
        _log(
            rank,
            f"step {step} took {(time.perf_counter() - t0) * 1000:.0f} ms on rank 0 "
            f"({(time.process_time() - c0) * 1000:.0f} ms CPU)",
        )
    return step_losses, pipeline.last, clock


@dataclasses.dataclass
class RankPipeline:
    """One rank's share of the training: its stages' schedule and optimizer, the run's data,
    and whether it holds the first and the last stage. Every torch.distributed.pipelining
    capture (Kineto here, nsys in :mod:`tracekit.capture.nsys.ranks`) trains through it."""

    schedule: _PipelineSchedule
    optimizer: torch.optim.Optimizer
    xs: list[torch.Tensor]
    ys: list[torch.Tensor]
    first: bool
    last: bool
    #: 3-D captures: wall time in TP / DP collectives and recomputation (None otherwise)
    clock: CommClock | None = None
    #: --data-parallel: the overlapped gradient all-reduce, finished before the optimizer
    grad_buckets: GradBuckets | None = None

    def step(self, step: int) -> float | None:
        """Training step ``step``; its mean microbatch loss on the last stage."""
        before_optimizer = self.grad_buckets.finish if self.grad_buckets is not None else None
        return train_step(
            self.schedule, self.optimizer, self.xs[step], self.ys[step], self.first, self.last, before_optimizer
        )


def build_pipeline(rank: int, cfg: CaptureConfig) -> RankPipeline:
    """This rank's stages of the same model every rank builds (same seed), on the CPU.
    ``rank`` is global: with TP or DP the rank's pipeline is the PP group of its TP rank
    and replica, and its stages are those of its pipeline rank."""
    from torch.distributed.pipelining import PipelineStage

    tp_rank, dp_rank, pp_rank = cfg.coords(rank)
    my_stages = cfg.stages_of_rank(pp_rank)
    layers = build_layers(cfg, dp_rank)
    # the stage's own device is the host's even with --device cuda: gloo sends host tensors
    # only, so a GPU stage sits behind OnDevice's copies
    device = torch.device("cpu")
    clock = CommClock() if cfg.is_3d or cfg.recompute else None
    groups = make_groups(cfg, rank) if cfg.is_3d else {}

    if cfg.tensor_parallel > 1:
        assert clock is not None  # TP is 3-D
        modules = [build_tp_stage_module(cfg, s, layers, tp_rank, dp_rank, groups["TP"], clock) for s in my_stages]
    else:
        modules = [build_stage_module(cfg, s, layers) for s in my_stages]
    grad_buckets = None
    if cfg.data_parallel > 1:
        assert clock is not None  # DP is 3-D
        grad_buckets = GradBuckets(stage_buckets(modules), groups["DP"], cfg.data_parallel, cfg.microbatches, clock)
    if cfg.recompute:
        assert clock is not None
        modules = [Recomputed(m, clock) for m in modules]
    if cfg.device == "cuda":
        modules = [OnDevice(m, torch.device("cuda", 0)) for m in modules]
    pp_group = groups.get("PP")
    stages = [PipelineStage(m, s, cfg.n_stages, device, group=pp_group) for m, s in zip(modules, my_stages)]
    del layers
    params = [p for st in stages for p in st.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    schedule = _make_schedule(cfg, stages, nn.MSELoss())
    xs, ys = training_data(cfg, dp_rank)
    return RankPipeline(
        schedule, optimizer, xs, ys, 0 in my_stages, (cfg.n_stages - 1) in my_stages, clock, grad_buckets
    )


def train_step(
    schedule: _PipelineSchedule,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    first: bool,
    last: bool,
    before_optimizer: Callable[[], None] | None = None,
) -> float | None:
    """One training step of this rank's stages: the first stage feeds the input, the last
    computes the loss; ``before_optimizer`` (the DP gradient all-reduce's wait) runs
    between the schedule and the optimizer step. Returns the step's mean microbatch loss
    on the last stage."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    args = (x,) if first else ()
    if last:
        schedule.step(*args, target=y, losses=losses)
    else:
        schedule.step(*args)
    if before_optimizer is not None:
        before_optimizer()
    optimizer.step()
    if last and losses:
        return float(torch.stack([loss.detach() for loss in losses]).mean())
    return None
