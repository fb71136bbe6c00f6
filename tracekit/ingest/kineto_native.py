"""The Kineto parser's optional native scanner: ``traceEvents`` bytes straight to row columns.

``_kineto_scan`` (``tracekit/ingest/_kineto_scan.c``, plain CPython C API) is built by
``pip install`` where a C compiler is found; it is an optional extension, so an install
without one still succeeds and reads traces the Python way. For a run of array elements the
scanner returns exactly the columns :meth:`~tracekit.ingest.kineto_rows._RowBuilder._add_columns`
would add after msgspec decoded them, or declines, and :class:`ChromeTraceStream` reads those
bytes the Python way as before: the Python path stays the reference, the scanner only ever
answers where it gives the same rows (the C file's header says what it accepts and why it
declines).

How a run flows: the stream asks :meth:`Scanner.scan` for the run at the front of its buffer,
keeps the answer only where it ends at the seam the stream's own cut would find, and yields it
as a :class:`ScannedRun`; ``_RowBuilder.add`` keeps its rows (``_add_scanned``).

``TRACEKIT_NATIVE=0`` in the environment turns the scanner off (read at each parse).
:data:`RUNS` counts this process's runs answered and declined, for tests and benchmarks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import msgspec
import numpy as np

from tracekit.ingest.options import native_allowed

try:
    from tracekit.ingest import _kineto_scan  # type: ignore[attr-defined]  # a C extension, no stub
except ImportError:  # not built (no C compiler at install): the Python path reads everything
    _kineto_scan = None

# Runs answered ("answered", with their "elements") and declined ("declined", and per reason).
RUNS: Counter[str] = Counter()


def available() -> bool:
    """Whether the extension was built and imports."""
    return _kineto_scan is not None


def enabled() -> bool:
    """Whether parses use the scanner: built, and not turned off by ``TRACEKIT_NATIVE=0``."""
    return _kineto_scan is not None and native_allowed()


@dataclass(eq=False)
class ScannedRun:
    """The rows of one run of ``traceEvents`` elements as the scanner read them: the arrays
    :meth:`_RowBuilder._add_columns` appends to ``parts`` (``src`` counted from the run's first
    element; names not yet coded get the next codes, ``names`` lists them), its P2P and
    collective ops by kind (as ``_RowBuilder.special_kinds``, new kinds in ``special_new``),
    and what it counts."""

    end: int  # the run is the buffer's bytes before this (after its last element, or its "]")
    next: int  # where the element after the run starts (the "]" of a last run)
    n_elements: int
    n_complete: int  # complete ("X") events, kept or not
    n_begin_end: int  # duration events ("B" / "E"), skipped
    first_ts: tuple[int, int | float] | None  # (element, ts) of the first complete event with a number ts
    n_rows: int
    src: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    seq: np.ndarray
    corr: np.ndarray
    names: list[str] | None  # names not yet coded, in the order of the run's codes for them (len(name_codes) on)
    cats: list[str]  # categories of the run's complete events
    # The ops whose args _special_args reads: their rows (counted in the run) and kinds (an index
    # in the builder's special_keys); the kinds new here, from len(special_keys) on, as (name,
    # args as _special_args gives them, None) or (name, None, the element's JSON for msgspec)
    special_rows: np.ndarray
    special_kinds: np.ndarray
    special_new: list[tuple[str, dict[str, Any] | tuple[Any, ...] | None, bytes | None]]


_COLUMNS = {
    "src": np.int64,
    "cat": np.int8,
    "name": np.int32,
    "start": np.int64,
    "dur": np.int64,
    "pid": np.int64,
    "tid": np.int64,
    "seq": np.int64,
    "corr": np.int64,
    "special_rows": np.int64,
    "special_kinds": np.int32,
}


class Scanner:
    """The native scanner of one file's elements, reading (never changing) a row builder's
    category and name codes: ``cat_code_of`` (raw category -> code), ``cat_code`` (the code of
    a category not in it), ``name_codes``, the code of ``cpu_op``, the names whose args
    ``_special_args`` reads and the kinds of those ops met (``special_ids``, ``special_keys``),
    and for Python frames (with_stack) the code ``cat_code`` gives them (``frame_code``), the
    code of a kept frame's row (``frame_cat``), which names are kept (``keeps_frame``) and
    how every kept name ends (``frame_endings``: others are dropped unread).
    Use each answer before the next scan: codes and kinds are read at scan time."""

    def __init__(
        self,
        cat_code_of: dict[Any, Any],
        cat_code: Callable[[str], int],
        name_codes: dict[str, int],
        cpu_op: int,
        special: Iterable[str],
        special_ids: dict[tuple[Any, ...], int],
        special_keys: list[Any],
        frame_code: int,
        frame_cat: int,
        keeps_frame: Callable[[str], bool],
        frame_endings: Iterable[str],
    ):
        if _kineto_scan is None:
            raise RuntimeError("tracekit's native scanner is not built")
        self._scanner = _kineto_scan.Scanner(
            cat_code_of,
            cat_code,
            name_codes,
            cpu_op,
            tuple(special),
            msgspec.UNSET,
            special_ids,
            special_keys,
            frame_code,
            frame_cat,
            keeps_frame,
            tuple(ending.encode() for ending in frame_endings),
        )

    def scan(self, data: bytes | memoryview, last: bool = False) -> ScannedRun | None:
        """The run of whole elements at the front of ``data``, up to the last one followed by
        the next one's ``{`` (``last``: by the array's ``]``), or None where the scanner declines."""
        found = self._scanner.scan(data, last)
        if found is None:
            self.decline(self._scanner.why)
            return None
        for key, dtype in _COLUMNS.items():
            found[key] = np.frombuffer(found[key], dtype=dtype)
        found["special_new"] = [
            (name, args, None if args is not None else bytes(data[start:stop]))
            for name, args, start, stop in found["special_new"]
        ]
        return ScannedRun(**found)

    def decline(self, why: str) -> None:
        """Count a run the Python path reads instead, and why."""
        RUNS["declined"] += 1
        RUNS[f"declined: {why}"] += 1
