"""What tracekit keeps in a cache folder, by kind: counted (``tracekit cache info``) and
removed (``tracekit cache clear``).

The folder holds parsed files and their digests (:mod:`tracekit.ingest.cache`) and whole
analyses (:mod:`tracekit.commands.document_cache`). Only the names tracekit writes are
counted and removed, by their names, and nothing else in the folder.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Iterator
from typing import NoReturn

from tracekit.errors import TracekitError
from tracekit.ingest.cache import ParseCache, first_line

# Only the names tracekit writes, under each cache format's folder: a parsed file, a whole
# analysis, a file's digest memo, and the temporary of a write that was cut short. A user's
# own files in the same folder (or a cache folder pointed at a busy one) never match.
_KEY = r"[0-9a-f]{64}"
_OWN_FILE = re.compile(
    rf"v\d+/(?:(?P<entries>entries/(?P<e>[0-9a-f]{{2}})/(?P=e)[0-9a-f]{{62}}\.parquet)"
    rf"|(?P<analyses>analyses/(?P<a>[0-9a-f]{{2}})/(?P=a)[0-9a-f]{{62}}\.json)"
    rf"|(?P<hashes>hashes/{_KEY}\.json))(?P<temporary>\.tmp-\d+-[0-9a-f]{{8}})?"
)
_FORMAT_FOLDER = re.compile(r"v\d+")
OWN_KINDS = ("entries", "analyses", "hashes", "temporary")


@dataclasses.dataclass
class CacheUsage:
    """What tracekit keeps in one cache folder (or, from :func:`clear_cache`, what it removed)."""

    root: str
    files: dict[str, int]  # kind (OWN_KINDS) -> how many
    bytes: int
    others: int = 0  # files and folders there that are not tracekit's: left alone

    @property
    def n_files(self) -> int:
        return sum(self.files.values())


def cache_usage(root: str | os.PathLike[str]) -> CacheUsage:
    """How many of tracekit's files the cache at ``root`` holds, by kind, and their bytes."""
    cache = _open_cache(root)
    usage = CacheUsage(str(root), dict.fromkeys(OWN_KINDS, 0), 0)
    for _path, kind, size in _own_files(cache, usage):
        usage.files[kind] += 1
        usage.bytes += size
    return usage


def clear_cache(root: str | os.PathLike[str]) -> CacheUsage:
    """Remove tracekit's files from the cache at ``root``, and the folders that leaves empty;
    nothing else there. Each file goes in one unlink, so a tracekit running meanwhile reads a
    whole entry or none (a miss: it parses again), and one whose temporary is removed under
    it skips storing that entry. Returns what was removed; a file that cannot be removed is
    one :class:`TracekitError` line saying how far it got."""
    cache = _open_cache(root)
    removed = CacheUsage(str(root), dict.fromkeys(OWN_KINDS, 0), 0)
    for path, kind, size in list(_own_files(cache, removed)):
        try:
            if cache.fs is None:
                os.unlink(path)
            else:
                cache.fs.rm_file(path)
        except FileNotFoundError:
            continue  # another tracekit replaced or removed it meanwhile
        except OSError as err:
            raise TracekitError(
                f"cache {root}: cannot remove {path} ({err.strerror or err}); removed "
                f"{removed.n_files} files before it, the rest are still there"
            ) from None
        removed.files[kind] += 1
        removed.bytes += size
    if cache.fs is None:
        _remove_empty_folders(cache.base)
    return removed


def _open_cache(root: str | os.PathLike[str]) -> ParseCache:
    cache = ParseCache(root)
    if cache.fs is None and os.path.lexists(cache.base) and not os.path.isdir(cache.base):
        raise TracekitError(f"cache {root}: is a file, not a cache folder; give the folder tracekit caches in")
    return cache


def _own_files(cache: ParseCache, usage: CacheUsage) -> Iterator[tuple[str, str, int]]:
    """(path, kind, bytes) of each of tracekit's files in ``cache``; counts the rest in
    ``usage.others``. Symlinks are never followed nor counted as tracekit's: it writes none."""
    base = cache.base
    for relative, size in _local_files(cache) if cache.fs is None else _remote_files(cache):
        match = _OWN_FILE.fullmatch(relative) if size is not None else None
        if match is None:
            usage.others += 1
            continue
        kind = "temporary" if match["temporary"] else next(k for k in OWN_KINDS[:3] if match[k])
        assert size is not None  # only a regular file's name was matched
        yield f"{base}/{relative}", kind, size


def _local_files(cache: ParseCache) -> Iterator[tuple[str, int | None]]:
    """(path relative to the root, bytes) of every file in its format folders (bytes None:
    not a regular file), and (name, None) for each other thing at the top of the root."""

    def fail(err: OSError) -> NoReturn:
        raise TracekitError(f"cache {cache.root}: cannot read {err.filename} ({err.strerror})")

    try:
        top = sorted(os.scandir(cache.base), key=lambda e: e.name)
    except FileNotFoundError:
        return  # nothing cached yet
    except OSError as err:
        fail(err)
    for item in top:
        if not (_FORMAT_FOLDER.fullmatch(item.name) and item.is_dir(follow_symlinks=False)):
            yield item.name, None
            continue
        for folder, _dirs, names in os.walk(item.path, onerror=fail):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue  # removed meanwhile
                relative = os.path.relpath(path, cache.base).replace(os.sep, "/")
                yield relative, st.st_size if stat.S_ISREG(st.st_mode) else None


def _remote_files(cache: ParseCache) -> Iterator[tuple[str, int | None]]:
    try:
        found = cache.fs.find(cache.base, detail=True)
    except FileNotFoundError:
        return
    except Exception as err:  # the storage's own errors (credentials, network)
        raise TracekitError(f"cache {cache.root}: cannot list it ({type(err).__name__}: {first_line(err)})") from None
    for path, info in sorted(found.items()):
        relative = path[len(cache.base) :].lstrip("/")
        yield relative, int(info.get("size") or 0) if info.get("type") == "file" else None


def _remove_empty_folders(base: str) -> None:
    """The folders tracekit made, deepest first, where clearing left them empty."""
    for item in os.scandir(base) if os.path.isdir(base) else ():
        if not (_FORMAT_FOLDER.fullmatch(item.name) and item.is_dir(follow_symlinks=False)):
            continue
        for folder, _dirs, _names in os.walk(item.path, topdown=False):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: something of someone else's, or written meanwhile
