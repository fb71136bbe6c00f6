"""How to read a run: the options of :func:`tracekit.ingest.read_run`.

A plain dataclass (parser workers import this package too: no pandas). :func:`tracekit.load`
takes a :class:`tracekit.loading.LoadOptions`: these and the reconstructor's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WARM_UP = ("pandas",)  # what a parent imports while its pool workers parse, unless told otherwise


def native_allowed() -> bool:
    """Whether tracekit's optional C code may run where it is built (the Kineto scanner,
    the nesting walk): ``TRACEKIT_NATIVE=0`` in the environment turns it off, read at each
    call, for comparisons and as a way round a bug in it."""
    return os.environ.get("TRACEKIT_NATIVE", "1").strip() != "0"


@dataclass(frozen=True)
class Reducer:
    """What the process that parsed a file runs on it next, with ``rows="reduce"``: a
    function from the file's working set to what the client needs of it (given by a layer
    above ingest: :func:`tracekit.loading.reduce_file`), and what decides its result, for
    the cache's key (the function's options and a digest of its code)."""

    function: Callable[[Any], Any] = field(compare=False)
    key: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ReadOptions:
    """Which files to read, and how to parse them.

    ``rank_from``: a regex with one group that takes each file's rank from its name;
    ``rank_map``: Nsight Systems process id -> rank. ``executor`` ``"local"`` parses in this
    process (``jobs=1``) or a pool of ``jobs`` processes (default: one per core, at most one
    per file); ``"dask"`` on the Dask cluster at ``scheduler`` (see
    :mod:`tracekit.ingest.executor`). ``cache_dir``: the parse cache (none unless given; see
    :mod:`tracekit.ingest.cache`); ``defer_cache_writes``: entries of files parsed by pool
    workers are written by a background thread while the caller goes on (the command line
    waits for it after its output). ``rows``: ``"analysis"`` keeps only the rows the analysis
    reads (the same analysis from a fraction of the events; see
    :mod:`tracekit.ingest.working_set`); ``"reduce"`` (what the command line uses) also runs
    ``reducer`` on each file's working set where it was parsed (workers send back each
    rank's steps and actions, not its events; :func:`tracekit.load` sets the reducer). ``iteration``: which ``iteration_N`` folder to read
    (default: the highest; see :mod:`tracekit.ingest.discovery`). ``warm_up``: the modules
    this process imports while pool workers parse, what the caller needs next (the command
    line names the analysis' own, so their import is not left for after the last file).
    """

    rank_from: str | None = None
    rank_map: dict[int, int] | None = None
    executor: str = "local"
    jobs: int | None = None
    scheduler: str | None = None
    cache_dir: str | None = None
    rows: str = "all"
    defer_cache_writes: bool = False
    iteration: int | None = None
    reducer: Reducer | None = None
    warm_up: tuple[str, ...] = WARM_UP
