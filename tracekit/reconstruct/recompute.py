"""Activation recomputation: the forward ops a backward runs again.

A checkpointed region saves only its inputs in the forward and runs its forward again when
the backward needs the activations: reentrant checkpointing inside its own backward node
(Megatron's ``CheckpointFunction``, megatron/core/tensor_parallel/random.py; torch's
``CheckpointFunction``: the node ``CheckpointFunctionBackward``), non-reentrant
``torch.utils.checkpoint`` from the saved-tensor hooks of the first backward node that unpacks
one (torch/utils/checkpoint.py, ``_checkpoint_hook``), with no range of its own. Either way the
re-run ops run with grad enabled, so autograd numbers them, inside a backward node's range
(``autograd::engine::evaluate_function: X``) whose own number they do not share; a backward's
own ops (the ``aten::mm`` of an ``AddmmBackward0``) carry no number.

So a recomputed op is one with a sequence number, inside a backward node's range on its
thread, that is no backward range itself and whose number is not the range's.
"""

from __future__ import annotations

import numpy as np

from tracekit.model.groups import group_ids, holding
from tracekit.reconstruct.event_arrays import EventArrays

BACKWARD_RANGE = "autograd::engine::evaluate_function"


def recomputed(events: EventArrays) -> tuple[np.ndarray, np.ndarray]:
    """Per event: whether it is a recomputed forward op (module doc), and the row of the
    innermost backward range holding it (-1 where it is none)."""
    out = np.zeros(len(events), dtype=bool)
    holder = np.full(len(events), -1, dtype=np.int64)
    if not len(events):
        return out, holder
    on_cpu = ~events["on_gpu"]
    backward = on_cpu & events.starts_with(BACKWARD_RANGE)
    numbered = on_cpu & (events["seq"] >= 0) & ~backward
    if not backward.any() or not numbered.any():
        return out, holder
    thread = group_ids(events["rank"].astype(np.int64), events["tid"].astype(np.int64))
    start, end, seq = events["start_ns"], events["end_ns"], events["seq"]
    ranges, candidates = np.flatnonzero(backward), np.flatnonzero(numbered)
    # the innermost backward range holding each op: the latest-starting range of its thread
    # at or before it, where that one still runs (holding)
    inner = holding(thread[ranges], start[ranges], end[ranges], thread[candidates], start[candidates])
    # backward ranges nest (a reentrant checkpoint's inner backward): past a nested range's
    # end, the range around it holds the op. Those few are where a range of the thread that
    # started before the op still runs (the ranges' running reach): look outwards for them
    reach = end[ranges].astype(np.int64).copy()
    by_thread = np.lexsort((start[ranges], thread[ranges]))
    for segment in np.split(by_thread, np.flatnonzero(np.diff(thread[ranges][by_thread])) + 1):
        reach[segment] = np.maximum.accumulate(reach[segment])
    outer = holding(thread[ranges], start[ranges], reach, thread[candidates], start[candidates])
    for i in np.flatnonzero((inner < 0) & (outer >= 0)).tolist():
        mine = ranges[(thread[ranges] == thread[candidates[i]]) & (start[ranges] <= start[candidates[i]])]
        around = mine[end[mine] >= start[candidates[i]]]
        if len(around):
            inner[i] = int(np.flatnonzero(ranges == around[np.argmax(start[around])])[0])
    found = inner >= 0
    found[found] = seq[ranges[inner[found]]] != seq[candidates[found]]
    out[candidates[found]] = True
    holder[candidates[found]] = ranges[inner[found]]
    return out, holder


def recompute_rows(events: EventArrays) -> np.ndarray:
    """The rows :func:`recompute_spans` reads: the recomputed ops and the backward ranges
    holding them (what a reduced rank keeps of them)."""
    ops, holder = recomputed(events)
    keep = ops.copy()
    keep[holder[ops]] = True
    return keep


def recompute_spans(events: EventArrays) -> dict[str, np.ndarray]:
    """Each recomputation: per backward range holding recomputed ops, from the first of them
    to the last (the ops in between without a number, views and copies, are part of it), on
    its rank and thread: columns rank, tid, start_ns, end_ns."""
    ops, holder = recomputed(events)
    rows = np.flatnonzero(ops)
    if not len(rows):
        empty = np.zeros(0, dtype=np.int64)
        return {"rank": empty, "tid": empty, "start_ns": empty, "end_ns": empty}
    # a nested range's recomputation is its own (a reentrant checkpoint inside another)
    ranges = np.unique(holder[rows])
    starts = np.full(len(ranges), np.iinfo(np.int64).max, dtype=np.int64)
    ends = np.full(len(ranges), np.iinfo(np.int64).min, dtype=np.int64)
    which = np.searchsorted(ranges, holder[rows])
    np.minimum.at(starts, which, events["start_ns"][rows].astype(np.int64))
    np.maximum.at(ends, which, events["end_ns"][rows].astype(np.int64))
    return {
        "rank": events["rank"][ranges].astype(np.int64),
        "tid": events["tid"][ranges].astype(np.int64),
        "start_ns": starts,
        "end_ns": ends,
    }
