"""``capture.json`` beside the traces: what ran (optional metadata the outputs carry on).

It is read as strict JSON (no NaN, no Infinity, no number beyond a float) with every string
encodable as UTF-8, and one that cannot be read is ignored with a warning: it only
describes the capture.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NoReturn


def load_capture_manifest(folder: Path, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """``capture.json`` beside the traces (what ran: optional metadata), or None. One that
    cannot be read (not UTF-8, not JSON, not an object) is ignored with a warning."""
    manifest = folder / "capture.json"
    if not (folder.is_dir() and manifest.is_file()):
        return None
    try:
        document = json.loads(manifest.read_bytes().decode("utf-8"), parse_constant=_not_json, parse_float=_finite)
    except UnicodeDecodeError:
        problem = "is not UTF-8 text"
    except (ValueError, RecursionError):  # JSONDecodeError, or NaN / Infinity (not JSON)
        problem = "is not JSON (NaN, Infinity or 1e999 in it, or it nests deeper than any manifest)"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    else:
        if isinstance(document, dict):
            return _encodable(document)
        problem = f"holds a JSON {type(document).__name__}, not an object"
    if warnings is not None:
        warnings.append(f"{manifest.name} {problem}; ignored it (it only describes the capture)")
    return None


def _not_json(token: str) -> NoReturn:
    """Python's json reads NaN and Infinity; JSON has no such numbers, and the documents
    that carry the manifest on must stay JSON."""
    raise ValueError(f"{token} is not JSON")


def _finite(token: str) -> float:
    """A JSON number, refused when it does not fit a float (1e999 would read as Infinity)."""
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is beyond any float")
    return value


def _encodable(document: dict[str, Any]) -> dict[str, Any]:
    """The manifest with every string encodable as UTF-8 (JSON's escapes allow lone
    surrogates; the writers that show the manifest do not)."""
    text = json.dumps(document, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        from tracekit.ingest.validate import valid_text

        encodable: dict[str, Any] = json.loads(valid_text(text))
        return encodable
    return document
