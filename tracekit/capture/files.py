"""How a capture writes its files: each one whole or not at all, so a capture that fails or is
stopped never leaves a half-written trace, manifest or side file that looks like a result.

Files of text go through the one writer (:class:`tracekit.output.OutputTarget`: temporary file,
fsync, rename). A gzip trace is compressed as a stream instead (a rank's trace can be hundreds
of MB of JSON, which OutputTarget would want whole in memory), into a temporary name beside it
that is renamed into place. Standard library only: the spawned ranks write through it too.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from pathlib import Path

from tracekit.output import OutputTarget


def write_text(path: Path, text: str, option: str = "--out") -> None:
    """``text`` as the whole of ``path``; a failure is one TracekitError line naming ``option``."""
    OutputTarget(path, option).write(text.encode())


def gzip_file(src: Path, gz: Path) -> None:
    """Compress ``src`` into ``gz`` (level 9: sample folders are committed), renamed into place
    only once complete."""
    fd, tmp = tempfile.mkstemp(dir=gz.parent, prefix=f".{gz.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, open(src, "rb") as source:
            with gzip.GzipFile(filename=gz.name, mode="wb", compresslevel=9, fileobj=raw) as dst:
                shutil.copyfileobj(source, dst)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, gz)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
