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

The cache lives in ``$TRACEKIT_CACHE_DIR`` or ``~/.cache/tracekit``, never beside the input
files. A root with a scheme (``s3://bucket/tracekit``, ``file:///shared/cache``) goes through
fsspec, so Dask workers on many machines can share one cache. The commands keep whole
analyses in the same folder (:mod:`tracekit.commands.document_cache`) and count and clear
it (:mod:`tracekit.commands.cache_contents`).

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
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tracekit.errors import TracekitError
from tracekit.ingest.columns import EventColumns, Parsed
from tracekit.model.events import TraceFile, event_schema
from tracekit.version import __version__

# Bump when the meaning of a cached table changes in a way the code fingerprint would miss.
CACHE_FORMAT = 1
_HASH_BLOCK = 4 << 20
_RACY_NS = 1_000_000_000
_META_KEY = b"tracekit"


def _filesystem(url: str) -> tuple[Any, str]:  # (an fsspec filesystem, its path)
    """The fsspec filesystem and path of a cache URL, or one line on what to install."""
    try:
        import fsspec
    except ImportError:
        raise TracekitError(
            f"{url}: a cache URL needs fsspec and the filesystem's package (e.g. pip "
            "install fsspec s3fs); or give a local folder"
        ) from None
    try:
        fs_and_path: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return fs_and_path
    except ImportError as err:  # a known protocol whose package is not installed
        raise TracekitError(f"{url}: {first_line(err)} (e.g. pip install s3fs); or give a local folder") from None
    except ValueError as err:  # an unknown protocol
        raise TracekitError(
            f"{url}: not a cache location fsspec knows ({first_line(err)}); give a "
            "local folder or a URL such as s3://bucket/tracekit"
        ) from None
    except Exception as err:  # a filesystem plugin failing to start (no JVM for hdfs, ...)
        raise TracekitError(
            f"{url}: the cache cannot be opened ({type(err).__name__}: {first_line(err)}); give a local folder"
        ) from None


def first_line(err: Exception) -> str:
    """The first line of an error's message (its type's name where it has none)."""
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

    def __init__(self, root: str | os.PathLike[str]):
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
    def lookup(self, path: Path, options: dict[str, Any], file_id: int, hash_file: bool = True) -> Lookup:
        """Find ``path``'s entry. Its digest comes from the memo, else (``hash_file``) from
        reading the file; without either there is no key and no hit."""
        path = Path(path)
        stamp = file_stamp(path)
        digest = self.remembered_digest(path, stamp)
        if digest is None and hash_file:
            digest = self._hash(path, stamp)
        if digest is None:
            return Lookup(None, None, stamp)
        key = self.entry_key(path.name, options, digest)
        return Lookup(key, self.load(key, path, file_id), stamp)

    def entry_key(self, name: str, options: dict[str, Any], digest: str) -> str:
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
        return self.remembered_digest(Path(path), stamp) or self._hash(Path(path), stamp)

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
        return self.location("hashes", hashlib.sha256(os.fsencode(path.resolve())).hexdigest() + ".json")

    def remembered_digest(self, path: Path, stamp: list[int]) -> str | None:
        """The digest the memo holds for ``path`` with ``stamp``, if it can be trusted; no
        file is read."""
        memo = self._read_json(self._memo_path(path))
        if memo and memo.get("stamp") == stamp and memo.get("trusted") and isinstance(memo.get("sha256"), str):
            digest: str = memo["sha256"]
            return digest
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
        return self.location("entries", key[:2], key + ".parquet")

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

    def _unpack(self, table: Any, key: str, path: Path, file_id: int) -> Parsed:
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
    def location(self, *parts: str) -> str:
        """Where a file of the cache lives: under the folder of this cache format."""
        return "/".join([self.base, f"v{CACHE_FORMAT}", *parts])

    def read_file(self, path: str) -> bytes | None:
        """The bytes of ``path`` in the cache, or None when it cannot be read."""
        try:
            if self.fs is None:
                return Path(path).read_bytes()
            with self.fs.open(path, "rb") as fh:
                data: bytes = fh.read()
                return data
        except OSError:
            return None

    def _read_json(self, path: str) -> dict[str, Any] | None:
        data = self.read_file(path)
        try:
            value = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` in the cache, whole or not at all."""
        self._write(path, lambda fh: fh.write(data))

    def _write(self, path: str, write: Callable[..., Any]) -> None:
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


def _facts_digest(files: list[Any]) -> str:
    """Parquet checksums cover the column pages, not the footer's metadata, where the file
    facts (rank, world size, ...) are: they carry their own digest."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
