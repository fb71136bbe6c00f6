"""Whole analyses, kept: ``tracekit analyze`` renders from its JSON document, so an unchanged
run with the same options is answered from the stored document alone (no parsing, no
reconstruction, no replay).

A document is kept in the parse cache's folder (:class:`~tracekit.ingest.cache.ParseCache`),
keyed by the digests the cache remembers of the run's trace files with the options and all
of tracekit's code, without the run's paths and with a SHA-256 checked on every read.
:func:`tracekit.commands.common.cached_document` and ``remember_document`` use it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tracekit.ingest.cache import CACHE_FORMAT, ParseCache, file_stamp, sources_digest
from tracekit.version import __version__

if TYPE_CHECKING:
    from tracekit.schemas.analysis import AnalysisDocument


def package_fingerprint() -> str:
    """A digest of all of tracekit's code: any change to analysis or rendering misses."""
    package = Path(__file__).resolve().parents[1]
    return sources_digest(sorted(package.rglob("*.py")) + sorted(package.rglob("*.c")), __version__.encode())


def analysis_key(
    cache: ParseCache, run: Path, paths: list[Path], options: dict[str, Any], extra_files: list[Path]
) -> str | None:
    """The key of a whole analysis: every trace file's content and place in the run (from
    the digest memo only, so the lookup reads no trace), ``extra_files``' bytes
    (capture.json), the options and the code; not where the run is, so a copy of a run
    shares its analysis. None when some file's digest is not remembered yet."""
    parts = []
    for path in paths:
        digest = cache.remembered_digest(Path(path), file_stamp(Path(path)))
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


def store_document(cache: ParseCache, key: str, document: AnalysisDocument, source: str, files: list[Path]) -> None:
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


def load_document(cache: ParseCache, key: str, source: str, files: list[Path]) -> AnalysisDocument | None:
    """The document stored under ``key``, naming ``source`` and ``files``; None when there
    is none or it is not exactly what was stored (cut short, altered): analyse again."""
    data = cache.read_file(_document_path(cache, key))
    if data is None:
        return None
    checksum, _, body = data.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != checksum:
        return None
    try:
        document: dict[str, Any] = json.loads(body)
        document["source"] = source
        for described in document["files"]:
            described["path"] = str(files[described["path"]])
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    # stored by store_document under a key that names this package's build: its document type
    return cast("AnalysisDocument", document)


def _document_path(cache: ParseCache, key: str) -> str:
    return cache.location("analyses", key[:2], key + ".json")
