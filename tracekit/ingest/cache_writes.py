"""Parse cache entries written by whoever holds the rows, now or later.

A file parsed by a pool worker comes back with the entry to write (:class:`PendingEntry`):
the parent writes it, as pool workers stay lean (no pyarrow). The command line defers the
writing (:meth:`PendingEntry.defer`) to a background thread while it goes on, and waits for
it after its output (:func:`write_deferred_entries`); at exit at the latest.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.ingest.columns import Parsed

if TYPE_CHECKING:
    from tracekit.ingest.cache import ParseCache


@dataclass
class PendingEntry:
    """A cache entry to write for a file just parsed (by whoever holds the rows)."""

    cache_dir: str
    key: str
    path: str
    stamp: list[int]

    def store(self, parsed: Parsed) -> None:
        if self.unchanged():
            self._cache().store(self.key, parsed)

    def defer(self, parsed: Parsed) -> None:
        """Keep a copy of the rows (the run's table consumes them next) and write the entry
        when :func:`write_deferred_entries` runs: after the command's output, when this
        process's memory peak is behind it (Arrow and Parquet map ~30 MB of library code
        and buffers)."""
        if self.unchanged():
            if not _DEFERRED:
                atexit.register(write_deferred_entries)
            # The file facts copied too: the run lets go of a rank's reduction once read.
            _DEFERRED.append((self, [(dataclasses.replace(trace), columns.copy()) for trace, columns in parsed]))

    def unchanged(self) -> bool:
        """A file rewritten while it was parsed is not stored."""
        from tracekit.ingest.cache import file_stamp

        try:
            return file_stamp(Path(self.path)) == self.stamp
        except OSError:
            return False

    def _cache(self) -> ParseCache:
        from tracekit.ingest.cache import ParseCache

        return ParseCache(self.cache_dir)


_DEFERRED: list[tuple[PendingEntry, Parsed]] = []
_WRITER: list[threading.Thread] = []  # the background writer, while one runs


def write_deferred_entries(background: bool = False) -> None:
    """Write the cache entries kept by :meth:`PendingEntry.defer`.

    ``background``: in a thread, and return at once (Parquet encoding runs outside the
    interpreter lock, beside the single-threaded analysis that follows the parse); a later
    call without it waits for that thread and writes whatever is left."""
    if background:
        if _DEFERRED and not any(w.is_alive() for w in _WRITER):
            writer = threading.Thread(target=_drain_deferred, name="tracekit-cache-writer", daemon=True)
            _WRITER[:] = [writer]
            writer.start()
        return
    for writer in _WRITER:
        writer.join()
    _WRITER.clear()
    _drain_deferred()


def _drain_deferred() -> None:
    while True:
        try:
            entry, parsed = _DEFERRED.pop(0)
        except IndexError:
            return
        entry._cache().store(entry.key, parsed)
