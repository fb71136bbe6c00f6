"""Loading a run: ingest (read and check the files), then reconstruct (steps, actions,
messages, schedule). :func:`tracekit.load` is :func:`load`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.ingest.options import ReadOptions, Reducer

if TYPE_CHECKING:
    from tracekit.ingest.columns import EventColumns
    from tracekit.model.events import TraceFile
    from tracekit.model.run import Run
    from tracekit.reconstruct.labels import LabelSet


@dataclass(frozen=True)
class LoadOptions(ReadOptions):
    """What to read and how (:class:`~tracekit.ingest.options.ReadOptions`), and how to
    reconstruct it: ``timeline`` ``auto`` (the device wherever the traces record device
    work), ``device`` or ``host`` (see :func:`tracekit.reconstruct.whole_run.reconstruct`);
    ``labels``: the user's label rules (a ``LabelSet``, or ``"REGEX=KIND"`` strings), tried
    before the built-in tables.

    >>> import tracekit
    >>> run = tracekit.load("sample_traces/1f1b", tracekit.LoadOptions(timeline="host", jobs=1))
    >>> run.timeline
    'host'
    """

    timeline: str = "auto"
    labels: LabelSet | Sequence[str] | None = None
    # rows="reduce": a rank with device work, or a host rank of a run without a pipeline, is
    # reduced too (its device ops as columns, its busy rows: tracekit.reconstruct.per_rank);
    # False: it keeps its working set
    reduce_device: bool = True
    # rows="reduce": the output draws ops (the HTML report): a reduced rank keeps the rows
    # drawn (its device work; a rank without a pipeline its top host ops) in run.events too,
    # asked for here, before any file is read, as nothing is read again after the analysis
    draw_ops: bool = False


def load(
    path: str | PathLike[str],
    options: LoadOptions | None = None,
    *,
    progress: Callable[[Path], None] | None = None,
    bytes_read: Callable[[int], None] | None = None,
) -> Run:
    """Load a run folder (or one trace file) and reconstruct its pipeline.

    ``options``: a :class:`LoadOptions` (default: every row, parsed in local processes, no
    cache, the highest iteration, the device timeline where there is one). ``progress`` is
    called with each file's path when it is parsed, ``bytes_read`` with counts of bytes read.

    >>> import tracekit
    >>> run = tracekit.load("sample_traces/interleaved1f1b")
    >>> run.schedule.name, run.schedule.p, run.schedule.v, run.schedule.m
    ('Interleaved1F1B', 4, 2, 8)
    """
    # Imported here: the command line builds LoadOptions on paths that never load (a cached
    # analysis); and reconstruct brings pandas, which must come after read_run has forked its
    # parser workers (they start lean; read_run loads pandas itself while they parse).
    from tracekit.ingest import read_run

    options = options or LoadOptions()
    labels = options.labels
    if labels is not None:
        from tracekit.reconstruct.labels import LabelSet, custom_set, parse_rule

        if not isinstance(labels, LabelSet):
            labels = custom_set([parse_rule(text, "label rule") for text in labels])
    if options.rows != "reduce":
        run = read_run(path, options, progress=progress, bytes_read=bytes_read)
        from tracekit.reconstruct.whole_run import reconstruct

        return reconstruct(run, timeline=options.timeline, labels=labels)
    reducer = Reducer(
        functools.partial(reduce_file, labels=labels, device=options.reduce_device, draw=options.draw_ops),
        # what decides a reduced entry of the parse cache; nothing reads it without one
        _reducer_key(labels, options.reduce_device, options.draw_ops) if options.cache_dir else {},
    )
    run = read_run(path, replace(options, reducer=reducer), progress=progress, bytes_read=bytes_read)
    from tracekit.reconstruct.whole_run import reconstruct
    from tracekit.reconstruct.per_rank import run_choice

    reduced = [trace.reduced is not None for trace in run.files]
    if any(reduced) and run_choice([t.reduced for t in run.files], labels) is None:
        # Some ranks have no actions or record device work, or chose another label table
        # than the run does: those ranks' actions are not the run's. Read the events.
        run = read_run(path, replace(options, rows="analysis"), progress=progress, bytes_read=bytes_read)
    return reconstruct(run, timeline=options.timeline, labels=labels)


def reduce_file(
    parsed: list[tuple[TraceFile, EventColumns]], labels: LabelSet | None, device: bool = True, draw: bool = False
) -> list[tuple[TraceFile, EventColumns]]:
    """The map step's reduce (``rows="reduce"``), run where a file was parsed: each rank's
    steps and actions on its :class:`~tracekit.model.events.TraceFile` (``reduced``) and,
    of its working set, only the rows the cross-rank steps read
    (:mod:`tracekit.reconstruct.per_rank`; ``device``: ranks with device work and host
    ranks without a pipeline too), and with ``draw`` the rows an output draws; a rank that
    needs its events keeps them."""
    from tracekit.reconstruct.event_arrays import EventArrays
    from tracekit.reconstruct.per_rank import drawn_rows, rank_reduce

    out = []
    for trace, columns in parsed:
        events = EventArrays.of(columns)
        found = rank_reduce(events, labels, device, trace.world_size or 1)
        if found is None:
            out.append((trace, columns))
            continue
        trace.reduced, keep = found  # keep: by row, and the table's rows are the columns'
        if draw:
            keep = keep | drawn_rows(events, trace.reduced)
        out.append((trace, columns.take(keep)))
    return out


@functools.cache
def _code_digest() -> str:
    """A digest of the code :func:`reduce_file` runs (the parse cache keys the parser's own)."""
    from tracekit.ingest.cache import sources_digest

    root = Path(__file__).resolve().parent
    return sources_digest(
        [Path(__file__), *sorted((root / "reconstruct").rglob("*.py")), *sorted((root / "model").glob("*.py"))]
    )


def _reducer_key(labels: LabelSet | None, device: bool, draw: bool) -> dict[str, Any]:
    rules = [(r.pattern, r.role) for r in labels.rules] if labels is not None else []
    return {"code": _code_digest(), "labels": rules, "device": device, "draw": draw}
