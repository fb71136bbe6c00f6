"""A Chrome-trace document decoded whole: gzipped or not, and salvaged up to its last complete
event when a profiler stopped mid-write. The streaming reader (:mod:`tracekit.ingest.kineto_stream`)
falls back to it for what it cannot stream."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import orjson

from tracekit.errors import TraceFormatError
from tracekit.ingest.kineto_stream import complete_elements


def trace_events_or_none(path: Path) -> list[Any] | None:
    """The ``traceEvents`` list of the Kineto file at ``path``, decoded whole by the standard
    library, or None where the file cannot be read or holds no such list: for the second reads
    that fall back quietly (memory events, recorded op shapes), whose callers say what they
    could not size."""
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError, EOFError):
        return None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    return events if isinstance(events, list) else None


def read_json_document(path: Path) -> tuple[dict[str, Any], bool]:
    """Decode a (possibly gzipped, possibly truncated) Chrome-trace document.

    Returns ``(document, truncated)``. A document cut off mid-write is salvaged up to its
    last complete event.
    """
    raw, truncated = _read_bytes(path)
    if not raw.strip():
        raise TraceFormatError(f"{path}: the file is empty; re-export the trace from the profiler")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = _salvage(raw, path)
        truncated = True
    if isinstance(doc, list):  # bare event-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise TraceFormatError(
            f"{path}: JSON without 'traceEvents' is not a Chrome trace; pass PyTorch profiler "
            "exports (export_chrome_trace / tensorboard_trace_handler)"
        )
    if not isinstance(doc["traceEvents"], list):
        raise TraceFormatError(
            f"{path}: 'traceEvents' is {_json_kind(doc['traceEvents'])}, not a list of events; "
            "the file is damaged or not a PyTorch profiler trace: re-export it"
        )
    return doc, truncated


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _read_bytes(path: Path) -> tuple[bytes, bool]:
    data = path.read_bytes()
    if data[:2] != b"\x1f\x8b":
        return data, False
    try:
        return gzip.decompress(data), False
    except (EOFError, OSError, zlib.error):
        # A gzip stream cut off mid-write: keep what decompresses.
        decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = decomp.decompress(data)
        except zlib.error as err:
            raise TraceFormatError(
                f"{path}: not a readable gzip file ({err}); check the file was copied whole"
            ) from None
        return out, True


def _salvage(raw: bytes, path: Path) -> dict[str, Any]:
    """Recover the header fields and every complete event of a truncated document."""
    text = raw.decode("utf-8", errors="replace")
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(f"{path}: not valid JSON and no 'traceEvents' found; is this a PyTorch profiler trace?")
    events = complete_elements(text, text.find("[", start) + 1)
    header: dict[str, Any] = {}
    head_text = text[:start].rstrip().rstrip(",") + "}"
    try:
        header = json.loads(head_text)
    except json.JSONDecodeError:
        header = {}
    except RecursionError:
        raise TraceFormatError(
            f"{path}: the fields before 'traceEvents' nest deeper than Python can read; no profiler "
            "writes such a header: the file is damaged or not a PyTorch profiler trace"
        ) from None
    if not isinstance(header, dict):
        header = {}
    header["traceEvents"] = events
    return header
