"""``[tool.tracekit.*]`` tables in the closest ``pyproject.toml``: read once, by whoever needs one."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None


def find_table(start: Path, name: str) -> Path | None:
    """The closest pyproject.toml at or above ``start`` that has a [tool.tracekit.<name>] table."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and name in read_toml(candidate).get("tool", {}).get("tracekit", {}):
            return candidate
    return None


def tracekit_table(path: Path, name: str) -> dict[str, Any] | None:
    """``[tool.tracekit.<name>]`` of ``path``, None where it has none."""
    table: dict[str, Any] | None = read_toml(path).get("tool", {}).get("tracekit", {}).get(name)
    return table


_READ: dict[tuple[str, int, int], dict[str, Any]] = {}  # (path, mtime, size) -> its tables


def read_toml(path: Path) -> dict[str, Any]:
    """The file's tables; parsed once while it is unchanged (a command looks for several
    tables, each lookup from the working folder up), a copy to each caller."""
    try:
        stat = os.stat(path)
    except OSError as err:
        raise TracekitError(f"{path}: cannot read it ({err.strerror})") from None
    key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        _READ[key] = _parse_toml(path)
    return copy.deepcopy(_READ[key])


def _parse_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise TracekitError(
            f"{path}: reading TOML on Python < 3.11 needs tomli (pip install tomli), or give the settings as flags"
        )
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as err:
        raise TracekitError(f"{path}: cannot read it ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise TracekitError(f"{path}: not valid TOML ({err})") from None
