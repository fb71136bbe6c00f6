"""Whether the files read make one run: one trace per rank, one job, and which ranks of the
job are here (:func:`read_run <tracekit.ingest.read.read_run>` asks each in turn).

:func:`check_layout` refuses files that cannot be one run (a rank twice, files that disagree
on the world size, a rank beyond it); :func:`run_completeness` says which ranks of the job
left no trace here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import RunLayoutError

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

    from tracekit.model.events import TraceFile
    from tracekit.model.run import Completeness


def settle_unknown_ranks(files: list[TraceFile], events: pd.DataFrame) -> list[str]:
    """A lone file that names no rank is rank 0; several such files are an error."""
    unknown = [t for t in files if t.rank < 0]
    if not unknown:
        return []
    if len(files) > 1:
        names = ", ".join(t.path.name for t in unknown[:3])
        raise RunLayoutError(
            f"cannot tell which rank wrote {names} (no distributedInfo, no rank in the file "
            "name); rename them like rank3.json.gz or pass --rank-from REGEX"
        )
    trace = unknown[0]
    trace.rank, trace.ranks, trace.rank_source = 0, [0], "assumed (single file)"
    events["rank"] = 0
    return [f"{trace.path.name}: names no rank (no distributedInfo, no rank in its name); read as rank 0"]


def check_layout(files: list[TraceFile]) -> list[str]:
    """Raise on files that cannot be one run; return warnings for what is merely odd."""
    warnings: list[str] = []
    seen: dict[int, Path] = {}
    for trace in files:
        for rank in trace.ranks or [trace.rank]:
            if rank in seen:
                raise RunLayoutError(
                    f"rank {rank} appears in both {seen[rank].name} and {trace.path.name}; a run "
                    "folder must hold one trace per rank (move one of them out)"
                )
            seen[rank] = trace.path
    stated = _stated_world_sizes(files)
    if len(stated) > 1:
        says = "; ".join(
            f"{_name_list(names)} {'say' if len(names) > 1 else 'says'} {size}"
            for size, names in sorted(stated.items())
        )
        raise RunLayoutError(
            f"files disagree on world size ({says}): they come from different jobs; keep one job's traces per folder"
        )
    if stated:
        world = next(iter(stated))
        beyond = sorted(rank for rank in seen if rank >= world)
        if beyond:
            raise RunLayoutError(
                f"{seen[beyond[0]].name} holds rank {beyond[0]}, yet the files say the world size is "
                f"{world} (ranks 0-{world - 1}): it comes from another job, or --rank-from / "
                "--rank-map read the wrong number; keep one job's traces per folder"
            )
    for trace in files:
        warnings.extend(trace.warnings)
    return warnings


# Where a file's world size comes from, by its format.
_WORLD_SIZE_SOURCES = {
    "kineto": "distributedInfo",
    "nsys-sqlite": "the nsys report's rank marks",
    "nsys-json": "the nsys report's rank marks",
}


def _stated_world_sizes(files: list[TraceFile]) -> dict[int, list[str]]:
    """Each world size the files state, with the names of the files that state it."""
    stated: dict[int, list[str]] = {}
    for trace in files:
        if trace.world_size:
            names = stated.setdefault(int(trace.world_size), [])
            if trace.path.name not in names:  # an nsys report holds several ranks
                names.append(trace.path.name)
    return stated


def _name_list(names: list[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def run_completeness(files: list[TraceFile], capture: dict[str, Any] | None) -> tuple[Completeness, list[str]]:
    """Which ranks of the job left a trace here, and warnings about conflicting sources.

    The world size is the one the files state (after :func:`check_layout`, at most one),
    else ``capture.json``'s rank count, else, when the ranks present have a gap, at least
    the highest rank + 1. A run whose ranks are 0..n-1 and that states nothing is complete.
    """
    from tracekit.model.run import INFERRED_WORLD_SIZE, Completeness

    present = sorted({int(r) for t in files for r in (t.ranks or [t.rank])})
    warnings: list[str] = []
    stated = _stated_world_sizes(files)
    world, source = None, ""
    captured = _captured_ranks(capture)
    if stated:
        world = next(iter(stated))
        source = " and ".join(sorted({_WORLD_SIZE_SOURCES.get(t.format, t.format) for t in files if t.world_size}))
        if captured is not None and captured != world:
            warnings.append(
                f"capture.json says {captured} ranks, the traces say world size {world}: "
                "capture.json is from another run; the traces' world size is used"
            )
    elif captured is not None and (not present or present[-1] < captured):
        world, source = captured, "capture.json"
    elif present and present != list(range(len(present))):
        world, source = present[-1] + 1, INFERRED_WORLD_SIZE
    missing = sorted(set(range(world)) - set(present)) if world else []
    cut_short = {
        int(rank): f"{trace.path.name} ends early: {trace.n_events_raw:,} complete events read"
        for trace in files
        if trace.truncated
        for rank in (trace.ranks or [trace.rank])
    }
    return Completeness(world, source, present, missing, cut_short), warnings


def _captured_ranks(capture: dict[str, Any] | None) -> int | None:
    """The rank count capture.json states: ``world_size`` (tracekit.trace_handler; it counts
    data-parallel replicas too), else ``p`` (tracekit capture runs one pipeline), if it is one."""
    ranks = capture.get("world_size", capture.get("p")) if isinstance(capture, dict) else None
    return ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 0 else None


def refuse_empty(path: Path, files: list[TraceFile], events: pd.DataFrame) -> None:
    """No events at all in any file: nothing any command can say about the run."""
    if len(events):
        return
    names = _name_list(sorted({t.path.name for t in files}))
    raise RunLayoutError(
        f"{path}: no events were read from {names}: the traces hold no profiled intervals "
        "(was the profiler's active window empty?); profile at least one step"
    )
