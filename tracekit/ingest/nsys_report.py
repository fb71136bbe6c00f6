"""Nsight Systems reports (``.nsys-rep``): read through the SQLite export ``nsys`` makes.

The export goes into the cache (``<cache>/nsys/<report digest>/<name>.sqlite``, keeping the
report's name so a rank in it still counts), never beside the report. It is made under a
temporary name and renamed into place, and its own digest is recorded beside it, so an
export cut short or altered later is made again rather than read. Without a local cache
(``--no-cache``, a cache URL) it goes to a temporary folder removed at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from tracekit.errors import TraceFormatError
from tracekit.ingest.cache import ParseCache

# A large report takes minutes to export; past this, nsys is stuck, not slow.
EXPORT_TIMEOUT_S = 1800
_RECORD_NAME = "export.json"


def export_command(report: Path, output: Path) -> list[str]:
    return ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(output), str(report)]


def sqlite_export(report: Path, cache_dir: str | None) -> Path:
    """The SQLite export of ``report``: made by ``nsys`` on PATH, or found in the cache."""
    report = Path(report)
    nsys = shutil.which("nsys")
    stem = report.name.rsplit(".", 1)[0]
    if nsys is None:
        by_hand = shlex.join(
            ["nsys", "export", "--type", "sqlite", "-o", str(report.with_name(stem + ".sqlite")), str(report)]
        )
        raise TraceFormatError(
            f"{report}: an Nsight Systems report; tracekit reads its SQLite export "
            f"(no nsys on PATH to make it): {by_hand}"
        )
    cache = ParseCache(cache_dir) if cache_dir and "://" not in cache_dir else None
    digest = cache.digest(report) if cache is not None else ParseCache.content_digest(report)
    root = Path(cache.base) / "nsys" if cache is not None else _temporary_root()
    target = root / digest / f"{stem}.sqlite"
    if _sound(target, cache):
        return target
    _export(nsys, report, target)
    if cache is not None:
        record = json.dumps({"sha256": cache.digest(target)}).encode()
        cache.write_file(str(target.parent / _RECORD_NAME), record)
    return target


def _sound(export: Path, cache: ParseCache | None) -> bool:
    """An earlier export whose bytes are still the ones recorded when it was made."""
    record = export.parent / _RECORD_NAME
    if cache is None or not export.is_file() or not record.is_file():
        return False
    try:
        expected = json.loads(record.read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return False
    unchanged: bool = expected == cache.digest(export)
    return unchanged


def _export(nsys: str, report: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".export-"))
    try:
        partial = scratch / target.name
        command = export_command(report, partial)
        command[0] = nsys
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise TraceFormatError(
                f"{report}: nsys export ran over {EXPORT_TIMEOUT_S} s and was stopped; "
                f"export it yourself: {shlex.join(export_command(report, target))}"
            ) from None
        if done.returncode != 0 or not partial.is_file():
            said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[-1]
            raise TraceFormatError(
                f"{report}: nsys export failed (exit {done.returncode}: {said}); is it an "
                "Nsight Systems report, whole, from this nsys version or older?"
            )
        os.replace(partial, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_TEMPORARY_ROOT: Path | None = None


def _temporary_root() -> Path:
    global _TEMPORARY_ROOT
    if _TEMPORARY_ROOT is None:
        _TEMPORARY_ROOT = Path(tempfile.mkdtemp(prefix="tracekit-nsys-"))
        atexit.register(shutil.rmtree, _TEMPORARY_ROOT, True)
    return _TEMPORARY_ROOT
