"""What a shared nsys report must not carry: environments, command lines, file paths, other
processes and their threads. :func:`scrub_report` copies a raw export without them."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

from tracekit.output import OutputTarget

# Tables that hold file paths, program output, call stacks or OS activity of the machine:
# nothing tracekit reads, all of it private.
_DROP_TABLES = re.compile(
    r"^(ANALYSIS_FILE|ProcessStreams|OSRT_.*|SAMPLING_CALLCHAINS|CUDA_CALLCHAINS|COMPOSITE_EVENTS|"
    r"SCHED_EVENTS|DIAGNOSTIC_EVENT|PROFILER_OVERHEAD|TARGET_INFO_NIC_INFO|UnwindMethodType)$"
)
_ENV_LIKE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PATH_LIKE = re.compile(r"(^|[\s\"'=:;])(/|~/|[A-Za-z]:\\)[^\s]*")
_META_PRIVATE = re.compile(r"(ENVIRONMENT|ARGUMENT|COMMAND|WORKING_DIR|USER|HOST|PATH|FILE|DISPLAY_NAME)")
_SYSTEM_PRIVATE = {
    "DeviceEnvironment",
    "Hostname",
    "TargetInstallDir",
    "InjectionFilesStoragePath",
    "KernelVersion",
    "NamespacePID",
}
#: strings that must not appear anywhere in a shared report (the committed sample's test)
FORBIDDEN = ("PATH=", "HOME=", "USER=", "/root", "/home/", "/tmp/", "/work/")


def scrub_report(src: Path, dst: Path, keep_pids: set[int]) -> dict[str, int]:
    """Copy ``src`` to ``dst`` without environments, command lines, paths or other processes.

    Works on a copy (``src`` is left as it is) and ends with VACUUM so deleted text does
    not linger in free pages. Returns what was removed, by kind.
    """
    work = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, work)
    removed: dict[str, int] = {}
    conn = sqlite3.connect(work)
    try:
        tables = {
            n: [r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')]
            for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        for name in list(tables):
            if _DROP_TABLES.match(name):
                conn.execute(f'DROP TABLE "{name}"')
                removed["tables dropped"] = removed.get("tables dropped", 0) + 1
                del tables[name]
        keep_gpids = {pid << 24 for pid in keep_pids}
        pid_sql = ", ".join(str(g) for g in sorted(keep_gpids)) or "-1"
        if "PROCESSES" in tables:
            n = conn.execute(f"DELETE FROM PROCESSES WHERE globalPid NOT IN ({pid_sql})").rowcount
            conn.execute("UPDATE PROCESSES SET name = 'python'")
            removed["other processes"] = n
        if "ThreadNames" in tables:
            n = conn.execute(f"DELETE FROM ThreadNames WHERE (globalTid & ~16777215) NOT IN ({pid_sql})").rowcount
            removed["threads of other processes"] = n
        for meta in ("META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA"):
            if meta in tables:
                rows = conn.execute(f'SELECT rowid, name FROM "{meta}"').fetchall()
                private = [rid for rid, name in rows if _META_PRIVATE.search(str(name))]
                conn.executemany(f'DELETE FROM "{meta}" WHERE rowid = ?', [(r,) for r in private])
                removed[f"{meta} rows"] = len(private)
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            marks = ", ".join("?" * len(_SYSTEM_PRIVATE))
            n = conn.execute(
                f"DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE name IN ({marks})", sorted(_SYSTEM_PRIVATE)
            ).rowcount
            removed["system environment rows"] = n
        removed["strings"] = _scrub_strings(conn, tables)
        removed["other text cells"] = _scrub_text_cells(conn, tables)
        conn.commit()
    finally:
        conn.close()
    vacuumed = dst.with_name(dst.name + ".vacuumed.tmp")
    vacuumed.unlink(missing_ok=True)
    conn = sqlite3.connect(work)
    try:
        conn.execute("VACUUM INTO ?", (str(vacuumed),))
    finally:
        conn.close()
    work.unlink()
    try:
        # the scrubbed report is a few MB of NVTX ranges: through the one writer, whole or not at all
        OutputTarget(dst, "--out").write(vacuumed.read_bytes())
    finally:
        vacuumed.unlink()
    return removed


def _scrub_strings(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> int:
    """Keep only the strings that the kept rows name (NVTX text, kernels, API, threads)."""
    if "StringIds" not in tables:
        return 0
    used: set[int] = set()
    for table, cols in tables.items():
        if table == "StringIds":
            continue
        for col in cols:
            if col.endswith(("Id", "Name")) and col not in ("globalTid", "globalPid", "domainId", "correlationId"):
                try:
                    used.update(
                        v for (v,) in conn.execute(f'SELECT DISTINCT "{col}" FROM "{table}"') if isinstance(v, int)
                    )
                except sqlite3.DatabaseError:
                    continue
    rows = conn.execute("SELECT id, value FROM StringIds").fetchall()
    blank = [(i,) for i, v in rows if i not in used or _private(str(v))]
    conn.executemany("UPDATE StringIds SET value = '' WHERE id = ?", blank)
    return len(blank)


def _private(text: str) -> bool:
    return bool(_ENV_LIKE.match(text) or _PATH_LIKE.search(text) or any(f in text for f in FORBIDDEN))


def _scrub_text_cells(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> int:
    """Blank any remaining text cell that looks like an environment entry or a path."""
    n = 0
    for table, cols in tables.items():
        if table == "StringIds" or table.startswith("ENUM_"):
            continue
        for col in cols:
            try:
                rows = conn.execute(f'SELECT rowid, "{col}" FROM "{table}" WHERE typeof("{col}") = \'text\'').fetchall()
            except sqlite3.DatabaseError:
                continue
            bad = [(rid,) for rid, v in rows if _private(v)]
            if bad:
                conn.executemany(f'UPDATE "{table}" SET "{col}" = \'\' WHERE rowid = ?', bad)
                n += len(bad)
    return n
