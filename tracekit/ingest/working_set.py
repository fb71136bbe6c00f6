"""The rows of one file that the analysis reads: the per-rank "map" step of ingest.

A GPU rank's trace is ~60k CPU ops a step window, nine in ten of them nested deep inside
the model's modules (``aten::mul`` in ``aten::linear`` in ``nn.Module: ...``). No analysis
looks at those: reconstruction reads step marks, labels, the ops directly inside a label or
a step, communication ops and autograd backward ops; measurement reads GPU work, or where
there is none the top-level CPU ops (a nested op lies inside its parent, so the union of
busy time is the same). Keeping only those rows, in the process that parsed the file,
means a worker sends back and the parent holds a fraction of the file (16% of a GPU trace,
~45% of a pipeline trace) and every cross-rank step works on less.

What is kept, per file (numpy only: this runs in the parser workers):

- every GPU row (kernels, copies, sets, GPU annotations) and the CUDA API call that launched
  it (``runtime``, same ``correlation``), every user annotation (``ProfilerStep#N`` marks,
  ``PP:`` / ``Forward i`` labels, user ranges) and every Python frame kept (the few that name
  actions: Megatron's ``forward_step`` / ``backward_step``);
- every communication row (``c10d::``, ``gloo:``, ``record_param_comms``, ``nccl:``, ...);
- CPU ops at depth <= 1 + the deepest user annotation on their thread, or the deepest
  Python frame's depth (a frame is as deep as the ops it holds; depth 0 on a thread with
  neither): the top-level compute ops of every label and step, whichever label table
  (built-in or the user's ``--label-rule``) names the actions;
- CPU ops with an autograd sequence number, anywhere, when the file holds point-to-point
  ops: ``autograd::engine`` backward ops, and the forward ops that made their nodes, which
  may sit below a composite op that records no number (unlabelled 1F1B reads them to tie
  backwards to forwards);
- each rank's earliest-starting and latest-ending row (a rank without step marks is one
  step spanning all of its events).

``tests/test_working_set.py`` checks that the analysis of every sample run and every shared
real trace is the same from the working set as from all rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tracekit.ingest.columns import EventColumns, take_rows
from tracekit.model.groups import group_ids
from tracekit.model.names import COMM_PREFIXES, FRAME_CATEGORY, LIBRARY_RANGES, RECV_NAMES, SEND_NAMES

ROWS = ("all", "analysis", "reduce")  # "reduce": the working set, then the reducer (ingest.options.Reducer)


def working_set(columns: EventColumns) -> EventColumns:
    """The rows of ``columns`` the analysis reads (see the module doc); same order."""
    n = len(columns)
    if n == 0:
        return columns
    keep = _kept(columns)
    if keep.all():
        return columns
    rows = np.flatnonzero(keep)
    return EventColumns(
        take_rows(columns.numbers, rows),
        take_rows(columns.codes, rows),
        {c: list(v) for c, v in columns.values.items()},
    )


def _kept(columns: EventColumns) -> np.ndarray:
    nums = columns.numbers
    names = columns.values["name"]
    name_code = columns.codes["name"]
    cats = columns.values["cat"]
    cat_code = columns.codes["cat"]

    def by_name(test: Callable[[str], bool]) -> np.ndarray:
        table = np.fromiter((test(s) for s in names), dtype=bool, count=len(names))
        return table[name_code] if len(names) else np.zeros(len(name_code), dtype=bool)

    def by_cat(cat: str) -> np.ndarray:
        codes = [i for i, c in enumerate(cats) if c == cat]  # a category's code (a few categories a file)
        return np.isin(cat_code, codes) if len(codes) > 1 else cat_code == (codes[0] if codes else -1)

    on_gpu = nums["on_gpu"].astype(bool)
    annotation = by_cat("user_annotation")
    frame = by_cat(FRAME_CATEGORY)
    keep: np.ndarray = on_gpu | annotation | frame | by_name(lambda s: s.startswith(COMM_PREFIXES))

    # Top-level compute of every step and label: depth <= deepest mark/label + 1 per thread.
    depth = nums["depth"].astype(np.int64)
    # Any annotation may be a label: which ones are is decided later, by the label rules.
    # Communication libraries' ranges (gloo:recv spans posting to the wait's return) are not.
    # A frame is as deep as the ops it holds: it counts one level up.
    anchor = (annotation & ~on_gpu & ~by_name(lambda s: s.startswith(LIBRARY_RANGES))) | frame
    limit_of_row = _thread_limits(nums["pid"], nums["tid"], anchor, depth - frame)
    # The CUDA API calls that launched the GPU rows (how device work finds its host thread,
    # step and action); the many other API calls (stream queries, events) are not read.
    runtime = by_cat("runtime")
    keep |= ~on_gpu & ~runtime & (depth <= limit_of_row)
    if runtime.any() and on_gpu.any():
        corr = nums["correlation"]
        launched = np.unique(corr[on_gpu & (corr >= 0)])
        keep |= runtime & np.isin(corr, launched)

    if by_name(lambda s: s in SEND_NAMES or s in RECV_NAMES).any():
        keep |= ~on_gpu & (nums["seq"] >= 0)

    ranks = nums["rank"]
    if ranks.min() == ranks.max():  # one rank, as a file mostly is: no search for its rows
        keep[np.argmin(nums["start_ns"])] = keep[np.argmax(nums["end_ns"])] = True
        return keep
    for rank in np.unique(ranks):  # each rank's extent
        mine = np.flatnonzero(ranks == rank)
        keep[mine[np.argmin(nums["start_ns"][mine])]] = True
        keep[mine[np.argmax(nums["end_ns"][mine])]] = True
    return keep


_FEW_THREADS = 8  # threads with annotations, up to which each is found by comparison


def _thread_limits(pid: np.ndarray, tid: np.ndarray, anchor: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each row, 1 + the depth of the deepest anchor on its thread (its pid and tid);
    0 on a thread without one.

    Annotations sit on a few threads (the training loop's, a data loader's): those threads
    are found among the anchors alone and their rows by comparing ids, two passes over the
    rows a thread, not three sorts of every row. More threads than :data:`_FEW_THREADS`
    take the sorts (the same numbers; a test holds the two equal)."""
    limit = np.zeros(len(depth), dtype=np.int64)
    if not anchor.any():
        return limit
    a_pid, a_tid, a_depth = pid[anchor], tid[anchor], depth[anchor]
    pairs, inverse = np.unique(np.stack([a_pid, a_tid]), axis=1, return_inverse=True)
    if pairs.shape[1] > _FEW_THREADS:
        return _thread_limits_sorted(pid, tid, anchor, depth)
    deepest = np.full(pairs.shape[1], -1, dtype=np.int64)
    np.maximum.at(deepest, inverse.reshape(-1), a_depth)
    for (p, t), d in zip(pairs.T.tolist(), deepest.tolist()):
        limit[(pid == p) & (tid == t)] = d + 1
    return limit


def _thread_limits_sorted(pid: np.ndarray, tid: np.ndarray, anchor: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """:func:`_thread_limits` by coding every row's thread (a sort of all rows)."""
    thread = group_ids(pid, tid)  # one code per (pid, tid)
    deepest = np.full(int(thread.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(deepest, thread[anchor], depth[anchor])
    limit: np.ndarray = deepest[thread] + 1
    return limit
