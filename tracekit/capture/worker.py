"""One pipeline rank of a capture: real training under torch.distributed.pipelining, profiled.

Started by :func:`tracekit.capture.runner.run_capture` through ``torch.multiprocessing.spawn``;
imports torch at module level, so only the capture code path may import this module.

What each rank does:
  * joins a gloo process group over 127.0.0.1,
  * builds the same small MLP on every rank (same seed) and keeps its own stages,
  * runs ``2 + steps`` training steps (schedule.step + SGD), profiling with
    ``schedule(wait=1, warmup=1, active=steps)`` so step 0 (shape inference) is not traced,
  * writes ``rank<R>.json.gz`` (Chrome trace, gzip) into the output folder.

Emulated compute: every Linear layer runs its real (small) matmul, and two tiny autograd
Functions add fixed sleeps so that a layer's cost is set by the user, not by how four
processes share two cores:
  * ``TracekitEmuCompute`` wraps the layer OUTPUT: forward sleeps the forward cost, backward
    sleeps the input-grad cost. Its backward runs whenever the gradient w.r.t. the layer's
    output is needed, i.e. in a full backward (B) and in the input-grad pass (I,
    ``stage_backward_input``).
  * ``TracekitEmuWeightGrad`` wraps the WEIGHT before the matmul: identity forward, backward
    sleeps the weight-grad cost. It sits only on the weight path, so autograd runs it in a
    full backward (B) and in the weight pass (W, ``stage_backward_weight``), never in I.
So B costs 2x forward and, for split schedules, I and W cost 1x forward each.
(torch quirk, recorded honestly: in split schedules torch skips I on stage 0 when its input
needs no grad and runs stage 0's whole backward in W.)
"""
from __future__ import annotations

import gzip
import json
import os
import queue
import shutil
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from tracekit.capture.config import DESIGNS, SCHEDULES, CaptureConfig

P2P_DELAY_MARKER = "tracekit:p2p_delay"
P2P_DELAY_SLEEP = "tracekit:p2p_delay_sleep"


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"tracekit capture: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# emulated compute
# ---------------------------------------------------------------------------------------
def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


class TracekitEmuCompute(torch.autograd.Function):
    """Identity on a layer's output; forward sleeps ``fwd_ms``, backward ``igrad_ms``."""

    @staticmethod
    def forward(ctx, y, fwd_ms: float, igrad_ms: float):
        _sleep_ms(fwd_ms)
        ctx.igrad_ms = igrad_ms
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        _sleep_ms(ctx.igrad_ms)
        return grad, None, None


class TracekitEmuWeightGrad(torch.autograd.Function):
    """Identity on a weight; backward sleeps ``wgrad_ms`` (only on the weight-grad path)."""

    @staticmethod
    def forward(ctx, w, wgrad_ms: float):
        ctx.wgrad_ms = wgrad_ms
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        _sleep_ms(ctx.wgrad_ms)
        return grad, None


class EmulatedLinear(nn.Linear):
    """A real Linear layer whose forward / input-grad / weight-grad costs are fixed sleeps."""

    def __init__(self, hidden: int, fwd_ms: float, igrad_ms: float, wgrad_ms: float):
        super().__init__(hidden, hidden)
        self.fwd_ms, self.igrad_ms, self.wgrad_ms = fwd_ms, igrad_ms, wgrad_ms

    def forward(self, x):
        w = TracekitEmuWeightGrad.apply(self.weight, self.wgrad_ms)
        y = F.linear(x, w, self.bias)
        return TracekitEmuCompute.apply(y, self.fwd_ms, self.igrad_ms)


def build_stage_module(cfg: CaptureConfig, stage: int, layers: list[nn.Module]) -> nn.Module:
    mods: list[nn.Module] = []
    last_layer = cfg.layers - 1
    for i in cfg.layers_of_stage(stage):
        mods.append(layers[i])
        if i != last_layer:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def build_layers(cfg: CaptureConfig) -> list[nn.Module]:
    """All layers of the model, identical on every rank (same seed)."""
    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = []
    for i in range(cfg.layers):
        stage = i // (cfg.layers // cfg.n_stages)
        if cfg.compute == "emulated":
            c = cfg.layer_costs_ms(stage)
            layers.append(EmulatedLinear(cfg.hidden, c["forward"], c["input_grad"], c["weight_grad"]))
        else:
            layers.append(nn.Linear(cfg.hidden, cfg.hidden))
    for layer in layers:
        # He init keeps activations and gradients O(1) through the ReLU stack; with torch's
        # default init they shrink into float32 denormals by the first stage, and CPU matmuls
        # on denormals run ~40x slower (seen: 20 ms instead of 0.5 ms per backward mm).
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
    return layers


# ---------------------------------------------------------------------------------------
# injected link latency
# ---------------------------------------------------------------------------------------
class _DelayedSend:
    """What ``isend`` returns under ``--p2p-delay-ms``: waits for the post, then the real work."""

    __slots__ = ("due", "args", "kwargs", "work", "error", "posted")

    def __init__(self, due, args, kwargs):
        self.due, self.args, self.kwargs = due, args, kwargs
        self.work = None
        self.error: BaseException | None = None
        self.posted = threading.Event()

    def wait(self, timeout=None):
        self.posted.wait()
        if self.error is not None:
            raise self.error
        return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self):
        return self.posted.is_set() and (self.work is None or self.work.is_completed())

    def __bool__(self):
        return True


class DelayedSender:
    """Posts every ``isend`` ``delay_ms`` after it was requested, in request order.

    The main thread only enqueues (inside a ``tracekit:p2p_delay`` marker, a few µs);
    one sender thread per process sleeps until the send is due (``tracekit:p2p_delay_sleep``)
    and then calls the real ``isend``, so the message leaves D ms late while the sender's
    compute goes on. FIFO keeps gloo's per-(peer, tag) ordering. The real ``c10d::send`` and
    its ``gloo:send`` therefore appear on the sender thread, D ms after the marker.
    """

    def __init__(self, delay_ms: float, real_isend):
        self.delay_s = delay_ms / 1000.0
        self.real_isend = real_isend
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="tracekit-p2p-delay", daemon=True)
        self.thread.start()

    def isend(self, *args, **kwargs):
        with record_function(P2P_DELAY_MARKER):
            item = _DelayedSend(time.perf_counter() + self.delay_s, args, kwargs)
            self.q.put(item)
        return item

    def _run(self):
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

    def close(self):
        self.q.put(None)
        self.thread.join(timeout=10)


def install_p2p_delay(delay_ms: float) -> DelayedSender:
    """Route torch.distributed.isend (used by every pipelining send) through a DelayedSender."""
    import torch.distributed.distributed_c10d as c10d

    sender = DelayedSender(delay_ms, c10d.isend)

    def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
        return sender.isend(tensor, dst=dst, group=group, tag=tag, group_dst=group_dst)

    isend.__wrapped__ = c10d.isend  # type: ignore[attr-defined]
    # batch_isend_irecv tells sends from receives with `op is isend` against c10d's global,
    # and pipelining builds P2POp(dist.isend, ...): patch both names.
    c10d.isend = isend
    dist.isend = isend
    return sender


# ---------------------------------------------------------------------------------------
# the rank
# ---------------------------------------------------------------------------------------
def _make_schedule(cfg: CaptureConfig, stages, loss_fn):
    import torch.distributed.pipelining as pp

    cls = getattr(pp, SCHEDULES[cfg.schedule])
    if cfg.schedule in ("GPipe", "1F1B"):
        return cls(stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    return cls(stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)


def run_rank(rank: int, cfg_dict: dict, out_dir: str, port: int) -> None:
    """Entry point of one spawned process (``torch.multiprocessing.spawn`` passes ``rank``)."""
    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    out = Path(out_dir)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # denormal float math is ~40x slower on CPU
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=cfg.ranks,
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
    trace_json = out / f"rank{rank}.json"

    def on_trace_ready(prof):
        prof.export_chrome_trace(str(trace_json))

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(**cfg.profiler_schedule(), repeat=1),
        record_shapes=True,
        with_stack=False,
        experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True),
        on_trace_ready=on_trace_ready,
    )
    with prof:
        if cfg.schedule in DESIGNS:
            from tracekit.capture import designs

            step_losses = designs.RUNNERS[cfg.schedule](rank, cfg, prof, lambda msg: _log(rank, msg))
            last = rank == cfg.ranks - 1
        else:
            step_losses, last = _run_torch_schedule(rank, cfg, prof)
    dist.barrier()
    _log(rank, "writing traces")
    gz = out / f"rank{rank}.json.gz"
    with open(trace_json, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(trace_json)
    if last:
        (out / f".losses.rank{rank}.json").write_text(json.dumps(step_losses))


def _run_torch_schedule(rank: int, cfg: CaptureConfig, prof) -> tuple[list[float], bool]:
    """``2 + steps`` training steps of a torch.distributed.pipelining schedule; the step
    losses (last stage) and whether this rank holds the last stage."""
    from torch.distributed.pipelining import PipelineStage

    my_stages = cfg.stages_of_rank(rank)
    layers = build_layers(cfg)
    device = torch.device("cpu")
    stages = [
        PipelineStage(build_stage_module(cfg, s, layers), s, cfg.n_stages, device)
        for s in my_stages
    ]
    del layers
    params = [p for st in stages for p in st.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-3)
    schedule = _make_schedule(cfg, stages, nn.MSELoss())

    first, last = 0 in my_stages, (cfg.n_stages - 1) in my_stages
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    batch = cfg.microbatches * cfg.microbatch_size
    # same data on every rank (the generator is seeded alike); only the holders use it
    xs = [torch.randn(batch, cfg.hidden, generator=gen) for _ in range(cfg.steps + 2)]
    ys = [torch.randn(batch, cfg.hidden, generator=gen) for _ in range(cfg.steps + 2)]
    step_losses: list[float] = []
    for step in range(cfg.steps + 2):
        phase = "shape inference + warm-up" if step == 0 else (
            "warm-up (not recorded)" if step == 1 else f"profiling {step - 1}/{cfg.steps}")
        _log(rank, f"step {step}: {phase}")
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(schedule, optimizer, xs[step], ys[step], first, last)
        if loss is not None:
            step_losses.append(loss)
        prof.step()
        _log(rank, f"step {step} took {(time.perf_counter() - t0) * 1000:.0f} ms on rank 0 "
                   f"({(time.process_time() - c0) * 1000:.0f} ms CPU)")
    return step_losses, last


def train_step(schedule, optimizer, x, y, first: bool, last: bool) -> float | None:
    """One training step of this rank's stages: the first stage feeds the input, the last
    computes the loss; returns the step's mean microbatch loss on the last stage."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    losses: list = []
    args = (x,) if first else ()
    if last:
        schedule.step(*args, target=y, losses=losses)
    else:
        schedule.step(*args)
    optimizer.step()
    if last and losses:
        return float(torch.stack([loss.detach() for loss in losses]).mean())
    return None
