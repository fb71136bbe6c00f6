"""Options and helpers shared by the subcommands that read a run."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from tracekit.errors import TracekitError


def rank_options(func):
    """--rank-from, --rank-map and --progress/--no-progress."""

    @click.option("--rank-from", metavar="REGEX",
                  help="Take each file's rank from its name with this regex (one group), e.g. 'worker(\\d+)'. "
                       "Default: distributedInfo, else a rank number in the file name.")
    @click.option("--rank-map", metavar="PID=RANK,...",
                  help="Nsight Systems: which process is which rank, e.g. '4242=0,4243=1'.")
    @click.option("--progress/--no-progress", default=None,
                  help="Show a progress bar while loading (default: when stderr is a terminal).")
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


def parse_rank_map(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    mapping = {}
    for item in text.split(","):
        try:
            pid, rank = item.split("=")
            mapping[int(pid)] = int(rank)
        except ValueError:
            raise TracekitError(f"--rank-map: {item!r} is not PID=RANK; write e.g. '4242=0,4243=1'") from None
    return mapping


def load_with_progress(path: Path, rank_from: str | None, rank_map: str | None, progress: bool | None):
    """Load and reconstruct a run, with a progress bar over files on long loads."""
    from tracekit.ingest import discover, load_run

    show = sys.stderr.isatty() if progress is None else progress
    files = discover(path)
    if not show or len(files) < 2:
        return load_run(path, rank_from=rank_from, rank_map=parse_rank_map(rank_map))
    from tqdm import tqdm

    with tqdm(total=len(files), unit="file", desc="reading traces", file=sys.stderr, leave=False) as bar:
        return load_run(path, rank_from=rank_from, rank_map=parse_rank_map(rank_map),
                        progress=lambda _: bar.update(1))
