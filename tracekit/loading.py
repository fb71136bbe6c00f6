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
    before the built-in tables."""

    timeline: str = "auto"
    labels: LabelSet | Sequence[str] | None = None
    # rows="reduce": a rank with device work, or a host rank of a run without a pipeline, is
    # reduced too (its device ops as columns, its busy rows: tracekit.reconstruct.per_rank);
    # False: it keeps its working set, for outputs that draw its host ops (the report)
    reduce_device: bool = True


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
        functools.partial(reduce_file, labels=labels, device=options.reduce_device),
        # what decides a reduced entry of the parse cache; nothing reads it without one
        _reducer_key(labels, options.reduce_device) if options.cache_dir else {},
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


def with_drawn_ops(run: Run, path: str | PathLike[str], options: LoadOptions, ranks: list[int]) -> Run:
    """Put the working sets of ``ranks`` (the ranks an output draws) into ``run.events`` in
    place of what the reduce left of them. A run loaded with ``rows="reduce"``
    holds no op of its GPU ranks, nor of the ranks of a run without a pipeline: an output
    that draws a few of many ranks reads those ranks' files again (or their cache entries)
    instead of holding every rank's working set. Their times are moved by the run's clock
    shifts, as reconstruction moved the rest. Returns the run with them."""
    import pandas as pd

    from tracekit.ingest import read_files
    from tracekit.reconstruct.clock import shift_ranks

    wanted = run.events["rank"].isin(ranks).to_numpy()
    file_ids = sorted(int(f) for f in run.events["file_id"][wanted].unique())
    if not file_ids:
        return run
    drawn = read_files(path, replace(options, rows="analysis", reducer=None), file_ids)
    drawn = shift_ranks(drawn, run.clock_shifts, "rank", ["start_ns", "end_ns"])
    others = run.events[~run.events["file_id"].isin(file_ids).to_numpy()]
    return replace(run, events=pd.concat([others, drawn], ignore_index=True))


def reduce_file(
    parsed: list[tuple[TraceFile, EventColumns]], labels: LabelSet | None, device: bool = True
) -> list[tuple[TraceFile, EventColumns]]:
    """The map step's reduce (``rows="reduce"``), run where a file was parsed: each rank's
    steps and actions on its :class:`~tracekit.model.events.TraceFile` (``reduced``) and,
    of its working set, only the rows the cross-rank steps read
    (:mod:`tracekit.reconstruct.per_rank`; ``device``: ranks with device work and host
    ranks without a pipeline too); a rank that needs its events keeps them."""
    from tracekit.reconstruct.event_arrays import EventArrays
    from tracekit.reconstruct.per_rank import rank_reduce

    out = []
    for trace, columns in parsed:
        found = rank_reduce(EventArrays.of(columns), labels, device, trace.world_size or 1)
        if found is None:
            out.append((trace, columns))
            continue
        trace.reduced, keep = found  # keep: by row, and the table's rows are the columns'
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


def _reducer_key(labels: LabelSet | None, device: bool) -> dict[str, Any]:
    rules = [(r.pattern, r.role) for r in labels.rules] if labels is not None else []
    return {"code": _code_digest(), "labels": rules, "device": device}
