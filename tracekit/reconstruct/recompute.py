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
    key = events["rank"].astype(np.int64) * (1 << 40) + events["tid"].astype(np.int64) % (1 << 40)
    start, end, seq = events["start_ns"], events["end_ns"], events["seq"]
    ranges = np.flatnonzero(backward)
    ranges = ranges[np.lexsort((start[ranges], key[ranges]))]
    r_key, r_start, r_end, r_seq = key[ranges], start[ranges], end[ranges], seq[ranges]
    candidates = np.flatnonzero(numbered)
    c_key, c_start = key[candidates], start[candidates]
    # the innermost backward range holding each op: the latest-starting range of its thread
    # that starts at or before it and still runs; backward ranges nest (a reentrant
    # checkpoint's inner backward), so walk outwards from the latest, and only where some
    # range before it still runs (the ranges' running reach)
    for thread in np.unique(c_key):
        mine = np.flatnonzero(r_key == thread)
        if not len(mine):
            continue
        reach = np.maximum.accumulate(r_end[mine])
        rows = np.flatnonzero(c_key == thread)
        k = np.searchsorted(r_start[mine], c_start[rows], side="right") - 1
        held = (k >= 0) & (reach[np.maximum(k, 0)] >= c_start[rows])
        for i, j in zip(rows[held].tolist(), k[held].tolist()):
            t, q = int(c_start[i]), int(seq[candidates[i]])
            while j >= 0 and r_end[mine[j]] < t:
                j -= 1
            if j >= 0 and int(r_seq[mine[j]]) != q:
                out[candidates[i]] = True
                holder[candidates[i]] = ranges[mine[j]]
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
    ranges, first = np.unique(holder[rows], return_index=True)
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
