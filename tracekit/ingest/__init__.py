"""Ingest: find the trace files of a run, parse each, and build one :class:`Run` of their events.

Each parser turns one file into ``(TraceFile, events)`` pairs (an nsys report may hold
several ranks); the files are then checked to make one run (no duplicate or missing ranks,
one job). :func:`tracekit.load` hands the run to the reconstructor. This package's face
names what the layers above use; the work is done in its modules:

- :mod:`~tracekit.ingest.discovery` (and :mod:`~tracekit.ingest.sniff`): which files of a
  folder are traces, of which format;
- :mod:`~tracekit.ingest.file_task`: one file's parse (``kineto*``, ``nsys*``: the parsers;
  :mod:`~tracekit.ingest.working_set`: the rows the analysis reads);
- :mod:`~tracekit.ingest.executor`: where each file is parsed (:mod:`~tracekit.ingest.pool`,
  :mod:`~tracekit.ingest.dask_cluster`), through the parse cache
  (:mod:`~tracekit.ingest.cache`, :mod:`~tracekit.ingest.cache_writes`);
- :mod:`~tracekit.ingest.one_run` and :mod:`~tracekit.ingest.capture_manifest`: whether the
  files make one run, and what ``capture.json`` says of it;
- :mod:`~tracekit.ingest.read`: all of it, into one :class:`Run`.
"""

from __future__ import annotations

# IGNORED_NAMES and the suffixes are also tracekit.commands.outputs': what may be written into a run folder.
from tracekit.ingest.discovery import IGNORED_NAMES, discover
from tracekit.ingest.executor import parse_files
from tracekit.ingest.options import ReadOptions, Reducer
from tracekit.ingest.read import read_run
from tracekit.ingest.sniff import KINETO_SUFFIXES, NSYS_SUFFIXES

__all__ = [
    "IGNORED_NAMES",
    "KINETO_SUFFIXES",
    "NSYS_SUFFIXES",
    "ReadOptions",
    "Reducer",
    "discover",
    "parse_files",
    "read_run",
]
