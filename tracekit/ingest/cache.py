"""Cache of parsed trace files: each file's normalised rows as Parquet, keyed by its content.

A second analysis of an unchanged run reads a few MB of typed columns instead of decoding
hundreds of MB of JSON. The key is the SHA-256 of the file's bytes together with what else
decides the rows: the file's name (a rank may come from it), the parse options
(``--rank-from``, ``--rank-map``), the tracekit version and a fingerprint of the parser code,
so a changed file, option or parser never meets an old entry.

Entries are written to a temporary name and renamed into place, so a reader never sees half
an entry. A missing, stale, truncated or corrupt entry (Parquet page checksums are written
and verified; the file facts in the footer carry their own SHA-256) is a miss: the file is
parsed again and the entry rewritten, never trusted. A file that changes while it is parsed
is not stored.

Whole analyses (``tracekit analyze``'s document) are kept too, keyed by the same digests,
stored without the run's paths and with a SHA-256 checked on every read; see
:func:`store_document`.

The cache lives in ``$TRACEKIT_CACHE_DIR`` or ``~/.cache/tracekit``, never beside the input
files. :func:`cache_usage` and :func:`clear_cache` (``tracekit cache info|clear``) count and
remove what tracekit wrote there, by its names, and nothing else in the folder. A root with a scheme (``s3://bucket/tracekit``, ``file:///shared/cache``) goes through
fsspec, so Dask workers on many machines can share one cache.

Hashing 200 MB takes ~0.25 s; to skip it on repeat runs, each local file's digest is
remembered with its (device, inode, size, mtime, ctime). The memo is used only when all five
match and the file had not changed for a second before it was hashed (a write within the
same clock tick as the hashing would otherwise go unseen), so the key is still the content.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tracekit.errors import TracekitError
from tracekit.ingest.columns import EventColumns
from tracekit.model.events import TraceFile, event_schema
from tracekit.version import __version__

# Bump when the meaning of a cached table changes in a way the code fingerprint would miss.
CACHE_FORMAT = 1
_HASH_BLOCK = 4 << 20
_RACY_NS = 1_000_000_000
_META_KEY = b"tracekit"

Parsed = list[tuple[TraceFile, EventColumns]]


def _filesystem(url: str):
    """The fsspec filesystem and path of a cache URL, or one line on what to install."""
    try:
        import fsspec
    except ImportError:
        raise TracekitError(
            f"{url}: a cache URL needs fsspec and the filesystem's package (e.g. pip "
            "install fsspec s3fs); or give a local folder"
        ) from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:  # a known protocol whose package is not installed
        raise TracekitError(f"{url}: {_first_line(err)} (e.g. pip install s3fs); or give a local folder") from None
    except ValueError as err:  # an unknown protocol
        raise TracekitError(
            f"{url}: not a cache location fsspec knows ({_first_line(err)}); give a "
            "local folder or a URL such as s3://bucket/tracekit"
        ) from None
    except Exception as err:  # a filesystem plugin failing to start (no JVM for hdfs, ...)
        raise TracekitError(
            f"{url}: the cache cannot be opened ({type(err).__name__}: {_first_line(err)}); give a local folder"
        ) from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def default_cache_dir() -> str:
    """``$TRACEKIT_CACHE_DIR``, else ``~/.cache/tracekit``."""
    return os.environ.get("TRACEKIT_CACHE_DIR") or str(Path.home() / ".cache" / "tracekit")


_FINGERPRINT: str | None = None


def fingerprint_sources() -> list[Path]:
    """The code :func:`code_fingerprint` digests: every module of :mod:`tracekit.ingest`, in
    any subfolder (the parsers are split across files by job), the C source of its native
    scanner (installed beside it), the event schema, and the names that decide which rows
    are kept (the Python frames of actions)."""
    here = Path(__file__).resolve().parent
    model = here.parent / "model"
    return sorted(here.rglob("*.py")) + sorted(here.rglob("*.c")) + [model / "events.py", model / "names.py"]


def code_fingerprint() -> str:
    """A digest of the code that turns a file into rows: a changed parser misses the cache
    even when the version number did not move (development, local patches)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = sources_digest(fingerprint_sources())
    return _FINGERPRINT


def sources_digest(sources: list[Path], seed: bytes = b"") -> str:
    """A short digest of tracekit source files: each one's path inside the package and its
    bytes, in the order given, after ``seed``."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(seed)
    for source in sources:
        digest.update(source.relative_to(root).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def file_stamp(path: Path) -> list[int]:
    """What changes whenever a file's bytes do (ctime moves on every write)."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclasses.dataclass
class Lookup:
    """What the cache knows about one file: its entry key (None when its digest is not
    known yet), the parse when there is a sound entry, and the file's stamp when looked at."""

    key: str | None
    parsed: Parsed | None
    stamp: list[int]


class ParseCache:
    """Parsed files under one root folder (local path or fsspec URL)."""

    def __init__(self, root: str | os.PathLike):
        root = str(root)
        if "://" in root:
            self.fs, base = _filesystem(root)
        else:
            self.fs, base = None, str(Path(root).expanduser())
        self.base = base.rstrip("/")
        self.root = root
        self.hits = 0
        self.misses = 0

    # -- lookups -----------------------------------------------------------------------
    def lookup(self, path: Path, options: dict, file_id: int, hash_file: bool = True) -> Lookup:
        """Find ``path``'s entry. Its digest comes from the memo, else (``hash_file``) from
        reading the file; without either there is no key and no hit."""
        path = Path(path)
        stamp = file_stamp(path)
        digest = self._remembered_digest(path, stamp)
        if digest is None and hash_file:
            digest = self._hash(path, stamp)
        if digest is None:
            return Lookup(None, None, stamp)
        key = self.entry_key(path.name, options, digest)
        return Lookup(key, self.load(key, path, file_id), stamp)

    def entry_key(self, name: str, options: dict, digest: str) -> str:
        ident = json.dumps(
            {
                "format": CACHE_FORMAT,
                "version": __version__,
                "code": code_fingerprint(),
                "name": name,
                "options": options,
                "content": digest,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(ident.encode()).hexdigest()

    def digest(self, path: Path) -> str:
        """The SHA-256 of ``path``'s bytes, from the memo when it can be trusted."""
        stamp = file_stamp(Path(path))
        return self._remembered_digest(Path(path), stamp) or self._hash(Path(path), stamp)

    @staticmethod
    def content_digest(path: Path) -> str:
        """The SHA-256 of ``path``'s bytes, read now (no memo)."""
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                digest.update(block)
        return digest.hexdigest()

    def _memo_path(self, path: Path) -> str:
        # os.fsencode: a folder name need not be UTF-8 (str.encode fails on its surrogates)
        return self._path("hashes", hashlib.sha256(os.fsencode(path.resolve())).hexdigest() + ".json")

    def _remembered_digest(self, path: Path, stamp: list[int]) -> str | None:
        memo = self._read_json(self._memo_path(path))
        if memo and memo.get("stamp") == stamp and memo.get("trusted") and isinstance(memo.get("sha256"), str):
            return memo["sha256"]
        return None

    def _hash(self, path: Path, stamp: list[int]) -> str:
        hashed_at = time.time_ns()
        sha = self.content_digest(path)
        if file_stamp(path) == stamp:  # unchanged while read: worth remembering
            trusted = max(stamp[3], stamp[4]) < hashed_at - _RACY_NS
            memo = {"stamp": stamp, "sha256": sha, "trusted": trusted}
            self._write(self._memo_path(path), lambda fh: fh.write(json.dumps(memo).encode()))
        return sha

    # -- entries -----------------------------------------------------------------------
    def entry_path(self, key: str) -> str:
        return self._path("entries", key[:2], key + ".parquet")

    def load(self, key: str, path: Path, file_id: int) -> Parsed | None:
        """The cached parse of ``path``, or None when there is no sound entry."""
        entry = self.entry_path(key)
        if self.fs is None and not os.path.exists(entry):
            self.misses += 1  # a miss needs no pyarrow (parser workers do not import it)
            return None
        import pyarrow.parquet as pq

        try:
            if self.fs is None:
                table = pq.read_table(entry, page_checksum_verification=True, read_dictionary=["cat", "name"])
            else:
                with self.fs.open(entry, "rb") as fh:
                    table = pq.read_table(fh, page_checksum_verification=True, read_dictionary=["cat", "name"])
            parsed = self._unpack(table, key, Path(path), file_id)
        except FileNotFoundError:
            self.misses += 1
            return None
        except Exception:  # a truncated, corrupt or foreign entry: parse again, overwrite it
            self.misses += 1
            self._remove(entry)
            return None
        self.hits += 1
        return parsed

    def _unpack(self, table, key: str, path: Path, file_id: int) -> Parsed:
        meta = json.loads(table.schema.metadata[_META_KEY])
        if meta.get("key") != key or table.schema.names != event_schema().names:
            raise ValueError("entry does not match its key or the event schema")
        files = meta["files"]
        if meta.get("files_sha256") != _facts_digest(files):
            raise ValueError("the entry's file facts are not the ones stored")
        if sum(f["rows"][1] - f["rows"][0] for f in files) != table.num_rows:
            raise ValueError("entry rows do not add up")
        field_names = {f.name for f in dataclasses.fields(TraceFile)} - {"path"}
        out = []
        for item in files:
            lo, hi = item.pop("rows")
            columns = EventColumns.from_arrow(table.slice(lo, hi - lo))
            columns.numbers["file_id"] = np.full(len(columns), file_id, dtype=np.int32)
            facts = {k: _arrays(v) for k, v in item.items() if k in field_names}
            out.append((TraceFile(path=path, **facts), columns))
        return out

    def store(self, key: str, parsed: Parsed) -> None:
        """Write the parse of one file as an entry, atomically."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files, tables, row = [], [], 0
        for trace, columns in parsed:
            facts = {k: v for k, v in dataclasses.asdict(trace).items() if k != "path"}
            facts["rows"] = [row, row + len(columns)]
            row += len(columns)
            files.append(facts)
            tables.append(columns.to_arrow())
        table = pa.concat_tables(tables) if tables else event_schema().empty_table()
        files = json.loads(json.dumps(files, default=_json_value))  # as they will read back
        meta = json.dumps(
            {"key": key, "version": __version__, "files": files, "files_sha256": _facts_digest(files)}
        ).encode()
        table = table.replace_schema_metadata({_META_KEY: meta})
        self._write(
            self.entry_path(key), lambda fh: pq.write_table(table, fh, compression="snappy", write_page_checksum=True)
        )

    # -- storage -----------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join([self.base, f"v{CACHE_FORMAT}", *parts])

    def read_file(self, path: str) -> bytes | None:
        """The bytes of ``path`` in the cache, or None when it cannot be read."""
        try:
            if self.fs is None:
                return Path(path).read_bytes()
            with self.fs.open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def _read_json(self, path: str) -> dict | None:
        data = self.read_file(path)
        try:
            value = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the cache, whole or not at all."""
        self._write(path, lambda fh: fh.write(data))

    def _write(self, path: str, write: Callable) -> None:
        """Write ``path`` through a temporary file and a rename: readers see the old entry
        or the new one, never a part. A cache that cannot be written (read-only, full disk)
        is skipped: it only ever saves time."""
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if self.fs is None:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(tmp, "wb") as fh:
                    write(fh)
                os.replace(tmp, path)
            else:
                self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
                with self.fs.open(tmp, "wb") as fh:
                    write(fh)
                self.fs.mv(tmp, path)
        except Exception:
            self._remove(tmp)

    def _remove(self, path: str) -> None:
        try:
            if self.fs is None:
                os.unlink(path)
            else:
                self.fs.rm(path)
        except OSError:
            pass


_ARRAY_KEY = "__int64_array__"


def _json_value(value: Any) -> Any:
    """JSON for what a file's facts hold beyond JSON: an int64 array (a rank's reduce sends
    its device ops as arrays) as one base64 block, not a number per value; else its str."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return {_ARRAY_KEY: base64.b64encode(np.ascontiguousarray(value, dtype="<i8").tobytes()).decode("ascii")}
    return str(value)


def _arrays(value: Any) -> Any:
    """The arrays :func:`_json_value` wrote, again (int64), wherever they lie in ``value``."""
    if isinstance(value, dict):
        if set(value) == {_ARRAY_KEY}:
            return np.frombuffer(base64.b64decode(value[_ARRAY_KEY]), dtype="<i8").astype(np.int64)
        return {k: _arrays(v) for k, v in value.items()}
    return value  # (no array lies in a list)


def _facts_digest(files: list) -> str:
    """Parquet checksums cover the column pages, not the footer's metadata, where the file
    facts (rank, world size, ...) are: they carry their own digest."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


# -- whole analyses ---------------------------------------------------------------------
# ``tracekit analyze`` renders from its JSON document, so an unchanged run with the same
# options can be answered from the document alone: no parsing, no reconstruction, no replay.


def package_fingerprint() -> str:
    """A digest of all of tracekit's code: any change to analysis or rendering misses."""
    package = Path(__file__).resolve().parents[1]
    return sources_digest(sorted(package.rglob("*.py")) + sorted(package.rglob("*.c")), __version__.encode())


def analysis_key(cache: ParseCache, run: Path, paths: list[Path], options: dict, extra_files: list[Path]) -> str | None:
    """The key of a whole analysis: every trace file's content and place in the run (from
    the digest memo only, so the lookup reads no trace), ``extra_files``' bytes
    (capture.json), the options and the code; not where the run is, so a copy of a run
    shares its analysis. None when some file's digest is not remembered yet."""
    parts = []
    for path in paths:
        digest = cache._remembered_digest(Path(path), file_stamp(Path(path)))
        if digest is None:
            return None
        parts.append([_place_in_run(Path(path), Path(run)), digest])
    extras = [[p.name, hashlib.sha256(p.read_bytes()).hexdigest()] for p in extra_files if p.is_file()]
    ident = json.dumps(
        {"format": CACHE_FORMAT, "files": parts, "extra": extras, "options": options, "code": package_fingerprint()},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(ident.encode()).hexdigest()


def _place_in_run(path: Path, run: Path) -> str:
    return path.relative_to(run).as_posix() if path != run else path.name


# A stored document is "<SHA-256 of the rest>\n<the document as JSON>", with its "source"
# and each "files[].path" left out (null, and the index of the file among the run's trace
# files): the answer names the folder it is asked about, not the one it was computed for.


def store_document(cache: ParseCache, key: str, document: dict, source: str, files: list[Path]) -> None:
    """Store ``document`` (the analysis of the run ``source`` made of ``files``) under
    ``key``, without its paths; a document naming other paths is not stored."""
    index = {str(path): number for number, path in enumerate(files)}
    described = document.get("files")
    if (
        document.get("source") != source
        or not isinstance(described, list)
        or any(not isinstance(f, dict) or f.get("path") not in index for f in described)
    ):
        return
    stored = {**document, "source": None, "files": [{**f, "path": index[f["path"]]} for f in described]}
    body = json.dumps(stored).encode()
    cache.write_file(_document_path(cache, key), hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def load_document(cache: ParseCache, key: str, source: str, files: list[Path]) -> dict | None:
    """The document stored under ``key``, naming ``source`` and ``files``; None when there
    is none or it is not exactly what was stored (cut short, altered): analyse again."""
    data = cache.read_file(_document_path(cache, key))
    if data is None:
        return None
    checksum, _, body = data.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != checksum:
        return None
    try:
        document = json.loads(body)
        document["source"] = source
        for described in document["files"]:
            described["path"] = str(files[described["path"]])
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return document


def _document_path(cache: ParseCache, key: str) -> str:
    return cache._path("analyses", key[:2], key + ".json")


# -- what is stored: tracekit cache info / clear --------------------------------------------
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


def cache_usage(root: str | os.PathLike) -> CacheUsage:
    """How many of tracekit's files the cache at ``root`` holds, by kind, and their bytes."""
    cache = _open_cache(root)
    usage = CacheUsage(str(root), dict.fromkeys(OWN_KINDS, 0), 0)
    for _path, kind, size in _own_files(cache, usage):
        usage.files[kind] += 1
        usage.bytes += size
    return usage


def clear_cache(root: str | os.PathLike) -> CacheUsage:
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


def _open_cache(root: str | os.PathLike) -> ParseCache:
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
        yield f"{base}/{relative}", kind, size


def _local_files(cache: ParseCache) -> Iterator[tuple[str, int | None]]:
    """(path relative to the root, bytes) of every file in its format folders (bytes None:
    not a regular file), and (name, None) for each other thing at the top of the root."""

    def fail(err: OSError):
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
        raise TracekitError(f"cache {cache.root}: cannot list it ({type(err).__name__}: {_first_line(err)})") from None
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
