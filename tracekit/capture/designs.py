"""Pipeline designs torch.distributed.pipelining does not have, run by tracekit's own loops.

Imports torch at module level: only the capture code path (a spawned rank) imports it.

Both loops run the capture's model (the same emulated Linear layers, one stage per rank)
with real autograd, real ``torch.distributed.isend`` / ``irecv`` over gloo and real SGD
updates, and label every action the way torch's runtime schedules do
(``record_function("PP:<stage>F<mb>")``, ``PP:<stage>B<mb>``), so the trace reads like a
torch pipelining trace. A label's span holds the receive wait, the compute and the send's
post, as in torch. Each message's tag is its microbatch (slice) id, so a trace names the
microbatch of every message.

* :func:`pipedream_2bw`: PipeDream-2BW (Narayanan et al., ICML'21): 1F1B with no flush,
  microbatches numbered on across steps, a weight update every m microbatches per stage
  from two weight buffers (see :class:`TwoBufferedWeights`). One ``ProfilerStep`` per
  weight update, as a trainer calling ``profiler.step()`` after ``optimizer.step()`` has.
* :func:`terapipe`: TeraPipe (Li et al., ICML'21): each step is one sequence cut into m
  token slices; a layer's attention looks at the slice's own tokens and every earlier
  slice's, so slice i's keys receive gradient from every later slice, and backwards run
  last slice first. Forwards in slice order, then backwards in reverse (GPipe-like, one
  update per sequence). Slice i's emulated cost is ``slice_factor(i)`` times the layer
  cost (:meth:`CaptureConfig.slice_factor`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from tracekit.capture.config import CaptureConfig
from tracekit.capture.model import (
    EmulatedLinear,
    TracekitEmuCompute,
    TracekitEmuWeightGrad,
    applied,
    build_layers,
    build_stage_module,
)

LR = 1e-3


def _label(stage: int, kind: str, mb: int) -> str:
    return f"PP:{stage}{kind}{mb}"


class _Links:
    """This rank's messages to and from its neighbours (one stage per rank)."""

    def __init__(self, rank: int, p: int, shape: tuple[int, int]) -> None:
        self.rank, self.p, self.shape = rank, p, shape
        self.sends: list[dist.Work] = []

    def buffer(self) -> torch.Tensor:
        """A receive buffer, made before the action's label opens (as torch's stages make
        theirs ahead): an op before the wait would count as the action's compute."""
        return torch.empty(self.shape)

    @staticmethod
    def recv(buf: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        work = dist.irecv(buf, src=src, tag=tag)
        assert work is not None  # None only on a rank outside the default group
        work.wait()
        return buf

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        # not waited on here: a gloo send completes once the peer receives it; torch's
        # schedules also wait on sends only at the end of a step (see wait_sends)
        work = dist.isend(tensor.detach().contiguous(), dst=dst, tag=tag)
        assert work is not None  # None only on a rank outside the default group
        self.sends.append(work)

    def wait_sends(self) -> None:
        for work in self.sends:
            work.wait()
        self.sends = []

    def warm_up(self) -> None:
        """One message each way per link before the first recorded step, so that no
        recorded message is a link's first."""
        probe = torch.zeros(self.shape)
        if self.rank + 1 < self.p:
            self.send(probe, self.rank + 1, tag=0)
        if self.rank > 0:
            self.recv(self.buffer(), self.rank - 1, tag=0)
            self.send(probe, self.rank - 1, tag=0)
        if self.rank + 1 < self.p:
            self.recv(self.buffer(), self.rank + 1, tag=0)
        self.wait_sends()


# ---------------------------------------------------------------------------------------
# PipeDream-2BW
# ---------------------------------------------------------------------------------------
def one_f_one_b_no_flush(rank: int, p: int, n: int) -> list[tuple[str, int]]:
    """Stage ``rank``'s action order for ``n`` microbatches: p-rank-1 warm-up forwards, then
    one forward one backward with no flush, then the backwards still in flight."""
    warmup = min(p - rank - 1, n)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < n:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, n)]
    return order


class TwoBufferedWeights:
    """A stage's two weight versions (2BW: double-buffered weights).

    Microbatch j's forward runs on the newest version and its backward on that same version
    (stashed per microbatch), so a microbatch sees one version throughout. Every m
    backwards, the gradients of those m backwards (summed over both buffers: the oldest of
    them started on the previous version) update a copy of the newest version into the
    other buffer, which becomes the newest. That buffer is free: every microbatch that used
    the version it held has finished its backward (checked; needs m >= p)."""

    def __init__(self, module: nn.Module):
        self.buffers = [module, copy.deepcopy(module)]
        self.optimizers = [torch.optim.SGD(b.parameters(), lr=LR) for b in self.buffers]
        self.newest = 0
        self.version = [0, -1]  # weight version held by each buffer
        self.stash: dict[int, int] = {}  # microbatch -> buffer its forward used

    def forward(self, mb: int, x: torch.Tensor) -> torch.Tensor:
        self.stash[mb] = self.newest
        y: torch.Tensor = self.buffers[self.newest](x)  # Module.__call__ is Any in torch
        return y

    def backward_done(self, mb: int) -> None:
        del self.stash[mb]

    def update(self) -> None:
        older = 1 - self.newest
        if older in self.stash.values():
            raise RuntimeError("2BW: a microbatch in flight still uses the buffer to be overwritten")
        for target, newest in zip(self.buffers[older].parameters(), self.buffers[self.newest].parameters()):
            grads = [g for g in (newest.grad, target.grad) if g is not None]
            with torch.no_grad():
                target.copy_(newest)
            target.grad = torch.stack(grads).sum(0) if grads else None
        self.buffers[self.newest].zero_grad(set_to_none=True)
        self.optimizers[older].step()
        self.buffers[older].zero_grad(set_to_none=True)
        self.version[older] = self.version[self.newest] + 1
        self.newest = older


def pipedream_2bw(
    rank: int, cfg: CaptureConfig, prof: torch.profiler.profile, log: Callable[[str], None]
) -> list[float]:
    """Run PipeDream-2BW on this rank: ``(steps + 1) * m`` microbatches, one update (and one
    ``prof.step()``) every m backwards. The profiler's first recorded step is the pipeline's
    start; the last update, not recorded, holds the drain (a 2BW run drains once, at its end).
    Sends are waited on only at the end: with no flush there is no step end at which all
    of them are surely received, and a wait there would stall this rank on its neighbour.
    Returns the mean loss of each update's m microbatches (last stage; else [])."""
    p, m = cfg.ranks, cfg.microbatches
    n = (cfg.steps + 1) * m
    layers = build_layers(cfg)
    weights = TwoBufferedWeights(build_stage_module(cfg, rank, layers))
    links = _Links(rank, p, (cfg.microbatch_size, cfg.width))
    xs, ys = _microbatch_data(cfg, n)
    first, last = rank == 0, rank == p - 1
    loss_fn = nn.MSELoss()
    live: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # mb -> (input, output or loss)
    losses: list[float] = []
    update_losses: list[float] = []

    links.warm_up()
    dist.barrier()
    prof.step()  # warm-up step done: the next one is recorded
    backwards = 0
    for kind, mb in one_f_one_b_no_flush(rank, p, n):
        buf = links.buffer()
        with record_function(_label(rank, kind, mb)):
            if kind == "F":
                x = xs[mb] if first else links.recv(buf, rank - 1, tag=mb).requires_grad_()
                out = weights.forward(mb, x)
                if last:
                    out = loss_fn(out, ys[mb])
                    update_losses.append(float(out.detach()))
                else:
                    links.send(out, rank + 1, tag=mb)
                live[mb] = (x, out)
            else:
                x, out = live.pop(mb)
                grad = None if last else links.recv(buf, rank + 1, tag=mb)
                torch.autograd.backward(out, grad)
                weights.backward_done(mb)
                if not first:
                    assert x.grad is not None  # a received input requires grad
                    links.send(x.grad, rank - 1, tag=mb)
        if kind == "B":
            backwards += 1
            if backwards % m == 0:
                weights.update()
                if last:
                    losses.append(sum(update_losses) / len(update_losses))
                    update_losses = []
                log(f"weight update {backwards // m} (version {weights.version[weights.newest]})")
                prof.step()
    links.wait_sends()
    return losses


# ---------------------------------------------------------------------------------------
# TeraPipe
# ---------------------------------------------------------------------------------------
class SlicedAttentionStage(nn.Module):
    """A stage's layers for token slices: each layer is the emulated Linear followed by
    causal attention over the tokens seen so far (earlier slices' keys, then the slice's own).

    Earlier slices enter as detached leaves (``keys``), so a later slice's backward leaves
    its gradient on them; :meth:`backward` of slice i then pushes those gradients through
    slice i's own graph. That is why backwards run last slice first."""

    def __init__(self, linears: list[EmulatedLinear], last_stage: bool) -> None:
        super().__init__()
        self.linears = nn.ModuleList(linears)
        self.last_stage = last_stage
        self.keys: list[list[torch.Tensor]] = [[] for _ in linears]  # per layer: one leaf per slice
        self.own: dict[int, list[torch.Tensor]] = {}  # slice -> its keys, in its graph

    def reset(self) -> None:
        self.keys = [[] for _ in self.linears]
        self.own = {}

    def forward_slice(self, i: int, x: torch.Tensor, factor: float) -> torch.Tensor:
        own = []
        h = x
        for layer_index, lin in enumerate(self.linears):
            assert isinstance(lin, EmulatedLinear)  # what __init__ took; ModuleList items read as Module
            w = applied(TracekitEmuWeightGrad)(lin.weight, lin.wgrad_ms * factor)
            k = applied(TracekitEmuCompute)(F.linear(h, w, lin.bias), lin.fwd_ms * factor, lin.igrad_ms * factor)
            context = torch.cat([*self.keys[layer_index], k]) if self.keys[layer_index] else k
            scores = k @ context.T / math.sqrt(k.shape[-1])
            # the mean of the two keeps the scale of a plain layer (a sum doubles it per layer)
            h = 0.5 * (k + torch.softmax(scores, dim=-1) @ context)
            own.append(k)
            self.keys[layer_index].append(k.detach().requires_grad_())
            last_layer = layer_index == len(self.linears) - 1
            if not (last_layer and self.last_stage):
                h = torch.relu(h)
        self.own[i] = own
        return h

    def backward_slice(self, i: int, out: torch.Tensor, grad: torch.Tensor | None) -> None:
        """Slice i's backward: the gradient of its output plus what every later slice left
        on its keys."""
        tensors, grads = [out], [grad]
        for layer_index, k in enumerate(self.own.pop(i)):
            leaf_grad = self.keys[layer_index][i].grad
            if leaf_grad is not None:
                tensors.append(k)
                grads.append(leaf_grad)
        torch.autograd.backward(tensors, grads)


def terapipe(rank: int, cfg: CaptureConfig, prof: torch.profiler.profile, log: Callable[[str], None]) -> list[float]:
    """Run TeraPipe on this rank for ``steps + 2`` sequences (the first two not recorded,
    as the torch captures' wait and warm-up steps). Returns each step's mean slice loss
    (last stage; else [])."""
    p, m = cfg.ranks, cfg.microbatches
    layers = build_layers(cfg)
    linears: list[EmulatedLinear] = []
    for i in cfg.layers_of_stage(rank):
        layer = layers[i]
        assert isinstance(layer, EmulatedLinear)  # forward_slice reads the layer's emulated costs
        linears.append(layer)
    stage = SlicedAttentionStage(linears, last_stage=rank == p - 1)
    optimizer = torch.optim.SGD(stage.parameters(), lr=LR)
    links = _Links(rank, p, (cfg.microbatch_size, cfg.width))
    first, last = rank == 0, rank == p - 1
    loss_fn = nn.MSELoss()
    losses: list[float] = []
    for step in range(cfg.steps + 2):
        xs, ys = _microbatch_data(cfg, m, sequence=step)
        stage.reset()
        optimizer.zero_grad(set_to_none=True)
        live: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        step_losses: list[float] = []
        for kind, i in terapipe_order(m):
            buf = links.buffer()
            with record_function(_label(rank, kind, i)):
                if kind == "F":
                    x = xs[i] if first else links.recv(buf, rank - 1, tag=i).requires_grad_()
                    out = stage.forward_slice(i, x, cfg.slice_factor(i))
                    if last:
                        out = loss_fn(out, ys[i])
                        step_losses.append(float(out.detach()))
                    else:
                        links.send(out, rank + 1, tag=i)
                    live[i] = (x, out)
                else:
                    x, out = live.pop(i)
                    grad = None if last else links.recv(buf, rank + 1, tag=i)
                    stage.backward_slice(i, out, grad)
                    if not first:
                        assert x.grad is not None  # a received input requires grad
                        links.send(x.grad, rank - 1, tag=i)
        optimizer.step()
        links.wait_sends()
        if last:
            losses.append(sum(step_losses) / len(step_losses))
        log(f"sequence {step} done")
        prof.step()
    return losses


def terapipe_order(m: int) -> list[tuple[str, int]]:
    """Every stage's order: forwards in slice order, then backwards last slice first."""
    return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]


def _microbatch_data(cfg: CaptureConfig, n: int, sequence: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``n`` input and target microbatches (slices), the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1 + 1000 * sequence)
    xs = [torch.randn(cfg.microbatch_size, cfg.width, generator=gen) for _ in range(n)]
    ys = [torch.randn(cfg.microbatch_size, cfg.width, generator=gen) for _ in range(n)]
    return xs, ys


RUNNERS = {"PipeDream2BW": pipedream_2bw, "TeraPipe": terapipe}
