"""``tracekit cache info|clear``: what the parse cache holds, and emptying it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from tracekit.text import for_terminal
from tracekit.vocab import format_bytes

if TYPE_CHECKING:
    from tracekit.commands.cache_contents import CacheUsage

_CACHE_DIR_HELP = (
    "The cache folder (a path or an fsspec URL; default: $TRACEKIT_CACHE_DIR or "
    "~/.cache/tracekit), as given to the other commands' --cache-dir."
)
_KIND_NAMES = {
    "entries": ("parsed file", "parsed files"),
    "analyses": ("analysis", "analyses"),
    "hashes": ("file digest", "file digests"),
    "temporary": ("unfinished write", "unfinished writes"),
}


@click.group("cache")
def command() -> None:
    """The cache of parsed trace files and analyses that makes a second look at a run fast.

    Each trace file's parsed rows are kept by the SHA-256 of its bytes (with the options
    and tracekit's code), so an entry can never answer for a changed file: clearing the
    cache only costs the time of parsing again.

    \b
    Examples:
      tracekit cache info
      tracekit cache clear --cache-dir /scratch/tracekit-cache
    """


@command.command("info")
@click.option("--cache-dir", metavar="DIR", help=_CACHE_DIR_HELP)
def info(cache_dir: str | None) -> None:
    """Where the cache is, how many entries it holds and their size."""
    from tracekit.commands.cache_contents import cache_usage

    root, origin = _root(cache_dir)
    usage = cache_usage(root)
    click.echo(for_terminal(f"cache: {root} ({origin})"))
    click.echo(f"  {_contents(usage)}" if usage.n_files else "  empty: nothing cached yet")
    if usage.others:
        click.echo(f"  {usage.others} other file(s) or folder(s) there are not tracekit's: clear leaves them")


@command.command("clear")
@click.option("--cache-dir", metavar="DIR", help=_CACHE_DIR_HELP)
def clear(cache_dir: str | None) -> None:
    """Remove tracekit's entries from the cache, and nothing else in its folder.

    Safe while another tracekit runs: it parses again what it no longer finds.
    """
    from tracekit.commands.cache_contents import clear_cache

    root, _origin = _root(cache_dir)
    removed = clear_cache(root)
    if removed.n_files:
        click.echo(for_terminal(f"removed from the cache {root}: {_contents(removed)}"))
    else:
        click.echo(for_terminal(f"the cache {root} holds nothing of tracekit's: nothing removed"))


def _root(option: str | None) -> tuple[str, str]:
    from tracekit.ingest.cache import default_cache_dir

    if option:
        return option, "--cache-dir"
    return default_cache_dir(), "$TRACEKIT_CACHE_DIR" if os.environ.get("TRACEKIT_CACHE_DIR") else "the default"


def _contents(usage: CacheUsage) -> str:
    kinds = [f"{n} {_KIND_NAMES[kind][n != 1]}" for kind, n in usage.files.items() if n]
    return f"{', '.join(kinds)}: {format_bytes(usage.bytes)}"
