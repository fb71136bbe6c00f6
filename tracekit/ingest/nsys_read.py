"""One Nsight Systems report read into raw rows (:class:`_Report`): times still in the report's
own clock, ranks not yet assigned. The SQLite export through :mod:`tracekit.ingest.nsys_sqlite`,
the JSON export line by line; and the process and thread ids packed in nsys's global thread ids."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
from numpy.typing import ArrayLike
import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest import nsys_sqlite as db
from tracekit.ingest.validate import NOT_A_TIME

_PID_MASK = 0xFFFFFF


def pid_of(gtid: ArrayLike) -> np.ndarray:
    return (np.asarray(gtid, dtype=np.int64) >> 24) & _PID_MASK


def tid_of(gtid: ArrayLike) -> np.ndarray:
    return np.asarray(gtid, dtype=np.int64) & _PID_MASK


@dataclass
class _Report:
    """Raw rows of one report, times still in its own clock, before ranks are assigned."""

    path: Path
    format: str
    offset_ns: int = 0
    clock: str = "unix"
    never_negative: bool = True  # no timestamp of the file can be below 0 (TimeBase)
    profiler: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    memcpy: pd.DataFrame = field(default_factory=pd.DataFrame)
    memset: pd.DataFrame = field(default_factory=pd.DataFrame)
    runtime: pd.DataFrame = field(default_factory=pd.DataFrame)
    nvtx: pd.DataFrame = field(default_factory=pd.DataFrame)
    env: dict[str, str] = field(default_factory=dict)  # a one-process report's launch env
    args: list[str] = field(default_factory=list)  # ... and its command-line arguments
    host: str | None = None


def _read_json(path: Path) -> _Report:
    """The NVTX ranges of an ``nsys export --type json`` file (line-delimited objects)."""
    report = _Report(path=path, format="nsys-json", clock="relative")
    strings: list[str] = []
    rows: dict[str, list[Any]] = {
        k: [] for k in ("row", "start", "end_", "event_type", "gtid", "domain", "text", "json")
    }
    skipped: dict[str, int] = {}
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                if line_no == 0:
                    raise TraceFormatError(
                        f"{path}: not an nsys JSON export (line 1 is not a JSON object); "
                        "export with: nsys export --type json report.nsys-rep"
                    ) from None
                report.warnings.append(
                    f"{path.name}: stopped at line {line_no + 1}, which is not JSON (file cut short?)"
                )
                break
            if not isinstance(obj, dict):
                continue
            if "data" in obj and isinstance(obj["data"], list):
                strings = [str(s) for s in obj["data"]]
                continue
            event = obj.get("NvtxEvent")
            if not isinstance(event, dict):
                kind = next((k for k in obj if k != "Type"), "?")
                skipped[kind] = skipped.get(kind, 0) + 1
                continue
            text = event.get("Text")
            if text is None and isinstance(event.get("TextId"), int) and event["TextId"] < len(strings):
                text = strings[event["TextId"]]
            rows["row"].append(line_no)
            rows["start"].append(_int(event.get("Timestamp"), NOT_A_TIME))
            rows["end_"].append(_int(event.get("EndTimestamp"), db.NO_END))
            rows["event_type"].append(_int(event.get("Type", obj.get("Type")), -1))
            rows["gtid"].append(_int(event.get("GlobalTid"), 0))
            rows["domain"].append(_int(event.get("DomainId"), 0))
            rows["text"].append(text)
            rows["json"].append(event.get("JsonText"))
    if not rows["row"] and not strings:
        raise TraceFormatError(
            f"{path}: no NVTX events and no string table: not an nsys JSON export; "
            "export with: nsys export --type json report.nsys-rep"
        )
    report.nvtx = pd.DataFrame(rows)
    report.profiler = {"nsys_version": "unknown (JSON export)", "schema": None, "export": "json"}
    report.warnings.append(
        f"{path.name}: the nsys JSON export carries no session start time, so its times are "
        "relative to the capture start and cannot be aligned with other reports by themselves; "
        "export SQLite (nsys export --type sqlite) for absolute times"
    )
    cuda = sum(n for k, n in skipped.items() if "Cuda" in k or "Cupti" in k)
    if cuda:
        report.warnings.append(
            f"{path.name}: {cuda} CUDA records in the JSON export were not read; export SQLite for kernels"
        )
    return report


def _int(value: Any, default: int) -> int:
    """``value`` as an int64, else ``default`` (times that are not, are dropped later)."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -(2**63) < number < 2**63 else default


# ---------------------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------------------
def _read_sqlite(conn: sqlite3.Connection, path: Path) -> _Report:
    schema = db.read_schema(conn)
    present = [t for t in (db.KERNEL_TABLE, db.NVTX_TABLE, db.MEMCPY_TABLE, db.MEMSET_TABLE) if schema.has(t)]
    if not present:
        nsys_like = (
            schema.meta_table or schema.has("StringIds") or any(t.startswith("TARGET_INFO") for t in schema.tables)
        )
        if not nsys_like:
            raise TraceFormatError(
                f"{path}: an SQLite database but not an Nsight Systems export (no NVTX_EVENTS or "
                "CUPTI_ACTIVITY_KIND_* tables); pass the file that 'nsys export --type sqlite' wrote"
            )
        raise TraceFormatError(
            f"{path}: this Nsight Systems export (nsys {schema.nsys_version}) holds neither CUDA "
            "kernels nor NVTX ranges; profile with 'nsys profile -t cuda,nvtx' and export again"
        )
    report = _Report(path=path, format="nsys-sqlite")
    report.kernels = db.read_kernels(conn, path, schema)
    report.memcpy = db.read_memory_ops(conn, path, schema, db.MEMCPY_TABLE)
    report.memset = db.read_memory_ops(conn, path, schema, db.MEMSET_TABLE)
    report.runtime = db.read_runtime(conn, path, schema)
    report.nvtx = db.read_nvtx(conn, path, schema)
    starts = [
        f["start"][f["start"] != NOT_A_TIME].min()
        for f in (report.kernels, report.nvtx, report.memcpy)
        if (len(f) and (f["start"] != NOT_A_TIME).any())
    ]
    earliest = int(min(starts)) if starts else None
    base = db.time_base(conn, schema, earliest)
    report.offset_ns, report.clock, report.never_negative = base.offset_ns, base.clock, base.never_negative
    report.profiler = {
        "nsys_version": schema.nsys_version,
        "schema": schema.schema_version,
        "meta_table": schema.meta_table,
        "time_normalized": base.normalized,
        "session_start_ns": base.session_start_ns,
    }
    if schema.meta_table is None:
        report.warnings.append(f"{path.name}: no export metadata table (nsys ~2021 or older); version unknown")
    if base.clock == "relative":
        report.warnings.append(
            f"{path.name}: no session start time ({base.note}); times are relative to the capture "
            "start and align with other reports only if they share that origin"
        )
    capture = db.read_name_value(conn, path, schema, "META_DATA_CAPTURE")
    report.env = _launch_env(capture)
    report.args = [v for n, v in capture if n.startswith("PROCESS_") and ":ARGUMENT_" in n]
    system = dict(db.read_name_value(conn, path, schema, "TARGET_INFO_SYSTEM_ENV", ("Hostname", "DeviceEnvironment")))
    for key, value in _env_pairs(system.get("DeviceEnvironment", "")):
        report.env.setdefault(key, value)
    report.host = system.get("Hostname") or None
    return report


def _launch_env(capture: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, value in capture:
        if name.endswith(":ENVIRONMENT_VARIABLE") and "=" in value:
            key, _, val = value.partition("=")
            env.setdefault(key.strip(), val.strip().strip('"'))
    return env


def _env_pairs(text: str) -> Iterator[tuple[str, str]]:
    sep = "\x00" if "\x00" in text else ";"
    for item in text.split(sep):
        key, eq, value = item.partition("=")
        if eq and key and " " not in key:
            yield key.strip(), value
