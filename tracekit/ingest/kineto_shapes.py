"""The host ops of one Kineto trace with their first input's shape, read on demand.

The main parser keeps an op's shapes only where a P2P message's size comes from them
(:mod:`tracekit.ingest.kineto_stream`); a trace recorded with ``record_shapes=True`` gives
every op its inputs' shapes and types::

    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": ..., "dur": ..., "tid": ...,
     "args": {"Sequence number": 752, "Input Dims": [[8, 256], [256, 256], [256]],
              "Input type": ["float", "float", "float"], ...}}

Only the analyses that size recomputed activations read them (``whatif --no-recompute``), so
loading a run costs nothing more. Times are the file's own ``ts`` in ns: the callers compare
ops of one file with each other only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeGuard

import pandas as pd

from tracekit.ingest.kineto_comm import _DTYPE_BYTES
from tracekit.ingest.kineto_document import trace_events_or_none

OP_COLUMNS = ["name", "tid", "start_ns", "end_ns", "seq", "input_dims", "input_bytes"]


def _number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def first_input(args: dict[str, Any]) -> tuple[str, int]:
    """An op's first input as (its dims as text, "8,256", and its bytes): ("", -1) where the
    op has no recorded shapes or its first input is no tensor of a known type."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims or not types:
        return "", -1
    shape, dtype = dims[0], types[0]
    if not isinstance(shape, list) or not shape or any(type(d) is not int or d < 0 for d in shape):
        return "", -1
    size = _DTYPE_BYTES.get(str(dtype))
    if size is None:
        return "", -1
    elements = 1
    for d in shape:
        elements *= d
    return ",".join(map(str, shape)), elements * size


def read_op_inputs(path: Path) -> pd.DataFrame:
    """The host ops (``cpu_op``) of the Kineto file at ``path`` (:data:`OP_COLUMNS`: sequence
    number -1 where none, :func:`first_input`'s dims and bytes); none where the file cannot be
    read (the callers say the activations cannot be sized)."""
    empty = pd.DataFrame(
        {c: pd.Series(dtype="int64" if c not in ("name", "input_dims") else "object") for c in OP_COLUMNS}
    )
    events = trace_events_or_none(path)
    if events is None:
        return empty
    rows: list[tuple[str, int, int, int, int, str, int]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("cat") != "cpu_op":
            continue
        name, ts, dur, tid = e.get("name"), e.get("ts"), e.get("dur", 0), e.get("tid")
        if not isinstance(name, str) or not _number(ts) or not _number(dur):
            continue
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        seq = args.get("Sequence number")
        start = int(round(ts * 1000))
        rows.append(
            (
                name,
                int(tid) if _number(tid) else -1,
                start,
                start + int(round(dur * 1000)),
                int(seq) if _number(seq) else -1,
                *first_input(args),
            )
        )
    if not rows:
        return empty
    return pd.DataFrame(rows, columns=OP_COLUMNS)
