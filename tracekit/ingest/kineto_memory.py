"""The profiler's memory events of one Kineto trace (``profile_memory=True``), read on demand.

The main parser keeps complete events only (:mod:`tracekit.ingest.kineto_stream`); a trace
recorded with ``profile_memory=True`` also holds one instant per allocation and free::

    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": ..., "tid": ...,
     "args": {"Bytes": 16384, "Total Allocated": 32768, "Total Reserved": 0,
              "Device Type": 0, "Device Id": -1, "Addr": ...}}

(``Bytes`` negative for a free; ``Total Allocated`` counts what the profiler saw allocated on
that device since it started.) They are read only by the analyses that size activations,
so loading a run costs nothing more. Times are the file's own ``ts`` in ns; the file's
``ProfilerStep#N`` starts come with them, so a caller can put both on the run's clock
(whatever base and cross-host shift the run applied) by matching the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import pandas as pd

from tracekit.ingest.kineto_document import trace_events_or_none

MEMORY_COLUMNS = ["ts_ns", "tid", "bytes", "total_allocated", "device_type"]


@dataclass(frozen=True)
class MemoryEvents:
    """One file's ``[memory]`` events (``MEMORY_COLUMNS``, by time) and its step starts
    (ProfilerStep number -> ts in ns), both on the file's own clock."""

    events: pd.DataFrame
    step_starts_ns: dict[int, int]


def _number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_memory_events(path: Path) -> MemoryEvents:
    """The memory events of the Kineto file at ``path`` (none where it has none, or cannot
    be read: the callers fall back to other sources and say so)."""
    empty = MemoryEvents(pd.DataFrame(columns=MEMORY_COLUMNS), {})
    events = trace_events_or_none(path)
    if events is None:
        return empty
    rows: list[tuple[int, int, int, int, int]] = []
    steps: dict[int, int] = {}
    for e in events:
        if not isinstance(e, dict) or not _number(e.get("ts")):
            continue
        name = e.get("name")
        if name == "[memory]" and e.get("ph") == "i":
            args = e.get("args")
            if not isinstance(args, dict) or not _number(args.get("Bytes")) or not _number(args.get("Total Allocated")):
                continue
            tid = e.get("tid")
            device = args.get("Device Type")
            rows.append(
                (
                    int(round(e["ts"] * 1000)),
                    int(tid) if _number(tid) else -1,
                    int(args["Bytes"]),
                    int(args["Total Allocated"]),
                    int(device) if _number(device) else -1,
                )
            )
        elif e.get("ph") == "X" and isinstance(name, str) and name.startswith("ProfilerStep#"):
            number = name[len("ProfilerStep#") :]
            if number.isdigit():
                steps[int(number)] = int(round(e["ts"] * 1000))
    frame = pd.DataFrame(rows, columns=MEMORY_COLUMNS).sort_values("ts_ns", kind="stable").reset_index(drop=True)
    return MemoryEvents(frame, steps)
