"""Each action's fixed part: the time of its span that does not scale with a microbatch's rows.

A compute action is a few large ops (the layers' matmuls, attention, a sleep in the emulated
model) and many small ones (views, adds, autograd bookkeeping), with the host's time between
ops. A microbatch of fewer rows (``tracekit whatif --keep global-batch``) shrinks the large
ops; the small ops' dispatch and the gaps between ops stay. So what-if needs, per action, how
much of it is fixed: its span less the time its **work ops** cover, a work op being a host op
that alone takes at least :data:`WORK_OP_SHARE` of the action's span (nested ones counted
as their outermost; communication ops and Python frames are never work). On the project's
1F1B samples that is 1.0 ms of a 13.8 ms forward at m=8 and 0.94 of 7.6 ms at m=16 with the
same global batch.

Computed where the actions are found (:func:`tracekit.reconstruct.actions.action_table`),
from the ops around them, so a rank's reduce carries it as the action column ``fixed_ns``
and every load has it, whether or not it keeps the ops. The device timeline does not use it
(an action's compute there is its kernels' busy time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tracekit.model.intervals import union_length, union_lengths
from tracekit.model.names import COMM_PREFIXES, FRAME_CATEGORY
from tracekit.reconstruct.event_arrays import EventArrays

#: an op is a work op of its action when it alone takes at least this share of the action's span
WORK_OP_SHARE = 0.05


def fixed_ns(events: EventArrays, actions: Mapping[str, Any]) -> np.ndarray:
    """Per action of ``actions`` (columns ``rank``, ``start_ns``, ``end_ns``), the ns of its
    span outside its work ops (see the module), from the host ops of ``events`` on its rank
    that start and end inside it. 0 for an action with no op read inside it: all of it then
    scales with the rows, as it did before this part was measured."""
    ranks = np.asarray(actions["rank"], dtype=np.int64)
    a0 = np.asarray(actions["start_ns"], dtype=np.int64)
    a1 = np.asarray(actions["end_ns"], dtype=np.int64)
    out = np.zeros(len(ranks), dtype=np.int64)
    if not len(ranks) or not len(events):
        return out
    ops = np.flatnonzero(
        ~events["on_gpu"] & ~events.starts_with(COMM_PREFIXES) & ~events.is_in("cat", (FRAME_CATEGORY,))
    )
    # the ops sorted by rank, then start: each rank's ops one slice (one sort, not one scan a rank)
    op_ranks, op_starts = events["rank"][ops], events["start_ns"][ops]
    order = np.lexsort((op_starts, op_ranks))
    op_ranks, op_starts, op_ends = op_ranks[order], op_starts[order], events["end_ns"][ops][order]
    by_rank = np.argsort(ranks, kind="stable")
    rank_of, at = np.unique(ranks[by_rank], return_index=True)
    for rank, mine in zip(rank_of.tolist(), np.split(by_rank, at[1:])):
        first, last = np.searchsorted(op_ranks, rank, "left"), np.searchsorted(op_ranks, rank, "right")
        starts, ends = op_starts[first:last], op_ends[first:last]
        mine = mine[np.argsort(a0[mine], kind="stable")]
        begins, stops = a0[mine], a1[mine]
        if (begins[1:] < stops[:-1]).any():  # actions that overlap on this rank: one at a time
            out[mine] = [_one(starts, ends, int(b), int(e)) for b, e in zip(begins, stops)]
        else:
            out[mine] = _apart(starts, ends, begins, stops)
    return out


def _one(starts: np.ndarray, ends: np.ndarray, begin: int, end: int) -> int:
    """One action's fixed part, from its rank's ops sorted by start."""
    lo, hi = np.searchsorted(starts, begin, "left"), np.searchsorted(starts, end, "right")
    s, e = starts[lo:hi], ends[lo:hi]
    inside = e <= end
    if not inside.any():
        return 0
    work = inside & (e - s >= (end - begin) * WORK_OP_SHARE)
    return max(0, end - begin - union_length(s[work], e[work], begin, end))


def _apart(starts: np.ndarray, ends: np.ndarray, begins: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """:func:`_one` of every action of one rank at once, the actions sorted by start and apart
    (none starts before the one before it ends): each op belongs to the last action starting
    at or before it, if it also ends within it."""
    n = len(begins)
    at = np.searchsorted(begins, starts, "right") - 1
    ok = at >= 0
    at_ok = np.where(ok, at, 0)
    inside = ok & (ends <= stops[at_ok])
    has_op = np.bincount(at[inside], minlength=n) > 0
    spans = stops - begins
    work = inside & ((ends - starts) >= spans[at_ok] * WORK_OP_SHARE)
    covered = union_lengths(at[work], starts[work], ends[work], begins, stops)
    return np.where(has_op, np.maximum(0, spans - covered), 0)
