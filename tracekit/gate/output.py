"""Writing output files safely: whole or not at all, and never over the run being read."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.ingest import IGNORED_NAMES, KINETO_SUFFIXES, NSYS_SUFFIXES, discover


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so that a reader (or a
    crash) never sees half a file and an existing file is only replaced by a complete one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes the file private (0600); give it the mode an ordinary open() would
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_to_overwrite_inputs(output: Path, run_path: Path, option: str = "-o") -> None:
    """Raise when writing ``output`` would overwrite one of the run's input files, or drop a
    file into the run folder that the next ``tracekit analyze`` would read as a trace."""
    target = Path(output).resolve()
    if target.is_dir():
        raise TracekitError(f"{option} {output}: is a folder; give a file name")
    run_path = Path(run_path)
    for source in discover(run_path):
        if source.resolve() == target:
            raise TracekitError(f"{option} {output}: is one of the run's input traces; refusing to "
                                "write over it (choose another output file)")
    if run_path.is_dir() and target.parent == run_path.resolve():
        name = target.name
        if name == "capture.json":
            raise TracekitError(f"{option} {output}: is the run's capture manifest; refusing to write over it")
        if name not in IGNORED_NAMES and name.endswith(KINETO_SUFFIXES + NSYS_SUFFIXES):
            raise TracekitError(f"{option} {output}: inside the run folder it would be read as one more "
                                "trace of the run next time; write it elsewhere")
