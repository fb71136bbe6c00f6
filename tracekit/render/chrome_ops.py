"""The original ops of each action, for the merged trace's ``--with-ops``.

Under each action's slice on its rank's ``compute`` thread go the events the trace recorded
inside it: on the host timeline the CPU ops and user annotations of the action's own thread
that lie wholly inside the action's span (Nsight Systems: its NVTX ranges), of the **two top levels** only (the action's
top-level ops and the ops directly inside them, e.g. ``aten::linear`` and its ``aten::addmm``;
for a ``PP:`` label at depth d, depths d+1 and d+2): deeper levels multiply the file's size
several times and say little a timeline viewer needs; the rank traces hold them all. On the
device timeline (GPU runs) the kernels, copies and sets the action launched, which lie inside
its device span; where two of them overlap (several streams), the later one is left out
(counted in ``otherData.counts.ops_left_out``), since slices on one thread must nest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.grouping import int_groups
from tracekit.model.run import Run

OP_LEVELS = 2  # the action's top-level ops and the ops directly inside them
_HOST_CATS = ("cpu_op", "user_annotation", "nvtx")  # nvtx: an Nsight Systems report's ranges

# A thread of the merged trace: (rank, track, lane).
Track = tuple[int, str, int]
# A slice placed on a thread: (its thread, start ns, end ns).
Placed = tuple[Track, int, int]
# Adds one slice: rank, track, lane, start ns, end ns, name, category, args.
Add = Callable[[int, str, int, int, int, str, str, dict[str, Any]], None]


def add_action_ops(run: Run, add: Add, action_track: dict[int, Placed]) -> tuple[int, int]:
    """Add each action's ops as slices on its track (``action_track``: action id -> (track
    key, start, end)); returns (ops added, ops left out)."""
    if run.timeline == "device":
        return _device_ops(run, add, action_track)
    return _host_ops(run, add, action_track), 0


def _host_ops(run: Run, add: Add, action_track: dict[int, Placed]) -> int:
    ev = run.events
    ev = ev[ev["cat"].isin(_HOST_CATS).to_numpy() & ~ev["on_gpu"].to_numpy()]
    source = ev.set_index(["file_id", "source_index"])[["pid", "tid"]]
    names = [f.path.name for f in run.files]
    added = 0
    threads = {key: group.sort_values(["start_ns", "depth"]) for key, group in ev.groupby(["rank", "pid", "tid"])}
    action: Any  # rows of the actions and events tables (pandas types their fields as any scalar)
    op: Any
    for action in run.actions.itertuples(index=False):
        if int(action.action_id) not in action_track:
            continue
        try:
            pid, tid = source.loc[(int(action.file_id), int(action.source_index))]
        except KeyError:  # the action's event is not a host op or range (nothing to nest under it)
            continue
        thread = threads.get((int(action.rank), int(pid), int(tid)))
        if thread is None:
            continue
        inside = _inside(thread, int(action.start_ns), int(action.end_ns))
        inside = inside[~((inside["file_id"] == action.file_id) & (inside["source_index"] == action.source_index))]
        if inside.empty:
            continue
        top = int(inside["depth"].min())
        inside = inside[inside["depth"].to_numpy() < top + OP_LEVELS]
        key = action_track[int(action.action_id)][0]
        for op in inside.itertuples(index=False):
            _add_op(add, key, op, str(op.cat), {"action_id": int(action.action_id), "depth": int(op.depth)}, names)
            added += 1
    return added


def _add_op(add: Add, key: Track, op: Any, cat: str, args: dict[str, Any], names: list[str]) -> None:
    """One op as a slice on its action's track ``key``, its args followed by the file and the
    event it was read from."""
    source = {"source_file": names[int(op.file_id)], "source_index": int(op.source_index)}
    add(key[0], key[1], key[2], int(op.start_ns), int(op.end_ns), str(op.name), cat, {**args, **source})


def _device_ops(run: Run, add: Add, action_track: dict[int, Placed]) -> tuple[int, int]:
    names = [f.path.name for f in run.files]
    added = left_out = 0
    owned = run.device[run.device["action_id"].to_numpy() >= 0]
    op: Any  # a row of the device ops table (pandas types its fields as any scalar)
    for (action_id,), ops in int_groups(owned, ["action_id"]):
        if action_id not in action_track:
            continue
        key, start, end = action_track[action_id]
        busy_until = start
        for op in _inside(ops.sort_values(["start_ns", "end_ns"]), start, end).itertuples(index=False):
            if int(op.start_ns) < busy_until:  # overlaps the op before it (another stream)
                left_out += 1
                continue
            args = {"action_id": action_id, "kind": str(op.kind), "stream": int(op.stream)}
            _add_op(add, key, op, "device", args, names)
            busy_until = int(op.end_ns)
            added += 1
    return added, left_out


def _inside(rows: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """The rows (sorted by start) wholly inside [start_ns, end_ns]."""
    starts = rows["start_ns"].to_numpy(np.int64)
    lo, hi = np.searchsorted(starts, start_ns, side="left"), np.searchsorted(starts, end_ns, side="right")
    window = rows.iloc[lo:hi]
    return window[window["end_ns"].to_numpy(np.int64) <= end_ns]
