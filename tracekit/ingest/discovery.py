"""Finding the trace files of a run: in the folder given, else in the layouts frameworks write.

Traces at the top of the folder are the run. A folder with none there is searched (a few
levels down, hidden and cache folders left out) for folders of traces, such as torchtitan's
``profiling/traces/iteration_<N>/rank<R>_trace.json.gz`` or Megatron-LM's
``torch_profile/rank-<R>.json.gz``. Of several ``iteration_<N>`` folders the highest is
taken (``iteration`` chooses another) and a warning says so. Files that are not traces are
skipped with one warning naming them; see :mod:`tracekit.ingest.sniff`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, cast

from tracekit.errors import RunLayoutError, TracekitError
from tracekit.ingest.sniff import KINETO, KINETO_SUFFIXES, NSYS_SUFFIXES, trace_format

# tracekit's own files: never traces. capture.json is the run's manifest, read as such.
IGNORED_NAMES = {"capture.json", "baseline.json", "tracekit.json"}
MANIFEST_NAME = "capture.json"
_SEARCH_DEPTH = 4
# A folder with no traces at its top and this many entries below is not a run folder
# (a home directory, a dataset): searching it all would look like a hang.
_SEARCH_ENTRIES = 20_000
_ITERATION_FOLDER = re.compile(r"(?:iteration|iter|step)[-_]?(\d+)", re.IGNORECASE)
_LISTED_NAMES = 8
# A link whose target cannot be reached: it points to itself (ELOOP) or to nothing.
_BROKEN_LINK = "a symbolic link that loops or points nowhere"


@dataclasses.dataclass
class Discovery:
    """The trace files of a run (stable order), each one's format, and what to tell the user
    about how they were found."""

    files: list[Path]
    formats: dict[Path, str]
    warnings: list[str]
    skipped: list[str]  # names (relative to the run folder) of files that are not traces


def compile_rank_pattern(rank_pattern: str | None) -> re.Pattern[str] | None:
    """``--rank-from`` as a regex with a group, or one line saying what is wrong with it."""
    if rank_pattern is None:
        return None
    try:
        pattern = re.compile(rank_pattern)
    except re.error as err:
        raise TracekitError(
            f"--rank-from {rank_pattern!r}: not a regular expression ({err}); give one like 'rank(\\d+)'"
        ) from None
    if pattern.groups < 1:
        raise TracekitError(
            f"--rank-from {rank_pattern!r}: has no group; put the rank number in parentheses, e.g. 'rank(\\d+)'"
        )
    return pattern


def find_traces(path: Path, iteration: int | None = None, rank_pattern: str | None = None) -> Discovery:
    """The trace files of the run folder ``path`` (or the one file given).

    Raises :class:`RunLayoutError` when there are none, when traces of one rank sit in two
    folders that are not iterations, or when ``iteration`` names no folder there."""
    path = Path(path)
    pattern = compile_rank_pattern(rank_pattern)
    if not path.exists():
        if path.is_symlink():
            raise RunLayoutError(f"{path}: {_BROKEN_LINK}; give a run folder of trace files")
        raise RunLayoutError(f"{path}: no such file or folder; give a run folder of trace files")
    if path.is_file():
        if iteration is not None:
            raise RunLayoutError(
                f"--iteration {iteration}: {path} is one file; --iteration chooses "
                "among the iteration_N folders of a run folder"
            )
        claimed_format = trace_format(path, pattern, claimed=True)
        assert claimed_format is not None  # a file the user names always has a format
        found = Discovery([path], {path: claimed_format}, [], [])
    else:
        found = _search(path, iteration, pattern)
    _check_rank_pattern(found, rank_pattern, pattern)
    return found


def discover(path: Path, iteration: int | None = None, rank_pattern: str | None = None) -> list[Path]:
    """The trace files of a run folder (or the one file given), in a stable order; see
    :func:`find_traces` for how they are found."""
    return find_traces(path, iteration, rank_pattern).files


def every_trace(path: Path) -> list[Path]:
    """Every trace under a run folder, of every iteration and subfolder, not only those a
    load would take: what no output may be written over."""
    path = Path(path)
    if not path.is_dir():
        return [path] if path.exists() else []
    traces = set(_traces_in(path, path, None)[0])
    for found, _ in _trace_folders(path, None).values():
        traces.update(found)
    return sorted(traces)


def _search(run: Path, iteration: int | None, pattern: re.Pattern[str] | None) -> Discovery:
    formats, skipped = _traces_in(run, run, pattern)
    warnings: list[str] = []
    if formats:
        if iteration is not None:
            raise RunLayoutError(
                f"--iteration {iteration}: {run} holds its traces at the top, in no "
                "iteration_N folder; drop --iteration"
            )
    else:
        folders = _trace_folders(run, pattern)
        chosen, warnings = _choose(run, folders, iteration)
        for found, skipped_there in chosen.values():
            formats.update(found)
            skipped += skipped_there
        _refuse_one_rank_in_two_folders(run, chosen, pattern)
    if not formats:
        looked = "*.json, *.json.gz, *.sqlite, *.nsys-rep, also in subfolders"
        also = f"; what is there is not a trace: {_listing(skipped)}" if skipped else ""
        raise RunLayoutError(
            f"{run}: no trace files found (looked for {looked}){also}; point at the folder your profiler wrote"
        )
    if skipped:
        warnings.insert(
            0,
            f"skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} that "
            f"{'are' if len(skipped) > 1 else 'is'} not a trace: {_listing(skipped)}",
        )
    files = sorted(formats)
    return Discovery(files, {f: formats[f] for f in files}, warnings, skipped)


def _traces_in(folder: Path, run: Path, pattern: re.Pattern[str] | None) -> tuple[dict[Path, str], list[str]]:
    """The traces directly in ``folder`` with their formats, and the names of the files
    there that have a trace's suffix but are not traces."""
    formats: dict[Path, str] = {}
    skipped: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError as err:
        raise RunLayoutError(f"{folder}: cannot be listed ({err.strerror}); check its permissions") from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if not entry.is_file():
            if (
                entry.is_symlink()
                and not entry.exists()
                and entry.name.lower().endswith(KINETO_SUFFIXES + NSYS_SUFFIXES)
            ):
                skipped.append(f"{_relative(entry, run)} ({_BROKEN_LINK})")
            continue
        if entry.name in IGNORED_NAMES:
            if entry.name != MANIFEST_NAME:
                skipped.append(_relative(entry, run))
            continue
        kind = trace_format(entry, pattern)
        if kind is not None:
            formats[entry] = kind
        elif entry.name.lower().endswith(KINETO_SUFFIXES + NSYS_SUFFIXES):
            skipped.append(_relative(entry, run))
    return formats, skipped


def _trace_folders(run: Path, pattern: re.Pattern[str] | None) -> dict[Path, tuple[dict[Path, str], list[str]]]:
    """Every folder below ``run`` (to a bounded depth) that holds traces, with them; the
    search goes no deeper into a folder of traces."""
    found: dict[Path, tuple[dict[Path, str], list[str]]] = {}
    entries = 0
    level = [run]
    for _ in range(_SEARCH_DEPTH):
        below: list[Path] = []
        for folder in level:
            for child in sorted(_subfolders(folder)):
                entries += 1
                if entries > _SEARCH_ENTRIES:
                    raise RunLayoutError(
                        f"{run}: no traces at its top and over {_SEARCH_ENTRIES} folders below; point "
                        "at the folder your profiler wrote"
                    )
                formats, skipped = _traces_in(child, run, pattern)
                if formats:
                    found[child] = (formats, skipped)
                else:
                    below.append(child)
        level = below
    return found


def _subfolders(folder: Path) -> list[Path]:
    try:
        children = list(os.scandir(folder))
    except OSError:  # unreadable folders hold nothing we could read either
        return []
    # unreadable folders (lost+found) are left out like hidden ones: nothing there could be
    # read; so are links that loop or point nowhere
    return [
        Path(c.path)
        for c in children
        if _is_folder(c)
        and not c.name.startswith((".", "_"))
        and os.access(c.path, os.R_OK | os.X_OK)
        and not _is_cache_folder(Path(c.path))
    ]


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link that loops (ELOOP) or cannot be followed
        return False


def _is_cache_folder(folder: Path) -> bool:
    """tracekit's cache (``--cache-dir`` inside the run folder): v<N>/hashes."""
    return any(re.fullmatch(r"v\d+", child.name) and (child / "hashes").is_dir() for child in folder.iterdir())


def _choose(run: Path, folders: dict[Any, Any], iteration: int | None) -> tuple[dict[Any, Any], list[str]]:
    """The folders that make the run: every folder of traces, but of the iteration_N
    folders only those of one N (``iteration``, else the highest)."""
    numbers = {folder: int(m.group(1)) for folder in folders if (m := _ITERATION_FOLDER.fullmatch(folder.name))}
    if not numbers:
        if iteration is not None:
            raise RunLayoutError(f"--iteration {iteration}: {run} has no iteration_N folders; drop --iteration")
        return folders, []
    available = sorted(set(numbers.values()))
    names = sorted(
        {folder.name for folder in numbers},
        key=lambda name: int(cast(re.Match[str], _ITERATION_FOLDER.fullmatch(name)).group(1)),  # each one matched
    )
    if iteration is None:
        taken = available[-1]
    elif iteration in available:
        taken = iteration
    else:
        raise RunLayoutError(f"--iteration {iteration}: {run} has no such iteration; it has {', '.join(names)}")
    chosen = {folder: traces for folder, traces in folders.items() if numbers.get(folder, taken) == taken}
    warnings = []
    if len(available) > 1:
        taken_names = ", ".join(sorted({f.name for f in chosen if f in numbers}))
        warnings.append(
            f"{len(available)} iterations found ({', '.join(names)}): analysed {taken_names}; --iteration N to choose"
        )
    return chosen, warnings


def _refuse_one_rank_in_two_folders(run: Path, chosen: dict[Any, Any], pattern: re.Pattern[str] | None) -> None:
    """Folders of traces that are not iterations of one another are read as one run; a rank
    (by file name) in two of them means they are not one run."""
    if len(chosen) < 2:
        return
    from tracekit.ingest.kineto import rank_from_name

    seen: dict[object, Path] = {}
    for folder in sorted(chosen):
        for trace in sorted(chosen[folder][0]):
            match = pattern.search(trace.name) if pattern is not None else None
            rank = int(match.group(1)) if match and match.group(1) is not None else rank_from_name(trace)
            ident = ("rank", rank) if rank is not None else ("name", trace.name)
            if ident in seen:
                what = f"rank {rank}" if rank is not None else trace.name
                raise RunLayoutError(
                    f"{what} has a trace in both {_relative(seen[ident], run)} and {_relative(trace, run)}, "
                    "folders that are not iterations of one run; point at one of them"
                )
            seen[ident] = trace


def _check_rank_pattern(found: Discovery, text: str | None, pattern: re.Pattern[str] | None) -> None:
    """Before any parsing: every Kineto trace's name must give its rank to ``--rank-from``."""
    if pattern is None:
        return
    unmatched = [
        f.name for f in found.files if found.formats[f] == KINETO and not ((m := pattern.search(f.name)) and m.group(1))
    ]
    if unmatched:
        raise TracekitError(
            f"--rank-from {text!r}: finds no rank in {_listing(unmatched)}; give a "
            "regex whose group matches the rank number in each file name"
        )
    for trace in found.files:
        match = pattern.search(trace.name)
        if match and match.group(1) and not match.group(1).isdecimal():
            raise TracekitError(
                f"--rank-from {text!r}: its group matches {match.group(1)!r} in {trace.name}, "
                "not a rank number; make the group match digits only, e.g. 'rank(\\d+)'"
            )


def _relative(path: Path, run: Path) -> str:
    return path.relative_to(run).as_posix()


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED_NAMES])
    return shown + (f" and {len(names) - _LISTED_NAMES} more" if len(names) > _LISTED_NAMES else "")
