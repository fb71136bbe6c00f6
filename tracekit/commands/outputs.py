"""The output files of a command that reads a run: checked against the run before it is loaded."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.ingest import IGNORED_NAMES, KINETO_SUFFIXES, NSYS_SUFFIXES
from tracekit.ingest.discovery import every_trace
from tracekit.output import OutputTarget


def run_output(
    path: str | os.PathLike[str], option: str, run_dir: Path, also_protect: Mapping[Path, str] | None = None
) -> OutputTarget:
    """Where a command will write ``path``, refused now if that would write over one of the
    run's files (its traces, its capture manifest, or ``also_protect``: other inputs such as
    a baseline) or drop a file into the run folder that the next ``tracekit analyze`` would
    read as one more trace."""
    run_dir = Path(run_dir)
    folder = run_dir if run_dir.is_dir() else run_dir.parent
    traces = every_trace(run_dir)  # every iteration's, not only the one this command reads
    protect = {trace: "one of the run's input traces" for trace in traces}
    protect[folder / "capture.json"] = "the run's capture manifest"
    protect.update(also_protect or {})
    target = OutputTarget(path, option, protect)
    trace_folders = {folder.resolve()} | {trace.resolve().parent for trace in traces}
    if run_dir.is_dir() and target.kind == "file" and target.resolved.parent in trace_folders:
        name = target.resolved.name
        if name not in IGNORED_NAMES and not name.startswith(".") and name.endswith(KINETO_SUFFIXES + NSYS_SUFFIXES):
            raise TracekitError(
                f"{option} {path}: inside the run folder it would be read as one more "
                "trace of the run next time; write it elsewhere"
            )
    return target


def distinct(*targets: OutputTarget | None) -> None:
    """Two options naming one file would leave only the second; refuse before any work."""
    given = [t for t in targets if t is not None]
    for index, target in enumerate(given):
        for earlier in given[:index]:
            if target.same_file(earlier):
                raise TracekitError(
                    f"{target.option} {target.path}: is the file {earlier.option} "
                    "writes too; give each output its own file"
                )
