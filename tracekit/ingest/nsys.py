"""Nsight Systems reports: the SQLite export (``nsys export --type sqlite``), and the JSON
export as a fallback, read into the normalised event table, one ``(TraceFile, events)``
pair per rank found in the report.

What becomes rows (see :mod:`tracekit.model.events`):

* CUDA kernels, memcpys and memsets (``on_gpu``; pid = device, tid = stream), and the CUDA
  API calls that launched them (cat ``runtime``, ``correlation`` set on both sides);
* NVTX ranges, normalised to Kineto's conventions by :mod:`tracekit.ingest.nsys_names`
  (``emit_nvtx`` ops -> ``cpu_op`` with ``seq``; labels -> ``user_annotation``; NCCL's
  domain -> ``nccl:<call>``).

NCCL point-to-point kernels are told apart by where they were launched, not by name: a
kernel whose launch (joined on correlation id AND process: ids collide across processes)
falls inside an NCCL-domain ``ncclSend``/``ncclRecv`` range, or inside an ``ncclGroupEnd``
closing a group of sends/receives, on the same thread, is P2P and is renamed
``nccl:SendRecv|<kernel short name>``, unless that call sits inside an all_to_all
(``nccl:all_to_all`` / ``c10d::alltoall*`` on the same thread): torch runs all_to_all as a
group of sends and receives, one per peer, and it is a collective. The kernel-name pattern
is used only when the launch cannot be placed, and not in a process where kernels of that
pattern were placed in collectives (there the name says nothing).
:func:`match_nccl_p2p` pairs P2P kernels across ranks.

Processes become ranks by, in order: the caller's ``rank_map`` {pid: rank}; what the report
states (NVTX marks or thread names such as ``tracekit:rank=3 world_size=4`` or ``MPI Rank 0``,
``rank=N`` in every range name of a process; a one-process report's RANK / PMI_RANK /
SLURM_PROCID environment, command line, or file name); the CUDA device of each process's
kernels; the order of pids. ``TraceFile.rank_source`` and ``warnings`` say which.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest import nsys_names as names
from tracekit.ingest import nsys_sqlite as db
from tracekit.ingest.kineto_rows import ASYNC_SPANS
from tracekit.ingest.nesting import nesting_depth
from tracekit.ingest.validate import NOT_A_TIME, add_ns, drop_impossible
from tracekit.model.events import EVENT_COLUMNS, TraceFile, conform

_PID_MASK = 0xFFFFFF
_ROW_KEYS = ["source_index", "cat", "name", "start_ns", "end_ns", "pid", "tid", "on_gpu", "seq",
             "peer", "tag", "nbytes", "correlation"]
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
              "MV2_COMM_WORLD_RANK", "PALS_RANKID")
_WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")
_RANK_ARG = re.compile(r"^--(local[_-])?rank[=\s](\d{1,7})$")
_COLLECTIVE_CALL = re.compile(r"^nccl(All|Reduce|Broadcast|Bcast)")
# host ranges around NCCL calls that make their sends/receives an all_to_all (ProcessGroupNCCL's
# title, c10d's op): a collective, however its NCCL calls look
_ALL_TO_ALL_RANGE = re.compile(r"^(nccl:all_to_all|c10d::alltoall)")


def pid_of(gtid) -> np.ndarray:
    return (np.asarray(gtid, dtype=np.int64) >> 24) & _PID_MASK


def tid_of(gtid) -> np.ndarray:
    return np.asarray(gtid, dtype=np.int64) & _PID_MASK


@dataclass
class _Report:
    """Raw rows of one report, times still in its own clock, before ranks are assigned."""

    path: Path
    format: str
    offset_ns: int = 0
    clock: str = "unix"
    profiler: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    memcpy: pd.DataFrame = field(default_factory=pd.DataFrame)
    memset: pd.DataFrame = field(default_factory=pd.DataFrame)
    runtime: pd.DataFrame = field(default_factory=pd.DataFrame)
    nvtx: pd.DataFrame = field(default_factory=pd.DataFrame)
    env: dict[str, str] = field(default_factory=dict)   # a one-process report's launch env
    args: list[str] = field(default_factory=list)       # ... and its command-line arguments
    host: str | None = None


# ---------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------
Parsed = list[tuple[TraceFile, pd.DataFrame]]


def parse_nsys_sqlite(path, file_id: int, rank_map: dict[int, int] | None = None) -> Parsed:
    """Parse an ``nsys export --type sqlite`` file: one ``(TraceFile, events)`` per rank."""
    path = Path(path)
    conn = db.connect_read_only(path)
    try:
        report = _read_sqlite(conn, path)
    except sqlite3.DatabaseError as err:
        raise db.damaged(path, err) from None
    finally:
        conn.close()
    return _build(report, file_id, rank_map)


def parse_nsys_json(path, file_id: int, rank_map: dict[int, int] | None = None) -> Parsed:
    """Parse an ``nsys export --type json`` file (line-delimited objects): NVTX ranges only.

    The JSON export has no session start time, so its times are relative to the capture
    start and cannot be aligned with other reports by themselves.
    """
    path = Path(path)
    report = _Report(path=path, format="nsys-json", clock="relative")
    strings: list[str] = []
    rows: dict[str, list] = {k: [] for k in ("row", "start", "end_", "event_type", "gtid", "domain", "text", "json")}
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
                    f"{path.name}: stopped at line {line_no + 1}, which is not JSON (file cut short?)")
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
    return _build(report, file_id, rank_map)


def _int(value, default: int) -> int:
    """``value`` as an int64, else ``default`` (times that are not, are dropped later)."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -(2 ** 63) < number < 2 ** 63 else default


# ---------------------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------------------
def _read_sqlite(conn: sqlite3.Connection, path: Path) -> _Report:
    schema = db.read_schema(conn)
    present = [t for t in (db.KERNEL_TABLE, db.NVTX_TABLE, db.MEMCPY_TABLE, db.MEMSET_TABLE) if schema.has(t)]
    if not present:
        nsys_like = (schema.meta_table or schema.has("StringIds")
                     or any(t.startswith("TARGET_INFO") for t in schema.tables))
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
    starts = [f["start"][f["start"] != NOT_A_TIME].min() for f in (report.kernels, report.nvtx, report.memcpy)
              if (len(f) and (f["start"] != NOT_A_TIME).any())]
    earliest = int(min(starts)) if starts else None
    base = db.time_base(conn, schema, earliest)
    report.offset_ns, report.clock = base.offset_ns, base.clock
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


def _env_pairs(text: str):
    sep = "\x00" if "\x00" in text else ";"
    for item in text.split(sep):
        key, eq, value = item.partition("=")
        if eq and key and " " not in key:
            yield key.strip(), value


# ---------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------
def _frame(**cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = {"seq": -1, "peer": -1, "tag": -1, "nbytes": -1, "correlation": -1}
    out = {}
    for key in _ROW_KEYS + ["os_pid", "async_span"]:
        if key == "async_span" and key not in cols:
            out[key] = np.zeros(n, dtype=bool)
        elif key in cols:
            out[key] = cols[key]
        else:
            out[key] = np.full(n, base[key], dtype=np.int64)
    return pd.DataFrame(out)


def _empty() -> pd.DataFrame:
    z = np.zeros(0, np.int64)
    return _frame(source_index=z, cat=np.zeros(0, object), name=np.zeros(0, object), start_ns=z,
                  end_ns=z, pid=z, tid=z, on_gpu=np.zeros(0, bool), os_pid=z)


def _gpu_rows(frame: pd.DataFrame, cat: str, names_: pd.Series, offset: int) -> pd.DataFrame:
    return _frame(
        source_index=frame["row"].to_numpy(np.int64), cat=np.full(len(frame), cat, dtype=object),
        name=names_.to_numpy(object),
        start_ns=add_ns(frame["start"].to_numpy(np.int64), offset),
        end_ns=add_ns(frame["end_"].to_numpy(np.int64), offset),
        pid=frame["device"].to_numpy(np.int64), tid=frame["stream"].to_numpy(np.int64),
        on_gpu=np.ones(len(frame), dtype=bool),
        correlation=frame["correlation"].to_numpy(np.int64),
        nbytes=frame["bytes"].to_numpy(np.int64) if "bytes" in frame else np.full(len(frame), -1, np.int64),
        os_pid=pid_of(frame["gpid"]),
    )


def _domain_names(nvtx: pd.DataFrame) -> dict[tuple[int, int], str]:
    """(pid, domainId) -> domain name; domain ids are per process."""
    found: dict[tuple[int, int], str] = {}
    created = nvtx[nvtx["event_type"] == db.NVTX_DOMAIN_CREATE]
    for pid, dom, text in zip(pid_of(created["gtid"]), created["domain"], created["text"]):
        if text:
            found[(int(pid), int(dom))] = str(text)
    ranges = nvtx[nvtx["event_type"].isin(db.NVTX_RANGE_TYPES) & (nvtx["domain"] != 0)]
    if len(ranges):
        keyed = ranges.assign(pid=pid_of(ranges["gtid"]))
        for (pid, dom), group in keyed.groupby(["pid", "domain"]):
            key = (int(pid), int(dom))
            if key not in found and names.looks_like_nccl_domain(set(group["text"].dropna().astype(str))):
                found[key] = "NCCL"
    return found


def _nvtx_rows(nvtx: pd.DataFrame, offset: int, domains: dict[tuple[int, int], str]) -> pd.DataFrame:
    # A range with no end was still open when the capture stopped: not a row. One that
    # ends before it starts goes on, to be dropped and counted with the other impossible rows.
    ranges = nvtx[nvtx["event_type"].isin(db.NVTX_RANGE_TYPES) & (nvtx["end_"] != db.NO_END)]
    pids, tids = pid_of(ranges["gtid"]), tid_of(ranges["gtid"])
    cats, labels, seqs, peers, sizes = [], [], [], [], []
    for pid, dom, text, payload in zip(pids, ranges["domain"], ranges["text"], ranges["json"]):
        domain = domains.get((int(pid), int(dom)), "")
        cat, name, seq = names.classify("" if text is None else str(text), domain)
        peer = nbytes = -1
        if name.startswith("nccl:") and payload:
            peer, nbytes = names.nccl_payload(payload)
        cats.append(cat)
        labels.append(name or "(unnamed NVTX range)")
        seqs.append(seq)
        peers.append(peer)
        sizes.append(nbytes)
    return _frame(
        source_index=ranges["row"].to_numpy(np.int64), cat=np.array(cats, dtype=object),
        name=np.array(labels, dtype=object),
        start_ns=add_ns(ranges["start"].to_numpy(np.int64), offset),
        end_ns=add_ns(ranges["end_"].to_numpy(np.int64), offset),
        pid=pids, tid=tids, on_gpu=np.zeros(len(ranges), dtype=bool),
        seq=np.array(seqs, dtype=np.int64), peer=np.array(peers, dtype=np.int64),
        nbytes=np.array(sizes, dtype=np.int64), os_pid=pids,
        async_span=ranges["event_type"].isin((db.NVTX_START_END, db.NVTXT_START_END)).to_numpy(),
    )


def _nccl_groups(nvtx_rows: pd.DataFrame) -> pd.DataFrame:
    """NCCL calls that can launch kernels, each flagged P2P or not, per thread.

    Kernels of a group are launched inside its ``ncclGroupEnd``; the group is P2P when
    its calls were sends/receives only and it is not inside an all_to_all range of the same
    thread. A lone ``ncclSend``/``ncclRecv`` launches its own.
    """
    nccl = nvtx_rows[nvtx_rows["name"].str.startswith("nccl:nccl")].sort_values("start_ns")
    all_to_all = nvtx_rows[nvtx_rows["name"].str.match(_ALL_TO_ALL_RANGE)]
    spans = {key: (g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
             for key, g in all_to_all.groupby(["pid", "tid"])}
    out = {k: [] for k in ("pid", "tid", "start_ns", "end_ns", "p2p", "peer", "nbytes")}
    for (pid, tid), thread in nccl.groupby(["pid", "tid"]):
        a2a_start, a2a_end = spans.get((pid, tid), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        depth = 0
        calls: list[tuple[str, int, int]] = []
        for row in thread.itertuples(index=False):
            call = row.name[len("nccl:"):]
            if call == names.NCCL_GROUP_START:
                if depth == 0:
                    calls = []
                depth += 1
                continue
            if call == names.NCCL_GROUP_END:
                depth = max(0, depth - 1)
                if depth:
                    continue
                launched = calls
            elif depth:
                calls.append((call, row.peer, row.nbytes))
                continue
            else:
                launched = [(call, row.peer, row.nbytes)]
            sends = [c for c in launched if c[0] in names.NCCL_P2P_CALLS]
            p2p = (bool(sends) and not any(_COLLECTIVE_CALL.match(c[0]) for c in launched)
                   and not ((a2a_start <= row.start_ns) & (row.end_ns <= a2a_end)).any())
            peers = {c[1] for c in sends if c[1] >= 0}
            out["pid"].append(pid)
            out["tid"].append(tid)
            out["start_ns"].append(row.start_ns)
            out["end_ns"].append(row.end_ns)
            out["p2p"].append(p2p)
            out["peer"].append(peers.pop() if len(peers) == 1 else -1)
            out["nbytes"].append(sends[0][2] if len(sends) == 1 else -1)
    return pd.DataFrame(out)


def _classify_p2p(kernels: pd.DataFrame, short_names: np.ndarray, launches: pd.DataFrame,
                  groups: pd.DataFrame) -> np.ndarray:
    """Rename P2P kernels ``nccl:SendRecv|<short name>`` and fill peer where known (in place).

    Returns how each kernel was decided: "launch" (P2P by its launch), "name" (P2P by name
    alone), "collective" (SendRecv-named but launched by a collective), "unplaced"
    (SendRecv-named, launch not found, in a process whose placed SendRecv-named kernels
    include collectives: not taken as P2P), or "".
    """
    by_name = np.array([bool(names.NCCL_P2P_KERNEL.search(str(s))) for s in short_names])
    decided = np.zeros(len(kernels), dtype=bool)
    is_p2p = np.zeros(len(kernels), dtype=bool)
    peer = kernels["peer"].to_numpy().copy()
    nbytes = kernels["nbytes"].to_numpy().copy()
    if not launches.empty and not groups.empty:
        # inner join keeps the times int64 (a left join's NaNs would make them inexact floats)
        launch = kernels[["os_pid", "correlation"]].reset_index(names="kernel").merge(
            launches, left_on=["os_pid", "correlation"], right_on=["pid", "correlation"])
        position = pd.Series(np.arange(len(kernels)), index=kernels.index)
        for (pid, tid), g in groups.groupby(["pid", "tid"]):
            g = g.sort_values("start_ns")
            g_start, g_end = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
            mine = launch[(launch["pid"] == pid) & (launch["tid"] == tid)]
            if mine.empty:
                continue
            sel = position[mine["kernel"]].to_numpy()
            t = mine["start_ns"].to_numpy(np.int64)
            pos = np.searchsorted(g_start, t, side="right") - 1
            inside = (pos >= 0) & (t <= g_end[np.clip(pos, 0, None)])
            for k, p in zip(sel[inside], pos[inside]):
                decided[k] = True
                is_p2p[k] = bool(g["p2p"].iloc[p])
                if is_p2p[k]:
                    peer[k], nbytes[k] = g["peer"].iloc[p], g["nbytes"].iloc[p]
    how = np.full(len(kernels), "", dtype=object)
    how[decided & is_p2p] = "launch"
    collective = decided & ~is_p2p & by_name
    how[collective] = "collective"
    # where the name was seen on collectives it cannot tell a P2P kernel from them
    ambiguous = kernels["os_pid"].isin(kernels.loc[collective, "os_pid"]).to_numpy()
    how[~decided & by_name & ambiguous] = "unplaced"
    fallback = ~decided & by_name & ~ambiguous
    how[fallback] = "name"
    is_p2p |= fallback
    renamed = [f"{names.NCCL_P2P_NAME}|{s}" for s in short_names[is_p2p]]
    kernels.loc[is_p2p, "name"] = renamed
    kernels["peer"] = peer
    kernels["nbytes"] = nbytes
    return how


def _launch_table(runtime: pd.DataFrame, offset: int) -> pd.DataFrame:
    if runtime.empty:
        return pd.DataFrame(columns=["pid", "tid", "correlation", "start_ns", "end_ns", "row", "name"])
    return pd.DataFrame({
        "pid": pid_of(runtime["gtid"]), "tid": tid_of(runtime["gtid"]),
        "correlation": runtime["correlation"].to_numpy(np.int64),
        "start_ns": add_ns(runtime["start"].to_numpy(np.int64), offset),
        "end_ns": add_ns(runtime["end_"].to_numpy(np.int64), offset),
        "row": runtime["row"].to_numpy(np.int64), "name": runtime["name"].astype(str).to_numpy(object),
    }).drop_duplicates(["pid", "correlation"])


def _runtime_rows(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """The API calls that launched the GPU rows kept (not every CUDA API call)."""
    if launches.empty or gpu.empty:
        return _empty()
    wanted = gpu[["os_pid", "correlation"]].drop_duplicates().rename(columns={"os_pid": "pid"})
    used = launches.merge(wanted, on=["pid", "correlation"])
    return _frame(
        source_index=used["row"].to_numpy(np.int64), cat=np.full(len(used), "runtime", dtype=object),
        name=np.array([names.api_name(n) for n in used["name"]], dtype=object),
        start_ns=used["start_ns"].to_numpy(np.int64), end_ns=used["end_ns"].to_numpy(np.int64),
        pid=used["pid"].to_numpy(np.int64), tid=used["tid"].to_numpy(np.int64),
        on_gpu=np.zeros(len(used), dtype=bool), correlation=used["correlation"].to_numpy(np.int64),
        os_pid=used["pid"].to_numpy(np.int64),
    )


# ---------------------------------------------------------------------------------------
# ranks
# ---------------------------------------------------------------------------------------
@dataclass
class _RankDecision:
    ranks: dict[int, int]          # os pid -> rank (pids absent are dropped)
    source: str
    world_size: int | None = None
    warnings: list[str] = field(default_factory=list)


def _stated_ranks(nvtx: pd.DataFrame, pids: list[int]
                  ) -> tuple[dict[int, int], dict[int, int | None], dict[int, set[int]]]:
    """Ranks the report states per process: marks / thread names, and rank=N in range names."""
    markers: dict[int, int] = {}
    worlds: dict[int, int | None] = {}
    tokens: dict[int, set[int]] = {p: set() for p in pids}
    if nvtx.empty:
        return markers, worlds, tokens
    labelled = nvtx[nvtx["event_type"].isin((db.NVTX_MARK, db.NVTX_THREAD_NAME))]
    for pid, text in zip(pid_of(labelled["gtid"]), labelled["text"]):
        found = names.rank_marker(str(text)) if text is not None else None
        if found and int(pid) not in markers:
            markers[int(pid)], worlds[int(pid)] = found
    ranges = nvtx[nvtx["event_type"].isin(db.NVTX_RANGE_TYPES)]
    for pid, text in zip(pid_of(ranges["gtid"]), ranges["text"]):
        if text is not None and int(pid) in tokens and "rank" in str(text).lower():
            tokens[int(pid)] |= names.rank_tokens(str(text))
    return markers, worlds, tokens


def _decide_ranks(report: _Report, pids: list[int], devices: dict[int, set[int]],
                  rank_map: dict[int, int] | None) -> _RankDecision:
    name = report.path.name
    if rank_map:
        mapped = {p: int(rank_map[p]) for p in pids if p in rank_map}
        if mapped:
            decision = _RankDecision(mapped, "rank_map")
            left = [p for p in pids if p not in mapped]
            if left:
                decision.warnings.append(
                    f"{name}: processes {left} are not in the rank map; their events were left out")
            return decision
        pid_list = ", ".join(map(str, pids))
        warning = f"{name}: the rank map names none of this report's processes (pids {pid_list}); ignored it"
    else:
        warning = ""
    decision = _decide_stated(report, pids, devices)
    if warning:
        decision.warnings.insert(0, warning)
    return decision


def _decide_stated(report: _Report, pids: list[int], devices: dict[int, set[int]]) -> _RankDecision:
    name = report.path.name
    markers, worlds, tokens = _stated_ranks(report.nvtx, pids)
    if pids and all(p in markers for p in pids) and len({markers[p] for p in pids}) == len(pids):
        sizes = {worlds[p] for p in pids if worlds.get(p)}
        return _RankDecision({p: markers[p] for p in pids}, "NVTX rank marker",
                             sizes.pop() if len(sizes) == 1 else None)
    if pids and all(len(tokens[p]) == 1 for p in pids) and len({min(tokens[p]) for p in pids}) == len(pids):
        return _RankDecision({p: min(tokens[p]) for p in pids}, "NVTX range names (rank=N)",
                             warnings=[f"{name}: ranks read from 'rank=N' in NVTX range names"])
    if len(pids) == 1:
        pid = pids[0]
        env_rank = _env_rank(report.env, report.args)
        if pid in markers:
            return _RankDecision({pid: markers[pid]}, "NVTX rank marker", worlds.get(pid) or _env_world(report.env))
        if env_rank is not None:
            rank, how, world = env_rank
            decision = _RankDecision({pid: rank}, how, world)
            if "LOCAL_RANK" in how or "local" in how:
                decision.warnings.append(f"{name}: only a local rank was found ({how}); read it as the rank")
            return decision
        from tracekit.ingest.kineto import rank_from_name

        from_name = rank_from_name(report.path)
        if from_name is not None:
            return _RankDecision({pid: from_name}, "file name")
        return _RankDecision({pid: -1}, "unknown")
    one_device = {p: next(iter(devices[p])) for p in pids if len(devices.get(p, ())) == 1}
    if len(one_device) == len(pids) and len(set(one_device.values())) == len(pids):
        return _RankDecision(one_device, "CUDA device id", warnings=[
            f"{name}: {len(pids)} processes, no rank stated; took each process's CUDA device as its "
            "rank (true for one node with one GPU per rank); pass a rank map if not"])
    ordered = {p: i for i, p in enumerate(sorted(pids))}
    return _RankDecision(ordered, "pid order", warnings=[
        f"{name}: {len(pids)} processes and nothing in the report says which rank each is; "
        "numbered them by pid order, which may be wrong; pass a rank map {pid: rank} to fix"])


def _env_world(env: dict[str, str]) -> int | None:
    return next((int(env[v]) for v in _WORLD_VARS if _is_int(env.get(v))), None)


def _env_rank(env: dict[str, str], args: list[str]) -> tuple[int, str, int | None] | None:
    world = _env_world(env)
    for var in _RANK_VARS:
        if _is_int(env.get(var)):
            return int(env[var]), f"environment variable {var}", world
    for arg in args:
        match = _RANK_ARG.match(arg.strip())
        if match and not match.group(1):
            return int(match.group(2)), f"command line ({arg.strip()})", world
    if _is_int(env.get("LOCAL_RANK")):
        return int(env["LOCAL_RANK"]), "environment variable LOCAL_RANK", world
    for arg in args:
        match = _RANK_ARG.match(arg.strip())
        if match:
            return int(match.group(2)), f"command line ({arg.strip()}, a local rank)", world
    return None


def _is_int(text) -> bool:
    """A rank or world size written as decimal digits, within what any job has."""
    return text is not None and _DECIMAL.match(str(text).strip()) is not None


_DECIMAL = re.compile(r"^[0-9]{1,7}$")


# ---------------------------------------------------------------------------------------
# assembly
# ---------------------------------------------------------------------------------------
def _build(report: _Report, file_id: int, rank_map: dict[int, int] | None) -> Parsed:
    offset = report.offset_ns
    parts = []
    launches = _launch_table(report.runtime, offset)
    nvtx_rows = _nvtx_rows(report.nvtx, offset, _domain_names(report.nvtx)) if not report.nvtx.empty else _empty()
    p2p_how = pd.DataFrame({"os_pid": np.zeros(0, np.int64), "how": np.zeros(0, object)})
    if not report.kernels.empty:
        kernels = _gpu_rows(report.kernels, "kernel", report.kernels["name"].astype(str), offset)
        groups = _nccl_groups(nvtx_rows)
        how = _classify_p2p(kernels, report.kernels["short_name"].astype(str).to_numpy(object), launches, groups)
        p2p_how = pd.DataFrame({"os_pid": kernels["os_pid"], "how": how})
        parts.append(kernels)
    if not report.memcpy.empty:
        kinds = report.memcpy["copy_kind"].astype(int)
        parts.append(_gpu_rows(report.memcpy, "gpu_memcpy", kinds.map(names.memcpy_name), offset))
    if not report.memset.empty:
        memset_names = pd.Series(["Memset (Device)"] * len(report.memset))
        parts.append(_gpu_rows(report.memset, "gpu_memset", memset_names, offset))
    gpu = pd.concat(parts, ignore_index=True) if parts else _empty()
    events = pd.concat([gpu, _runtime_rows(launches, gpu), nvtx_rows], ignore_index=True)
    events, dropped = _drop_impossible(report, events)
    events = events.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)

    pids = sorted(int(p) for p in pd.unique(pd.concat([gpu["os_pid"], nvtx_rows["os_pid"]])))
    devices = {int(p): set(g["pid"].astype(int)) for p, g in gpu[gpu["cat"] == "kernel"].groupby("os_pid")}
    decision = _decide_ranks(report, pids, devices, rank_map)
    report_warnings = list(report.warnings) + decision.warnings + ([dropped] if dropped else [])
    by_name = int((p2p_how["how"] == "name").sum())
    if by_name:
        report_warnings.append(
            f"{report.path.name}: {by_name} NCCL kernels were taken as P2P by their name alone "
            "(their launch or an NCCL NVTX range around it is not in the report)")
    unplaced = int((p2p_how["how"] == "unplaced").sum())
    if unplaced:
        report_warnings.append(
            f"{report.path.name}: {unplaced} SendRecv-named NCCL kernels whose launch is not in the "
            "report were not taken as P2P: kernels of that name ran collectives in the same process")
    raw_counts = _raw_counts(report)
    nccl_pids = set(events.loc[events["name"].str.startswith("nccl:"), "os_pid"].astype(int))
    gloo_pids = set(events.loc[events["name"].str.startswith("gloo:"), "os_pid"].astype(int))

    if not pids:
        trace = TraceFile(path=report.path, format=report.format, rank=-1, ranks=[-1], clock=report.clock,
                          rank_source="unknown", profiler=dict(report.profiler), host=report.host,
                          warnings=report_warnings + [
                              f"{report.path.name}: the report holds no kernels or NVTX ranges"])
        return [(trace, conform(_finish(events.iloc[0:0], -1, file_id)))]
    out = []
    first = True
    for pid in sorted(decision.ranks, key=lambda p: (decision.ranks[p], p)):
        rank = decision.ranks[pid]
        rows = events[events["os_pid"] == pid]
        counts = p2p_how.loc[p2p_how["os_pid"] == pid, "how"].value_counts()
        profiler = dict(report.profiler, pid=pid, processes_in_report=len(pids), nccl_p2p_kernels={
            "by_launch": int(counts.get("launch", 0)), "by_name": int(counts.get("name", 0)),
            "sendrecv_named_in_collectives": int(counts.get("collective", 0)),
            "sendrecv_named_unplaced": int(counts.get("unplaced", 0))})
        trace = TraceFile(
            path=report.path, format=report.format, rank=rank, ranks=[rank],
            world_size=decision.world_size, host=report.host, clock=report.clock,
            rank_source=decision.source, n_events_raw=raw_counts.get(pid, 0), profiler=profiler,
            backend="nccl" if pid in nccl_pids else ("gloo" if pid in gloo_pids else None),
            warnings=report_warnings if first else [],
        )
        first = False
        out.append((trace, conform(_finish(rows, rank, file_id))))
    return out


def _drop_impossible(report: _Report, events: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The rows that can be real, and the report's one warning about the rest."""
    identity = [events["os_pid"].to_numpy(np.int64), events["pid"].to_numpy(np.int64),
                events["tid"].to_numpy(np.int64), pd.factorize(events["cat"])[0],
                pd.factorize(events["name"])[0], events["correlation"].to_numpy(np.int64),
                events["seq"].to_numpy(np.int64), events["peer"].to_numpy(np.int64),
                events["nbytes"].to_numpy(np.int64)]
    keep, dropped = drop_impossible(events["start_ns"].to_numpy(np.int64), events["end_ns"].to_numpy(np.int64),
                                    identity)
    if keep is None:
        return events, None
    if not keep.any():
        raise TraceFormatError(
            f"{report.path}: none of its {dropped.of_rows:,} kernels, copies and NVTX ranges can be "
            f"real ({dropped.reasons()}); the report is damaged: export it again"
        )
    return events[keep], dropped.warning(report.path.name)


def _finish(rows: pd.DataFrame, rank: int, file_id: int) -> pd.DataFrame:
    rows = rows.reset_index(drop=True)
    # start/end ranges and gloo's send/recv spans run across unrelated ops: nobody's parent
    transparent = rows["async_span"].to_numpy(bool) | rows["name"].isin(ASYNC_SPANS).to_numpy()
    rows["rank"] = rank
    rows["file_id"] = file_id
    rows["depth"] = nesting_depth(rows["pid"].to_numpy(), rows["tid"].to_numpy(),
                                  rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(),
                                  transparent=transparent)
    return rows[EVENT_COLUMNS]


def _raw_counts(report: _Report) -> dict[int, int]:
    counts: dict[int, int] = {}
    for frame, key in ((report.kernels, "gpid"), (report.memcpy, "gpid"), (report.memset, "gpid"),
                       (report.runtime, "gtid"), (report.nvtx, "gtid")):
        if frame.empty:
            continue
        for pid, n in zip(*np.unique(pid_of(frame[key]), return_counts=True)):
            counts[int(pid)] = counts.get(int(pid), 0) + int(n)
    return counts
