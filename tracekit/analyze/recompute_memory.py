"""What activation recomputation saves in memory, per rank, from the traces' op shapes.

A checkpointed region keeps only its input through the forward and rebuilds the rest in the
backward (:mod:`tracekit.reconstruct.recompute` finds the re-run ops). Switched off, the
forward would keep what those ops keep for their backward. Sized from ``record_shapes``
(:mod:`tracekit.ingest.kineto_shapes`), per recomputation (a backward range holding re-run
ops), over its top-level re-run ops (those no other re-run op holds):

- each keeps about one tensor the size of its first input, the activation (a linear its input
  for the weight gradient, an activation function its input or output): an estimate, as ops
  that keep more (attention, dropout masks) or share a tensor with the next op make it off;
- a first input is an activation where its leading dimension is the microbatch's, the one
  most of the re-run ops' first inputs share (tokens or sequence); others (a weight handed to
  a custom Function) are parameters, held either way, and not counted;
- with recomputation on, a microbatch in flight keeps the first activation (the
  checkpoint's input); off, all of them.

Per rank the median over its recomputations (a chunk's, with v > 1) times the most
microbatches (chunks) the rank holds at once (:func:`tracekit.analyze.memory.in_flight` of its
measured order): off, that many times all activations; on, that many times the checkpoint's
input plus one microbatch's activations rebuilt in a backward. Weights, gradients,
optimizer state and temporaries inside an action are the same either way and not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.grouping import int_groups
from tracekit.analyze.memory import in_flight
from tracekit.model.run import Run
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.recompute import recomputed

SOURCE = (
    "record_shapes' Input Dims of the forward ops each backward re-ran, one tensor the size of each op's "
    "first input (an estimate; inputs without the microbatch's leading dimension, parameters, not counted). "
    "On: the checkpoint's input per microbatch in flight + one microbatch rebuilt in its backward; "
    "off: all of them per microbatch in flight"
)


@dataclass(frozen=True)
class RankRecomputeMemory:
    """One rank's activation memory with recomputation on (as measured) and off; sizes None
    where its re-run ops have no recorded shapes."""

    rank: int
    stages: list[int]
    in_flight: int  # most microbatches (chunks) held at once
    recomputations: int  # those sized
    kept_per_microbatch_bytes: int | None  # on: the checkpoint's input
    activations_per_microbatch_bytes: int | None  # off: every re-run op's activation

    @property
    def peak_on_bytes(self) -> int | None:
        if self.kept_per_microbatch_bytes is None or self.activations_per_microbatch_bytes is None:
            return None
        rebuilt = self.activations_per_microbatch_bytes - self.kept_per_microbatch_bytes
        return self.in_flight * self.kept_per_microbatch_bytes + rebuilt

    @property
    def peak_off_bytes(self) -> int | None:
        if self.activations_per_microbatch_bytes is None:
            return None
        return self.in_flight * self.activations_per_microbatch_bytes

    def to_dict(self) -> dict[str, Any]:
        on, off = self.peak_on_bytes, self.peak_off_bytes
        return {
            "rank": self.rank,
            "stages": list(self.stages),
            "in_flight": self.in_flight,
            "recomputations_sized": self.recomputations,
            "kept_per_microbatch_bytes": self.kept_per_microbatch_bytes,
            "activations_per_microbatch_bytes": self.activations_per_microbatch_bytes,
            "peak_recompute_on_bytes": on,
            "peak_recompute_off_bytes": off,
            "saved_bytes": None if on is None or off is None else off - on,
        }


@dataclass(frozen=True)
class RecomputeMemory:
    """Per rank :class:`RankRecomputeMemory`; ``unsized`` says why ranks could not be sized
    (None where all were)."""

    ranks: list[RankRecomputeMemory]
    source: str
    unsized: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "unsized": self.unsized, "ranks": [r.to_dict() for r in self.ranks]}


def recompute_memory(run: Run, ops_by_rank: Mapping[int, pd.DataFrame], recomputing: Iterable[int]) -> RecomputeMemory:
    """The activation memory on and off (module doc) of each rank in ``recomputing`` (those
    the run found recomputing), from its host ops (``ops_by_rank``:
    :func:`tracekit.ingest.kineto_shapes.read_op_inputs` of its file; none for a file of
    another format)."""
    actions = run.actions[run.actions["step"] >= 0]
    held: dict[int, int] = {}
    stages: dict[int, list[int]] = {}
    for (rank,), mine in int_groups(actions, ["rank"]):
        stages[rank] = sorted({int(s) for s in mine["stage"].tolist()})
        orders = [
            list(zip(step["kind"].astype(str), step["stage"].astype(int), step["microbatch"].astype(int)))
            for _, step in mine.sort_values("start_ns", kind="stable").groupby("step", sort=True)
        ]
        held[rank] = max((in_flight(order) for order in orders), default=0)
    rows = []
    no_ops: list[int] = []
    no_shapes: list[int] = []
    for rank in sorted(set(recomputing)):
        ops = ops_by_rank.get(rank)
        sizes = _sizes(ops) if ops is not None and not ops.empty else None
        if sizes is None:
            no_ops.append(rank)
        elif not sizes:
            no_shapes.append(rank)
        kept = int(np.median([k for k, _ in sizes])) if sizes else None
        everything = int(np.median([a for _, a in sizes])) if sizes else None
        n = len(sizes) if sizes else 0
        rows.append(RankRecomputeMemory(rank, stages.get(rank, []), held.get(rank, 0), n, kept, everything))
    why = [
        f"{_ranks(no_ops)}: no re-run ops in the trace file (only Kineto files hold op shapes)" if no_ops else "",
        f"{_ranks(no_shapes)}: the re-run ops have no recorded shapes (record with record_shapes=True)"
        if no_shapes
        else "",
    ]
    return RecomputeMemory(rows, SOURCE, "; ".join(w for w in why if w) or None)


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _sizes(ops: pd.DataFrame) -> list[tuple[int, int]] | None:
    """Per recomputation in ``ops`` (one file's host ops), (the checkpoint's input, every re-run
    op's activation) in bytes (module doc); None where no op was re-run, [] where none of the
    recomputations has shapes."""
    if ops.empty:
        return None
    names = ops["name"].astype("category")
    events = EventArrays(
        {
            "rank": np.zeros(len(ops), dtype=np.int64),
            "tid": ops["tid"].to_numpy(np.int64),
            "start_ns": ops["start_ns"].to_numpy(np.int64),
            "end_ns": ops["end_ns"].to_numpy(np.int64),
            "seq": ops["seq"].to_numpy(np.int64),
            "on_gpu": np.zeros(len(ops), dtype=bool),
        },
        {"name": names.cat.codes.to_numpy()},
        {"name": [str(v) for v in names.cat.categories]},
    )
    again, holder = recomputed(events)
    rows = np.flatnonzero(again)
    if not len(rows):
        return None
    start, end = events["start_ns"], events["end_ns"]
    dims = ops["input_dims"].astype(str).to_numpy()
    nbytes = ops["input_bytes"].to_numpy(np.int64)
    regions = []
    for h in np.unique(holder[rows]).tolist():
        mine = rows[holder[rows] == h]
        mine = mine[np.argsort(start[mine], kind="stable")]
        top, reach = [], np.iinfo(np.int64).min
        for i in mine.tolist():
            if start[i] >= reach:  # not inside the previous top-level op
                top.append(i)
                reach = int(end[i])
        regions.append([i for i in top if nbytes[i] >= 0])
    leading = Counter(dims[i].split(",")[0] for shaped in regions for i in shaped)
    if not leading:
        return []
    rows_dim = leading.most_common(1)[0][0]
    out = []
    for shaped in regions:
        activations = [int(nbytes[i]) for i in shaped if dims[i].split(",")[0] == rows_dim]
        if activations:
            out.append((activations[0], sum(activations)))
    return out
