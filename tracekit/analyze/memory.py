"""Activation memory of a schedule: microbatches in flight per rank, and their size.

A forward leaves its activations on the rank until the backward that consumes them has run
(for schedules that split the backward, until the weight-grad ``W``: it still needs the
layer inputs). So, walking a rank's order, the number of (stage, microbatch) pairs whose
forward ran and whose backward has not is the rank's activation memory in chunk units; its
maximum over the order is the peak. This depends on the order only, not on the durations,
so it is read off generated orders (:mod:`tracekit.analyze.schedules`) and measured ones
alike.

A chunk is 1/v of a rank's layers (layers split evenly over the chunks, as the what-if
assumes), so one (stage, microbatch) pair holds ``A / v`` bytes, where ``A`` is what one
microbatch leaves on all of one rank's layers. ``A`` comes, best first, from:

- ``--activation-bytes N``, given by the user;
- the P2P message sizes, as a proxy: the activation a stage sends on is the tensor that
  crosses the stage boundary; each chunk keeps at least its input, so ``A`` is taken as
  v times the median forward message. A lower bound: real layers keep several tensors each.

(The profiler's ``[memory]`` events, ``profile_memory=True``, are not kept by the ingest yet;
see :data:`MEMORY_EVENTS_NOTE`.)

With the global batch kept, a microbatch of a target with ``m`` microbatches carries
measured m / m of the measured rows, and its activations scale the same way (activation
size is linear in the rows: an assumption that holds for dense layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tracekit.analyze.replay import StepGraph
from tracekit.errors import TracekitError
from tracekit.model.run import Run

Action = tuple[str, int, int]  # (kind, stage, microbatch), as in tracekit.analyze.schedules

SOURCE_USER = "--activation-bytes"
SOURCE_P2P = "P2P message sizes (proxy: one boundary tensor per chunk and microbatch, a lower bound)"
MEMORY_EVENTS_NOTE = (
    "the profiler's [memory] events (profile_memory=True) are not read yet; "
    "give --activation-bytes for a measured figure"
)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class ActivationSize:
    """What one microbatch (at the measured microbatch size) leaves on all of one rank's
    layers, and where that figure comes from."""

    bytes_per_microbatch: int
    source: str


def parse_bytes(text: str, option: str) -> int:
    """``2GiB``, ``512MB``, ``1048576`` -> bytes; one-line error naming ``option`` otherwise."""
    raw = text.strip().replace(" ", "")
    number = raw.rstrip("BbKkMmGgIi")
    unit = raw[len(number) :].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not np.isfinite(value) or value <= 0:
        raise TracekitError(f"{option} {text!r}: give a size such as 2GiB, 512MB or 1048576 (bytes)")
    return int(value * _UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def in_flight(order: Iterable[Action]) -> int:
    """The most (stage, microbatch) pairs whose activations one rank holds at once, walking
    its ``order``: a forward adds one; its W (where the order has one for that pair), else
    its B, releases it."""
    actions = list(order)
    released_by_w = {(s, i) for k, s, i in actions if k == "W"}
    held: set[tuple[int, int]] = set()
    peak = 0
    for kind, stage, mb in actions:
        key = (stage, mb)
        if kind == "F":
            held.add(key)
            peak = max(peak, len(held))
        elif kind == "W" or (kind == "B" and key not in released_by_w):
            held.discard(key)
    return peak


def in_flight_per_rank(orders: Mapping[int, Sequence[Action]]) -> dict[int, int]:
    """:func:`in_flight` of every rank's order."""
    return {r: in_flight(order) for r, order in orders.items()}


def orders_of_graph(graph: StepGraph) -> dict[int, list[Action]]:
    """Each rank's order in a step graph (measured or generated), by its rank-order links."""
    following = {int(p): i for i, p in enumerate(graph.prev.tolist()) if p >= 0}
    orders: dict[int, list[Action]] = {}
    for first in np.flatnonzero(graph.prev < 0).tolist():
        order = orders.setdefault(int(graph.rank[first]), [])
        i: int | None = first
        while i is not None:
            order.append((str(graph.kind[i]), int(graph.stage[i]), int(graph.microbatch[i])))
            i = following.get(i)
    return orders


def activation_size(run: Run, activation_bytes: int | None = None) -> ActivationSize:
    """``A`` (see the module doc): the user's figure, else the P2P proxy; a run with neither
    gets a one-line error saying what to give."""
    if activation_bytes is not None:
        return ActivationSize(int(activation_bytes), SOURCE_USER)
    sched = run.schedule
    messages = run.messages
    sizes = messages.loc[(messages["direction"] == "fwd") & (messages["nbytes"] > 0), "nbytes"]
    if sched is None or not len(sizes):
        raise TracekitError(
            f"{run.source}: no forward message with a size (record_shapes=True puts it there), so no "
            f"activation size; {MEMORY_EVENTS_NOTE}"
        )
    return ActivationSize(int(sched.v * float(np.median(sizes.to_numpy()))), SOURCE_P2P)


def peak_activation_bytes(
    orders: Mapping[int, Sequence[Action]], size: ActivationSize, v: int, m: int, measured_m: int, keep: str
) -> tuple[int, int]:
    """(peak chunks in flight on any rank, their bytes) for a target's ``orders`` with ``v``
    chunks a rank and ``m`` microbatches (``keep="global-batch"``: a microbatch's rows, and so
    its activations, scale with measured m / m)."""
    peak = max(in_flight_per_rank(orders).values(), default=0)
    rows = measured_m / m if keep == "global-batch" else 1.0
    return peak, int(round(peak * size.bytes_per_microbatch / v * rows))
