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
- the profiler's ``[memory]`` events (traces recorded with ``profile_memory=True``,
  :mod:`tracekit.ingest.kineto_memory`): what a rank holds when its first backward starts
  (the allocator's total then minus when its first forward started), per forward run by
  then, median over steps, times v. Held, not transient: a forward also allocates its output,
  which is freed once sent. Per rank, so the fullest rank is the one whose in-flight count
  times its own size is largest;
- the P2P message sizes, as a proxy: the activation a stage sends on is the tensor that
  crosses the stage boundary; each chunk keeps at least its input, so ``A`` is taken as
  v times the median forward message. A lower bound: real layers keep several tensors each.

With the global batch kept, a microbatch of a target with ``m`` microbatches carries
measured m / m of the measured rows, and its activations scale the same way (activation
size is linear in the rows: an assumption that holds for dense layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tracekit.analyze.grouping import int_groups
from tracekit.analyze.replay import StepGraph
from tracekit.errors import TracekitError
from tracekit.ingest.kineto_memory import MemoryEvents
from tracekit.model.run import Run

Action = tuple[str, int, int]  # (kind, stage, microbatch), as in tracekit.analyze.schedules
# An order's entry: an action, or a fused pair run back to back in one label (DualPipeV's
# OVERLAP_F_B), whose halves hold and release like any two actions
Entry = Action | tuple[Action, Action]

SOURCE_USER = "--activation-bytes"
SOURCE_P2P = "P2P message sizes (proxy: one boundary tensor per chunk and microbatch, a lower bound)"
SOURCE_MEMORY = "the profiler's [memory] events (held per forward in flight at a step's first backward, per rank)"
MEMORY_EVENTS_NOTE = "record with profile_memory=True (tracekit capture --profile-memory) or give --activation-bytes"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class ActivationSize:
    """What one microbatch (at the measured microbatch size) leaves on all of one rank's
    layers, and where that figure comes from."""

    bytes_per_microbatch: int  # the largest rank's, where they differ
    source: str
    per_rank: dict[int, int] = field(default_factory=dict)  # rank -> its own, where measured per rank

    def of_rank(self, rank: int) -> int:
        return self.per_rank.get(rank, self.bytes_per_microbatch)


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


def _actions(order: Iterable[Entry]) -> list[Action]:
    out: list[Action] = []
    for entry in order:
        if isinstance(entry[0], tuple):
            out.extend(entry)  # a fused pair: its two actions in turn
        else:
            out.append(entry)
    return out


def in_flight(order: Iterable[Entry]) -> int:
    """The most (stage, microbatch) pairs whose activations one rank holds at once, walking
    its ``order``: a forward adds one; its W (where the order has one for that pair), else
    its B, releases it."""
    actions = _actions(order)
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


def in_flight_per_rank(orders: Mapping[int, Sequence[Entry]]) -> dict[int, int]:
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


def activation_size(
    run: Run, activation_bytes: int | None = None, memory: Mapping[int, MemoryEvents] | None = None
) -> ActivationSize:
    """``A`` (see the module doc): the user's figure, else the profiler's memory events
    (``memory``: per rank, where the traces have them), else the P2P proxy; a run with none
    gets a one-line error saying what to give."""
    if activation_bytes is not None:
        return ActivationSize(int(activation_bytes), SOURCE_USER)
    measured = activation_size_from_memory(run, memory or {})
    if measured is not None:
        return measured
    sched = run.schedule
    messages = run.messages
    sizes = messages.loc[(messages["direction"] == "fwd") & (messages["nbytes"] > 0), "nbytes"]
    if sched is None or not len(sizes):
        raise TracekitError(
            f"{run.source}: no forward message with a size (record_shapes=True puts it there), so no "
            f"activation size; {MEMORY_EVENTS_NOTE}"
        )
    return ActivationSize(int(sched.v * float(np.median(sizes.to_numpy()))), SOURCE_P2P)


def activation_size_from_memory(run: Run, memory: Mapping[int, MemoryEvents]) -> ActivationSize | None:
    """``A`` per rank from the profiler's memory events (None where no rank has any; see the
    module doc). The events' clock is put on the run's by the ProfilerStep starts both hold;
    device allocations are preferred over host ones where there are both."""
    sched = run.schedule
    if sched is None:
        return None
    actions = run.actions[run.actions["step"] >= 0]
    # device timeline: allocations are made at host time
    start_col = "host_start_ns" if "host_start_ns" in actions else "start_ns"
    per_rank: dict[int, int] = {}
    for rank, found in memory.items():
        events = found.events
        if not len(events):
            continue
        device = 1 if (events["device_type"] == 1).any() else 0
        events = events[events["device_type"] == device]
        steps = run.steps[run.steps["rank"] == rank]
        gaps = [
            start - found.step_starts_ns[step]
            for step, start in zip(steps["step"].tolist(), steps["step_start_ns"].tolist())
            if step in found.step_starts_ns
        ]
        if not gaps or not len(events):
            continue
        times = events["ts_ns"].to_numpy(dtype=np.int64) + int(np.median(gaps))
        totals = events["total_allocated"].to_numpy(dtype=np.int64)

        held = []
        for (_,), acts in int_groups(actions[actions["rank"] == rank], ["step"]):
            acts = acts.sort_values(start_col)
            kinds = acts["kind"].tolist()
            first_back = next((i for i, k in enumerate(kinds) if k != "F"), None)
            if not first_back:  # no forward before the first backward (or no backward)
                continue
            starts = acts[start_col].tolist()
            rise = _allocated_at(times, totals, starts[first_back]) - _allocated_at(times, totals, starts[0] - 1)
            held.append(rise / first_back)
        if held:
            per_rank[int(rank)] = int(sched.v * max(0.0, float(np.median(held))))
    if not per_rank:
        return None
    return ActivationSize(max(per_rank.values()), SOURCE_MEMORY, per_rank)


def _allocated_at(times: np.ndarray, totals: np.ndarray, at: int) -> int:
    """The allocator's total at time ``at``: that of the last event at or before it (0 before any)."""
    i = int(np.searchsorted(times, at, side="right")) - 1
    return int(totals[i]) if i >= 0 else 0


def peak_activation_bytes(
    orders: Mapping[int, Sequence[Entry]],
    size: ActivationSize,
    v: int,
    m: int,
    measured_m: int,
    keep: str,
    ranks: Sequence[int] | None = None,
) -> tuple[int, int]:
    """(peak chunks in flight on any rank, the most bytes any rank holds) for a target's
    ``orders`` with ``v`` chunks a rank and ``m`` microbatches (``keep="global-batch"``: a
    microbatch's rows, and so its activations, scale with measured m / m). ``ranks``: the
    measured rank of each order's key (generated orders count ranks from 0)."""
    counts = in_flight_per_rank(orders)
    held = activation_bytes_per_rank(orders, size, v, m, measured_m, keep, ranks)
    return max(counts.values(), default=0), max(held.values(), default=0)


def activation_bytes_per_rank(
    orders: Mapping[int, Sequence[Entry]],
    size: ActivationSize,
    v: int,
    m: int,
    measured_m: int,
    keep: str,
    ranks: Sequence[int] | None = None,
) -> dict[int, int]:
    """Each order's rank (its key) -> the most activation bytes it holds at once: its peak
    in flight times one chunk's share (``size`` of its measured rank / ``v``), with the rows
    scaled as :func:`peak_activation_bytes` says."""
    rows = measured_m / m if keep == "global-batch" else 1.0
    return {
        r: int(round(n * size.of_rank(ranks[r] if ranks is not None else r) / v * rows))
        for r, n in in_flight_per_rank(orders).items()
    }


def layer_activation_bytes(
    size: ActivationSize, n_layers: int, measured_split: Sequence[int] | None, stage_rank: Mapping[int, int]
) -> list[float]:
    """What one microbatch (at the measured size) leaves on each layer, for sizing a split
    whose stages hold other layers: a rank's measured activations (``size``) shared evenly
    over the layers it ran (``measured_split``: layers per measured stage, ``stage_rank``:
    each measured stage's rank). Without a measured split of that many stages, every layer
    gets an equal share of the mean rank's activations times the ranks."""
    if measured_split is not None and sum(measured_split) == n_layers and len(stage_rank) == len(measured_split):
        rank_layers: dict[int, int] = {}
        for stage, n in enumerate(measured_split):
            rank_layers[stage_rank[stage]] = rank_layers.get(stage_rank[stage], 0) + n
        out: list[float] = []
        for stage, n in enumerate(measured_split):
            rank = stage_rank[stage]
            out += [size.of_rank(rank) / rank_layers[rank]] * n
        return out
    ranks = sorted(set(stage_rank.values())) or [0]
    total = sum(size.of_rank(r) for r in ranks)
    return [total / n_layers] * n_layers


def split_activation_bytes(
    orders: Mapping[int, Sequence[Entry]],
    stage_bytes: Sequence[float],
    m: int,
    measured_m: int,
    keep: str,
) -> dict[int, int]:
    """Each order's rank -> the most activation bytes it holds at once when stage ``s`` keeps
    ``stage_bytes[s]`` per microbatch in flight (a split of the layers: each stage its own
    layers' share), rows scaled as :func:`peak_activation_bytes` says."""
    rows = measured_m / m if keep == "global-batch" else 1.0
    out: dict[int, int] = {}
    for r, order in orders.items():
        actions = _actions(order)
        released_by_w = {(s, i) for k, s, i in actions if k == "W"}
        held: set[tuple[int, int]] = set()
        now = peak = 0.0
        for kind, stage, mb in actions:
            key = (stage, mb)
            if kind == "F" and key not in held:
                held.add(key)
                now += stage_bytes[stage]
                peak = max(peak, now)
            elif (kind == "W" or (kind == "B" and key not in released_by_w)) and key in held:
                held.discard(key)
                now -= stage_bytes[stage]
        out[r] = int(round(peak * rows))
    return out
