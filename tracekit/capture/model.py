"""The model every capture trains, identical on every rank, with emulated compute.

Shared by the torch.distributed.pipelining ranks (:mod:`tracekit.capture.worker`) and the
framework ranks (:mod:`tracekit.capture.frameworks`), so every sample runs the same maths at
the same costs. Imports torch at module level: only the capture code path may import it.

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

``--layer-kind`` picks what one layer is (the same costs per layer in each):
  * ``linear`` (default): one ``EmulatedLinear`` and a ReLU after it (not after the last).
  * ``sleep-linear``: one ``SleepLinear``, whose input and weight each pass the same autograd
    Function, ``TracekitSleep`` (forward sleeps half the layer's forward cost on each; the
    input's backward sleeps the input-grad cost, the weight's the weight-grad cost), and a
    ReLU after it: ``TracekitSleep`` runs twice a layer, and a layer finder that takes any
    repeating op for a layer reads twice as many layers as the model has.
  * ``transformer``: one ``TransformerLayer``, a pre-norm block over the microbatch's rows
    (LayerNorm, a qkv Linear, softmax attention over the rows, an output Linear, residual;
    LayerNorm, a 4x wide Linear, GELU, a Linear back, residual): four ``EmulatedLinear`` a
    layer, each with a quarter of the layer's costs.
(torch quirk, recorded honestly: in split schedules torch skips I on stage 0 when its input
needs no grad and runs stage 0's whole backward in W.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from tracekit.capture.config import CaptureConfig


def applied(function: type[torch.autograd.Function]) -> Callable[..., torch.Tensor]:
    """``function.apply``, typed: torch leaves ``Function.apply`` unannotated, and every
    Function of the capture takes a tensor and numbers (or labels) and returns one tensor."""
    return cast("Callable[..., torch.Tensor]", function.apply)


# A Function's ``ctx`` is torch's attribute bag (FunctionCtx), given our own fields below:
# typed Any, as torch's Function.forward / backward type it.
_Grads = tuple[torch.Tensor | None, ...]


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


class TracekitEmuCompute(torch.autograd.Function):
    """Identity on a layer's output; forward sleeps ``fwd_ms``, backward ``igrad_ms``
    (inside a ``<label>(B)`` range when the layer is labelled)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, fwd_ms: float, igrad_ms: float, label: str | None = None) -> torch.Tensor:
        _sleep_ms(fwd_ms)
        ctx.igrad_ms, ctx.label = igrad_ms, label
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> _Grads:
        with _labelled(ctx.label, "B"):
            _sleep_ms(ctx.igrad_ms)
        return (grad,) + (None,) * (len(ctx.needs_input_grad) - 1)  # label given or not


class TracekitEmuWeightGrad(torch.autograd.Function):
    """Identity on a weight; backward sleeps ``wgrad_ms`` (only on the weight-grad path)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, wgrad_ms: float, label: str | None = None) -> torch.Tensor:
        ctx.wgrad_ms, ctx.label = wgrad_ms, label
        return w.view_as(w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> _Grads:
        with _labelled(ctx.label, "B"):
            _sleep_ms(ctx.wgrad_ms)
        return (grad,) + (None,) * (len(ctx.needs_input_grad) - 1)


class TracekitSleep(torch.autograd.Function):
    """Identity on a tensor; forward sleeps ``fwd_ms``, backward ``bwd_ms`` (run only where
    autograd needs the gradient of that tensor)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, fwd_ms: float, bwd_ms: float) -> torch.Tensor:
        _sleep_ms(fwd_ms)
        ctx.bwd_ms = bwd_ms
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> _Grads:
        _sleep_ms(ctx.bwd_ms)
        return grad, None, None


def _labelled(label: str | None, kind: str) -> AbstractContextManager[object]:
    """A hand-written per-layer range, ``linear3(F)``, or nothing for an unlabelled layer."""
    return record_function(f"{label}({kind})") if label else contextlib.nullcontext()


class EmulatedLinear(nn.Linear):
    """A real Linear layer whose forward / input-grad / weight-grad costs are fixed sleeps.

    ``label``: leave per-layer ranges with the action kind in a suffix, as hand-instrumented
    models do (``linear3(F)`` around the forward, ``linear3(B)`` around each backward part)."""

    def __init__(
        self,
        hidden: int,
        fwd_ms: float,
        igrad_ms: float,
        wgrad_ms: float,
        label: str | None = None,
        out_features: int | None = None,
    ) -> None:
        super().__init__(hidden, out_features or hidden)
        self.fwd_ms, self.igrad_ms, self.wgrad_ms, self.label = fwd_ms, igrad_ms, wgrad_ms, label

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _labelled(self.label, "F"):
            w = applied(TracekitEmuWeightGrad)(self.weight, self.wgrad_ms, self.label)
            y = F.linear(x, w, self.bias)
            return applied(TracekitEmuCompute)(y, self.fwd_ms, self.igrad_ms, self.label)


class SleepLinear(nn.Linear):
    """A Linear whose input and weight each pass ``TracekitSleep``: forward sleeps half the
    layer's forward cost on each, backward the input-grad cost on the input (not run where the
    input needs no gradient: the first layer of stage 0) and the weight-grad cost on the weight."""

    def __init__(self, hidden: int, fwd_ms: float, igrad_ms: float, wgrad_ms: float) -> None:
        super().__init__(hidden, hidden)
        self.fwd_ms, self.igrad_ms, self.wgrad_ms = fwd_ms, igrad_ms, wgrad_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = applied(TracekitSleep)(x, self.fwd_ms / 2, self.igrad_ms)
        w = applied(TracekitSleep)(self.weight, self.fwd_ms / 2, self.wgrad_ms)
        return F.linear(x, w, self.bias)


class TransformerLayer(nn.Module):
    """A pre-norm transformer block over one microbatch's rows (each row a token): attention
    (qkv, softmax over the rows, output projection) and an MLP (4x wide, GELU), each added to
    its input. Its four Linears are ``EmulatedLinear`` with a quarter of the layer's costs."""

    def __init__(self, hidden: int, fwd_ms: float, igrad_ms: float, wgrad_ms: float) -> None:
        super().__init__()
        f, i, w = fwd_ms / 4, igrad_ms / 4, wgrad_ms / 4
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = EmulatedLinear(hidden, f, i, w, out_features=3 * hidden)
        self.proj = EmulatedLinear(hidden, f, i, w)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = EmulatedLinear(hidden, f, i, w, out_features=4 * hidden)
        self.fc2 = EmulatedLinear(4 * hidden, f, i, w, out_features=hidden)
        self.scale = hidden**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(0, 1) * self.scale, dim=-1)
        x = x + self.proj(attention @ v)
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))  # Module calls are Any
        return out


class OnDevice(nn.Module):
    """A stage module computing on ``device`` behind host-side inputs and outputs.

    ``--device cuda`` runs every rank on the one GPU, where NCCL refuses two ranks on one
    device, so P2P stays on gloo, which moves host memory only. The stage's parameters live
    on the GPU; each call copies its input there (``aten::to``, a host-to-device memcpy),
    computes with GPU kernels, and copies the output back (device-to-host; the copy waits
    for the kernels). Autograd runs the two copies' backwards the other way round, so the
    backward's kernels are on the GPU too and the gradient gloo sends is on the host.
    """

    def __init__(self, inner: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.inner = inner.to(device)
        self.device = device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:  # a PipelineStage shape inference that runs the stage on meta tensors
            params = {name: torch.empty_like(p, device="meta") for name, p in self.inner.named_parameters()}
            meta: torch.Tensor = torch.func.functional_call(self.inner, params, (x,))  # Any in torch
            return meta
        y: torch.Tensor = self.inner(x.to(self.device))  # Module.__call__ is Any in torch
        return y.to("cpu")


def build_stage_module(cfg: CaptureConfig, stage: int, layers: list[nn.Module]) -> nn.Module:
    mods: list[nn.Module] = []
    last_layer = cfg.layers - 1
    for i in cfg.layers_of_stage(stage):
        mods.append(layers[i])
        if i != last_layer and cfg.layer_kind != "transformer":  # a transformer block ends in its residual
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def build_layers(cfg: CaptureConfig, replica: int = 0) -> list[nn.Module]:
    """All layers of the model, identical on every rank (same seed); the emulated costs are
    data-parallel ``replica``'s (``--slow-replica``)."""
    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = []
    for i in range(cfg.layers):
        stage = cfg.stage_of_layer(i)
        if cfg.compute == "emulated" and cfg.layer_kind != "linear":
            c = cfg.layer_costs_ms(stage, replica)
            kind = SleepLinear if cfg.layer_kind == "sleep-linear" else TransformerLayer
            layers.append(kind(cfg.width, c["forward"], c["input_grad"], c["weight_grad"]))
        elif cfg.compute == "emulated":
            c = cfg.layer_costs_ms(stage, replica)
            layers.append(
                EmulatedLinear(
                    cfg.width,
                    c["forward"],
                    c["input_grad"],
                    c["weight_grad"],
                    label=f"linear{i}" if cfg.layer_labels else None,
                )
            )
        else:
            layers.append(nn.Linear(cfg.width, cfg.width))
    for layer in layers:
        # He init keeps activations and gradients O(1) through the ReLU stack; with torch's
        # default init they shrink into float32 denormals by the first stage, and CPU matmuls
        # on denormals run ~40x slower (seen: 20 ms instead of 0.5 ms per backward mm).
        # (A Linear layer is its own only Linear: the same draws as ever.)
        for linear in (m for m in layer.modules() if isinstance(m, nn.Linear)):
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
    return layers


def training_data(cfg: CaptureConfig, replica: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inputs and targets of every step (``steps + 2``: two unprofiled steps run first),
    the same on every rank (the generator is seeded alike); only the end stages use them.
    With data parallelism the global batch is ``data_parallel`` times larger and
    ``replica`` takes its own slice (with one replica: the batch as before)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    batch = cfg.microbatches * cfg.microbatch_size
    rows = slice(replica * batch, (replica + 1) * batch)
    dp = cfg.data_parallel
    xs = [torch.randn(dp * batch, cfg.width, generator=gen)[rows] for _ in range(cfg.steps + 2)]
    ys = [torch.randn(dp * batch, cfg.width, generator=gen)[rows] for _ in range(cfg.steps + 2)]
    return xs, ys
