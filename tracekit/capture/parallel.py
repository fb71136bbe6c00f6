"""The other two dimensions of a 3-D job around the pipeline, and recomputation, for real.

* **Process groups** (:func:`make_groups`): Megatron's order tp-dp-pp, each group created with
  ``torch.distributed.new_group(ranks, group_desc=...)`` and Megatron's descriptions
  (``TENSOR_MODEL_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``,
  megatron/core/parallel_state.py), so the profiler records them in
  ``distributedInfo.pg_config`` (each rank's own groups; torch 2.13 on gloo writes no
  ``record_param_comms`` events, so a collective's group is not in its own event).
* **Tensor parallelism** (:func:`build_tp_stage_module`): each stage's layers in pairs, as
  Megatron's MLP: a column-parallel layer (output features sharded; its input goes through
  :class:`_CopyToModelParallelRegion`, identity forward, all-reduce of the input grad in
  the backward) then ReLU, then a row-parallel layer (input features sharded; its partial
  output goes through :class:`_ReduceFromModelParallelRegion`, an all-reduce in the forward,
  identity backward; the bias is added after the reduce): the class names and semantics
  of Megatron's megatron/core/tensor_parallel/mappings.py. The shards are cut from the
  same full layers every capture builds, so the maths is the plain model's.
* **Data parallelism** (:class:`GradBuckets`): one bucket per Linear layer, last layer first;
  a bucket's flat gradient is all-reduced (``async_op=True``) on the DP group from the
  parameters' post-accumulate-grad hooks as soon as the last microbatch's backward has
  accumulated every gradient in it (Megatron's ``overlap_grad_reduce``, DDP's buckets), and
  waited on before the optimizer step; then averaged.
* **Recomputation** (:class:`Recomputed`): ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)`` around each stage's layers: the backward re-runs the forward first.

:class:`CommClock` is the independent truth capture.json records: wall time
(``time.perf_counter_ns``) inside each TP all-reduce, each DP launch and wait, and each
recompute, per training step. Imports torch: only the capture code path may import it.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from tracekit.capture.config import CaptureConfig
from tracekit.capture.model import TracekitEmuCompute, TracekitEmuWeightGrad, applied

# torch leaves these two helpers unannotated: typed as used here
flatten_dense = cast("Callable[[list[torch.Tensor | None]], torch.Tensor]", _flatten_dense_tensors)
unflatten_dense = cast(
    "Callable[[torch.Tensor, list[torch.Tensor | None]], tuple[torch.Tensor, ...]]", _unflatten_dense_tensors
)


class CommClock:
    """Nanoseconds and counts per training step (``step`` is the loop's step, 0-based)."""

    def __init__(self) -> None:
        self.step = 0
        self.ns: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.calls: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        #: DP buckets: (step, bucket, launch_start_ns, wait_end_ns) on this process's clock
        self.dp_buckets: list[dict[str, int]] = []

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.ns[self.step][kind] += time.perf_counter_ns() - t0
            self.calls[self.step][kind] += 1

    def per_step(self, first_profiled: int) -> list[dict[str, Any]]:
        """The profiled steps' figures, ``ProfilerStep#<step>`` each."""
        out = []
        for step in sorted(s for s in self.ns if s >= first_profiled):
            out.append(
                {
                    "profiler_step": step,
                    "ns": dict(sorted(self.ns[step].items())),
                    "calls": dict(sorted(self.calls[step].items())),
                }
            )
        return out


def make_groups(cfg: CaptureConfig, rank: int) -> dict[str, dist.ProcessGroup]:
    """Create every group of the layout (all ranks, same order); this rank's by role."""
    mine: dict[str, dist.ProcessGroup] = {}
    for group in cfg.process_groups():
        pg = dist.new_group(group["ranks"], group_desc=group["desc"])
        if rank in group["ranks"]:
            mine[group["role"]] = pg
    return mine


# ---------------------------------------------------------------------------------------
# tensor parallelism
# ---------------------------------------------------------------------------------------
def _is_real(t: torch.Tensor) -> bool:
    return not t.is_meta


# The two Functions carry Megatron's class names: the profiler records a Function's forward
# and backward under its class name, so the traces show what a Megatron run's would.
class _CopyToModelParallelRegion(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, clock: CommClock) -> torch.Tensor:
        ctx.group, ctx.clock = group, clock
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.clone()
        if _is_real(grad):
            with ctx.clock.timed("tp_all_reduce_backward"):
                dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """All-reduce over the TP group in the forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, clock: CommClock) -> torch.Tensor:
        out = x.clone()
        if _is_real(out):
            with clock.timed("tp_all_reduce_forward"):
                dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _TPLinear(nn.Module):
    """One shard of a Linear layer, with the emulated costs of :mod:`tracekit.capture.model`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, costs_ms: dict[str, float] | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone())
        self.costs_ms = costs_ms

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.costs_ms is None:
            return F.linear(x, self.weight, bias)
        c = self.costs_ms
        w = applied(TracekitEmuWeightGrad)(self.weight, c["weight_grad"])
        return applied(TracekitEmuCompute)(F.linear(x, w, bias), c["forward"], c["input_grad"])


class ColumnParallelLinear(_TPLinear):
    def __init__(
        self,
        full: nn.Linear,
        tp_rank: int,
        tp: int,
        group: dist.ProcessGroup,
        clock: CommClock,
        costs_ms: dict[str, float] | None,
    ) -> None:
        rows = slice(tp_rank * full.out_features // tp, (tp_rank + 1) * full.out_features // tp)
        super().__init__(full.weight[rows], full.bias[rows], costs_ms)
        self.group, self.clock = group, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(applied(_CopyToModelParallelRegion)(x, self.group, self.clock), self.bias)


class RowParallelLinear(_TPLinear):
    def __init__(
        self,
        full: nn.Linear,
        tp_rank: int,
        tp: int,
        group: dist.ProcessGroup,
        clock: CommClock,
        costs_ms: dict[str, float] | None,
    ) -> None:
        cols = slice(tp_rank * full.in_features // tp, (tp_rank + 1) * full.in_features // tp)
        super().__init__(full.weight[:, cols], full.bias, costs_ms)
        self.group, self.clock = group, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self._matmul(x, None)
        return applied(_ReduceFromModelParallelRegion)(partial, self.group, self.clock) + self.bias


def build_tp_stage_module(
    cfg: CaptureConfig,
    stage: int,
    layers: list[nn.Module],
    tp_rank: int,
    replica: int,
    group: dist.ProcessGroup,
    clock: CommClock,
) -> nn.Module:
    """``stage``'s layers as this TP rank's shards: (column, ReLU, row, ReLU) per pair."""
    costs = cfg.layer_costs_ms(stage, replica) if cfg.compute == "emulated" else None
    tp = cfg.tensor_parallel
    mods: list[nn.Module] = []
    indices = list(cfg.layers_of_stage(stage))
    for col, row in zip(indices[0::2], indices[1::2]):
        column_layer, row_layer = layers[col], layers[row]
        assert isinstance(column_layer, nn.Linear) and isinstance(row_layer, nn.Linear)
        mods += [ColumnParallelLinear(column_layer, tp_rank, tp, group, clock, costs), nn.ReLU()]
        mods.append(RowParallelLinear(row_layer, tp_rank, tp, group, clock, costs))
        if row != cfg.layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


# ---------------------------------------------------------------------------------------
# data parallelism
# ---------------------------------------------------------------------------------------
class GradBuckets:
    """Gradient all-reduce over the DP group, overlapped with the last microbatch's backward.

    Each parameter's post-accumulate-grad hook counts the backwards that reached it; when
    every parameter of a bucket has had ``microbatches`` of them in this step (the last
    microbatch's backward), the bucket's flat gradient is all-reduced with
    ``async_op=True``. :meth:`finish` (before the optimizer) launches any bucket not yet
    launched (step 0, whose shape inference runs an extra backward, is not armed), waits for
    all of them in launch order, and writes the average back into ``.grad``."""

    def __init__(
        self, buckets: list[list[nn.Parameter]], group: dist.ProcessGroup, dp: int, microbatches: int, clock: CommClock
    ) -> None:
        self.buckets, self.group, self.dp, self.microbatches, self.clock = buckets, group, dp, microbatches, clock
        self.armed = False
        self.counts: dict[int, int] = defaultdict(int)
        self.pending: list[tuple[int, torch.Tensor, dist.Work, int]] = []  # bucket, flat, work, launch ns
        self.launched: set[int] = set()
        for index, bucket in enumerate(buckets):
            for param in bucket:
                # Tensor.register_post_accumulate_grad_hook is unannotated in torch
                register = cast(
                    "Callable[[Callable[[nn.Parameter], None]], object]", param.register_post_accumulate_grad_hook
                )
                register(self._hook(index))

    def _hook(self, index: int) -> Callable[[nn.Parameter], None]:
        def on_grad(param: nn.Parameter) -> None:
            self.counts[id(param)] += 1
            if self.armed and index not in self.launched and self._ready(index):
                self._launch(index)

        return on_grad

    def _ready(self, index: int) -> bool:
        return all(self.counts[id(p)] >= self.microbatches for p in self.buckets[index])

    def _launch(self, index: int) -> None:
        grads = [p.grad for p in self.buckets[index]]
        flat = flatten_dense(grads)
        start = time.perf_counter_ns()
        with self.clock.timed("dp_all_reduce_launch"):
            work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.launched.add(index)
        self.pending.append((index, flat, work, start))

    def finish(self) -> None:
        for index in range(len(self.buckets)):
            if index not in self.launched:
                self._launch(index)
        for index, flat, work, start in self.pending:
            with self.clock.timed("dp_all_reduce_wait"):
                work.wait()
            end = time.perf_counter_ns()
            self.clock.dp_buckets.append(
                {"step": self.clock.step, "bucket": index, "launch_ns": start, "wait_end_ns": end}
            )
            flat.div_(self.dp)
            params = self.buckets[index]
            grads = [p.grad for p in params]
            for grad, reduced in zip(grads, unflatten_dense(flat, grads)):
                assert grad is not None  # the bucket was launched from these gradients
                grad.copy_(reduced)
        self.pending.clear()
        self.launched.clear()
        self.counts.clear()


def stage_buckets(modules: list[nn.Module]) -> list[list[nn.Parameter]]:
    """One bucket per layer with parameters, last layer first (the order backward frees them)."""
    buckets: list[list[nn.Parameter]] = []
    for module in modules:
        for layer in module.modules():
            own = list(layer.parameters(recurse=False))
            if own:
                buckets.append(own)
    return buckets[::-1]


# ---------------------------------------------------------------------------------------
# recomputation
# ---------------------------------------------------------------------------------------
class Recomputed(nn.Module):
    """``inner`` under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: only the
    stage's input is kept, and its backward re-runs ``inner``'s forward first. The re-run's
    wall time goes to the clock as ``recompute``."""

    def __init__(self, inner: nn.Module, clock: CommClock) -> None:
        super().__init__()
        self.inner, self.clock = inner, clock
        self._in_forward = False

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor  # Module.__call__ is Any in torch
        if self._in_forward:
            y = self.inner(x)
            return y
        with self.clock.timed("recompute"):
            y = self.inner(x)
            return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor  # Module.__call__ and checkpoint() are Any in torch
        if not torch.is_grad_enabled():
            y = self.inner(x)
            return y
        self._in_forward = True
        try:
            y = torch.utils.checkpoint.checkpoint(self._run, x, use_reentrant=False)
            return y
        finally:
            self._in_forward = False
