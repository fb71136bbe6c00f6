"""Loading a run: ingest (read and check the files), then reconstruct (steps, actions,
messages, schedule). :func:`tracekit.load` is :func:`load`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.ingest.options import ReadOptions

if TYPE_CHECKING:
    from tracekit.model.run import Run
    from tracekit.reconstruct.labels import LabelSet


@dataclass(frozen=True)
class LoadOptions(ReadOptions):
    """What to read and how (:class:`~tracekit.ingest.options.ReadOptions`), and how to
    reconstruct it: ``timeline`` ``auto`` (the device wherever the traces record device
    work), ``device`` or ``host`` (see :func:`tracekit.reconstruct.reconstruct`);
    ``labels``: the user's label rules (a ``LabelSet``, or ``"REGEX=KIND"`` strings), tried
    before the built-in tables."""

    timeline: str = "auto"
    labels: LabelSet | Sequence[str] | None = None


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
    # parser workers (they stay lean; read_run loads pandas itself while they parse).
    from tracekit.ingest import read_run

    options = options or LoadOptions()
    run = read_run(path, options, progress=progress, bytes_read=bytes_read)
    from tracekit.reconstruct import reconstruct

    return reconstruct(run, timeline=options.timeline, labels=options.labels)
