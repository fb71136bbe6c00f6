"""Per-step scalars (:func:`tracekit.analyze.tabular.step_scalars`) as one TensorBoard event file.

Encoded with tensorboard's own pieces (its ``Event``/``Summary`` protos and its record
writer, the framing and CRCs TensorBoard reads), into bytes: the file itself is written by
tracekit's one writer (:class:`tracekit.output.OutputTarget`), whole or not at all. Scalars are
``simple_value`` summaries, as ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes them,
so TensorBoard and every event reader show them as ordinary scalars.
"""

from __future__ import annotations

import io
import time
from typing import Any

import pandas as pd

from tracekit.errors import TracekitError

INSTALL_HINT = "pip install 'tracekit[tensorboard]'"


def require_tensorboard() -> None:
    """Refuse, in one line, before any work, when tensorboard is not installed."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise TracekitError(f"--tensorboard needs the tensorboard package: {INSTALL_HINT}")


def event_file_name(scalars: pd.DataFrame, now_s: float) -> str:
    """``events.out.tfevents.<seconds>.tracekit``: TensorBoard reads any file with ``tfevents`` in its
    name; the seconds are the first step's start (exporting a run again replaces its file, never
    adds a second copy of its scalars), else the export's time."""
    walls = scalars["wall_time_ns"]
    seconds = int(walls.min() // 1_000_000_000) if len(walls) and walls.min() >= 0 else int(now_s)
    return f"events.out.tfevents.{seconds:010d}.tracekit"


def event_file_bytes(scalars: pd.DataFrame, now_s: float | None = None) -> bytes:
    """The event file: the version record, then one event per (step, tag) in step order.
    Steps without an absolute time are stamped ``now_s`` (default: the time of the call)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    now_s = time.time() if now_s is None else now_s
    buffer = io.BytesIO()
    records = RecordWriter(buffer)
    first_wall_s = _wall_s(int(scalars["wall_time_ns"].min()), now_s) if len(scalars) else now_s
    records.write(event_pb2.Event(wall_time=first_wall_s, file_version="brain.Event:2").SerializeToString())
    row: Any  # a scalar's row (pandas types its fields as any scalar)
    for row in scalars.sort_values(["step", "tag"], kind="stable").itertuples(index=False):
        value = summary_pb2.Summary.Value(tag=str(row.tag), simple_value=float(row.value))
        summary = summary_pb2.Summary(value=[value])
        event = event_pb2.Event(wall_time=_wall_s(int(row.wall_time_ns), now_s), step=int(row.step), summary=summary)
        records.write(event.SerializeToString())
    return buffer.getvalue()


def _wall_s(wall_time_ns: int, now_s: float) -> float:
    return wall_time_ns / 1e9 if wall_time_ns >= 0 else now_s


class TensorBoardRenderer:
    """The per-step scalars as one event file; ``now_s`` stamps steps without an absolute
    time (default: the time of the call), as :func:`event_file_bytes` says."""

    name = "tensorboard"
    reads = "scalars"

    def __init__(self, now_s: float | None = None) -> None:
        self.now_s = now_s

    def render(self, scalars: pd.DataFrame) -> bytes:
        return event_file_bytes(scalars, self.now_s)
