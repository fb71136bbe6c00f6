"""The device-op table's columns from events, without pandas: where a GPU rank's file was
parsed (:mod:`.per_rank`) and, for a whole run's events table, in
:func:`tracekit.reconstruct.device.device_ops` (one implementation).

Each kernel, memcpy and memset is joined to the CUDA API call that launched it (a
``runtime`` row of the same rank and ``correlation`` id; the first such row where a
correlation repeats), and given the step its launch falls in (where it ran, without a
launch) and a kind decided once per distinct name: ``p2p`` (Nsight Systems' reader names
the kernels it proved P2P by their launch ``nccl:SendRecv|...``), ``collective`` (any other
NCCL/RCCL kernel) or ``compute``. Rows stay in event order; the table is sorted where the
ranks' columns are put together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.model.groups import first_rows, group_ids, pair_codes
from tracekit.model.device import BEFORE_PROFILE
from tracekit.model.run import DEVICE_OP_COLUMNS
from tracekit.reconstruct.event_arrays import DEVICE_CATEGORIES, LAUNCH_CATEGORY, EventArrays
from tracekit.reconstruct.steps import step_of

if TYPE_CHECKING:
    import pandas as pd

COMM_KERNEL = re.compile(r"nccl|rccl", re.IGNORECASE)
# Nsight Systems' reader names the kernels it proved P2P by their launch this way.
NSYS_P2P_PREFIX = "nccl:SendRecv|"
# The numeric columns of one set of ops (``name`` is ``name_code`` into ``names``; ``op_id``,
# ``kind`` and ``action_id`` are the run's, given where the sets are put together).
NUMBER_COLUMNS = tuple(c for c in DEVICE_OP_COLUMNS if c not in ("op_id", "kind", "action_id", "name"))


def launched_before_profile(
    rank: np.ndarray, stream: np.ndarray, start: np.ndarray, launch_ns: np.ndarray
) -> np.ndarray:
    """Which ops were launched before the profile began: those with no launch call in the
    trace that ran on their stream before the stream's first op whose launch the trace holds.

    A stream runs its ops in launch order, so an op that ran before one launched inside the
    profile was launched earlier still; where the profiler started mid-step (the host ahead
    of the device by most of a step), those ops are the previous step's work, not the first
    profiled step's. A stream of a rank with no launch in the trace says nothing: none."""
    launched = launch_ns >= 0
    if not launched.any() or launched.all():
        return np.zeros(len(start), dtype=bool)
    group = group_ids(rank, stream)
    never = np.iinfo(np.int64).max
    first = np.full(int(group.max()) + 1, never, dtype=np.int64)  # each stream's first launched op
    np.minimum.at(first, group[launched], start[launched])
    before_launches: np.ndarray = ~launched & (first[group] != never) & (start < first[group])
    return before_launches


def op_kind(name: str) -> str:
    """``p2p``, ``collective`` or ``compute``, from a device op's name (see the module doc)."""
    return "p2p" if name.startswith(NSYS_P2P_PREFIX) else "collective" if COMM_KERNEL.search(name) else "compute"


def op_columns(events: EventArrays, steps: pd.DataFrame | Mapping[str, Any]) -> dict[str, Any]:
    """The device ops of ``events`` in event order: :data:`NUMBER_COLUMNS` as int64 arrays,
    ``name_code`` (int64) into ``names`` (the distinct names of these ops).
    ``steps``: a step table holding these events' ranks (:func:`~.steps.step_table`)."""
    on_gpu, cats = events["on_gpu"], events.is_in("cat", DEVICE_CATEGORIES)
    ops = np.flatnonzero(on_gpu & cats)
    correlation = events["correlation"].astype(np.int64)
    launches = np.flatnonzero(events.is_in("cat", (LAUNCH_CATEGORY,)) & (correlation >= 0))
    ranks = events["rank"].astype(np.int64)
    n = len(ops)
    launch_ns = np.full(n, -1, dtype=np.int64)
    launch_end_ns = np.full(n, -1, dtype=np.int64)
    launch_tid = np.full(n, -1, dtype=np.int64)
    if n and len(launches):
        op_code, launch_code = pair_codes(ranks[ops], correlation[ops], (ranks[launches], correlation[launches]))
        launch = first_rows(launch_code, op_code)  # the first launch of a repeated id
        linked = (correlation[ops] >= 0) & (launch >= 0)
        source = launches[launch[linked]]
        launch_ns[linked] = events["start_ns"][source]
        launch_end_ns[linked] = events["end_ns"][source]
        launch_tid[linked] = events["tid"][source]
    starts = events["start_ns"][ops].astype(np.int64)
    # An op's step is where its launch was; without a launch, where it ran, unless it ran
    # before the profile began (launched before it: the step before the first profiled one).
    when = np.where(launch_ns >= 0, launch_ns, starts)
    step = step_of(ranks[ops], when, steps)
    stream = events["tid"][ops].astype(np.int64)
    step[launched_before_profile(ranks[ops], stream, starts, launch_ns)] = BEFORE_PROFILE
    values = events.values["name"]
    used, name_code = np.unique(events.codes["name"][ops], return_inverse=True)
    return {
        "rank": ranks[ops],
        "step": step,
        "start_ns": starts,
        "end_ns": events["end_ns"][ops].astype(np.int64),
        "stream": stream,
        "launch_ns": launch_ns,
        "launch_end_ns": launch_end_ns,
        "launch_tid": launch_tid,
        "file_id": events["file_id"][ops].astype(np.int64),
        "source_index": events["source_index"][ops].astype(np.int64),
        "peer": events["peer"][ops].astype(np.int64),  # the peer a kernel's own row names (Nsight Systems)
        "name_code": name_code.reshape(-1).astype(np.int64),
        "names": [values[c] for c in used.tolist()],
    }
