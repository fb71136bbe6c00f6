"""An independent reference for device busy/idle and NCCL kernel pairs on real GPU traces.

It reads the raw files with gzip, json, sqlite3 and numpy only (nothing from tracekit), so
that ``tests/test_device_real.py`` can hold tracekit's device timeline against it. The
definitions (tracekit issue #12) are restated here from the issue, not from tracekit's code:

* device op: Kineto ``X`` event of cat ``kernel``/``gpu_memcpy``/``gpu_memset`` (nsys: a row
  of ``CUPTI_ACTIVITY_KIND_KERNEL``/``MEMCPY``/``MEMSET``); comm if its name contains
  "nccl" or "rccl" (any case), compute otherwise.
* launch: the ``cuda_runtime``/``cuda_driver`` event with the op's ``args["correlation"]``
  (nsys: the ``CUPTI_ACTIVITY_KIND_RUNTIME`` row with its correlationId in the same process).
* step: the rank's host ``ProfilerStep#N`` whose closed span holds the launch's start (the
  earlier step where two touch); without a launch, the one holding the op's own start; else
  no step. A rank without ProfilerStep marks is one step, 0, over everything.
* before the profile (tracekit issue #28): an op without a launch in the trace that ran on
  its stream before that stream's first op with a launch was launched before the profile
  began: it belongs to no step and is left out of every figure.
* per step: the window runs from the step's first compute op (over all ranks), or from where
  the previous step's window ended if that is later, to its last compute op's end:
  consecutive windows never overlap (with the host a step ahead, a side stream runs step N+1
  while the main stream still runs step N). Per rank, the window starts no earlier than the
  end of its work from before the profile; idle = the part of it where none of the rank's
  compute ops (of any step, not from before the profile) ran; busy = the length of the union
  of the rank's compute ops of that step, wherever they ran (a step keeps what it launched);
  window = busy + idle.
* a P2P kernel pair: wait = later start - earlier start (on the side that started first),
  transfer = min(end_a, end_b) - later start.

Times are int ns as the formats define them: Kineto ``ns = round(ts * 1000)`` (ties to even,
as float64 arithmetic gives them) plus ``baseTimeNanoseconds``, end = start + round(dur *
1000); nsys ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` + the row's ns.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank-?(\d+)")
NO_STEP = -1


@dataclass
class DeviceOps:
    """One rank's device ops, as parallel arrays."""

    rank: int
    start_ns: np.ndarray
    end_ns: np.ndarray
    is_comm: np.ndarray
    step: np.ndarray  # NO_STEP where no step holds the op
    names: list[str]
    before_profile: np.ndarray | None = None  # launched before the profile began (module doc)
    host_step_end_ns: dict[int, int] = field(default_factory=dict)  # ProfilerStep#N -> its host end


@dataclass
class BubbleRow:
    rank: int
    step: int
    window_start_ns: int
    window_end_ns: int
    window_ns: int
    busy_ns: int
    idle_ns: int


def union_ns(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """Length of the union of the intervals [start, end)."""
    if len(start_ns) == 0:
        return 0
    order = np.argsort(start_ns, kind="stable")
    starts, ends = start_ns[order], end_ns[order]
    # an interval opens a new run when it starts after every earlier one has ended
    reach = np.maximum.accumulate(ends)
    opens = np.ones(len(starts), dtype=bool)
    opens[1:] = starts[1:] > reach[:-1]
    run_id = np.cumsum(opens) - 1
    run_start = starts[opens]
    run_end = np.zeros(len(run_start), dtype=np.int64)
    np.maximum.at(run_end, run_id, ends)
    return int((run_end - run_start).sum())


def bubble_rows(ranks: list[DeviceOps]) -> list[BubbleRow]:
    """Per step (with compute ops on some rank) and per rank of the run: window, busy, idle."""
    steps = sorted({int(s) for ops in ranks for s in ops.step[~ops.is_comm] if s != NO_STEP})
    rows = []
    previous_end = None
    for step in steps:
        picked = [(ops, (ops.step == step) & ~ops.is_comm & ~_before(ops)) for ops in ranks]
        window_end = max(int(ops.end_ns[m].max()) for ops, m in picked if m.any())
        window_start = min(int(ops.start_ns[m].min()) for ops, m in picked if m.any())
        if previous_end is not None:
            window_start = min(max(window_start, previous_end), window_end)
        previous_end = max(window_end, previous_end or window_end)
        for ops, own in sorted(picked, key=lambda p: p[0].rank):
            if not own.any():
                continue
            before = _before(ops) & ~ops.is_comm
            start = window_start
            if before.any():
                start = min(max(start, int(ops.end_ns[before].max())), window_end)
            compute = ~ops.is_comm & ~_before(ops)
            starts = np.clip(ops.start_ns[compute], start, window_end)
            ends = np.clip(ops.end_ns[compute], start, window_end)
            idle = (window_end - start) - union_ns(starts, ends)
            busy = union_ns(ops.start_ns[own], ops.end_ns[own])
            rows.append(BubbleRow(ops.rank, step, start, window_end, busy + idle, busy, idle))
    return rows


def collective_idle_ns(ranks: list[DeviceOps]) -> dict[int, int]:
    """Per rank, over its bubble rows' windows: the time a comm kernel ran and no compute op
    did (tracekit issue #28: idle time spent in collectives). A run without pipeline
    actions: every comm kernel is outside every action."""
    out: dict[int, int] = {}
    rows = bubble_rows(ranks)
    for ops in ranks:
        profiled = ~_before(ops)
        comm, compute = ops.is_comm & profiled, ~ops.is_comm & profiled
        total = 0
        for row in (r for r in rows if r.rank == ops.rank):
            lo, hi = row.window_start_ns, row.window_end_ns
            both = union_ns(
                np.clip(np.concatenate([ops.start_ns[comm], ops.start_ns[compute]]), lo, hi),
                np.clip(np.concatenate([ops.end_ns[comm], ops.end_ns[compute]]), lo, hi),
            )
            only_compute = union_ns(np.clip(ops.start_ns[compute], lo, hi), np.clip(ops.end_ns[compute], lo, hi))
            total += both - only_compute  # |comm ∪ compute| - |compute| = |comm \ compute|
        out[ops.rank] = total
    return out


def _before(ops: DeviceOps) -> np.ndarray:
    return ops.before_profile if ops.before_profile is not None else np.zeros(len(ops.start_ns), dtype=bool)


def _launched_before_profile(stream: np.ndarray, starts: np.ndarray, has_launch: np.ndarray) -> np.ndarray:
    """Per op: no launch, and ran before the first op with a launch on its stream."""
    out = np.zeros(len(starts), dtype=bool)
    for s in set(stream.tolist()):
        on = stream == s
        launched = on & has_launch
        if launched.any():
            out |= on & ~has_launch & (starts < starts[launched].min())
    return out


def _steps_of(times_ns: np.ndarray, step_spans: list[tuple[int, int, int]]) -> np.ndarray:
    """The step whose closed span holds each time (the earliest-starting one on a tie)."""
    out = np.full(len(times_ns), NO_STEP, dtype=np.int64)
    for number, start, end in sorted(step_spans, key=lambda s: (s[1], s[2]), reverse=True):
        # later steps first, so an earlier step overwrites where two spans touch
        out[(times_ns >= start) & (times_ns <= end)] = number
    return out


# ---------------------------------------------------------------------------------------
# Kineto
# ---------------------------------------------------------------------------------------
def _ns(us) -> int:
    return int(round(us * 1000))


def kineto_rank_ops(path: Path) -> DeviceOps:
    """One Kineto file (one rank) read straight from its JSON."""
    with gzip.open(path) if path.suffix == ".gz" else open(path, "rb") as fh:
        doc = json.load(fh)
    base = doc.get("baseTimeNanoseconds") or 0
    info = doc.get("distributedInfo") or {}
    if "rank" in info:
        rank = int(info["rank"])
    else:
        found = _RANK_IN_NAME.search(path.name)
        rank = int(found.group(1)) if found else 0
    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    launch_start = {}
    for e in complete:
        if e.get("cat") in LAUNCH_CATS and "correlation" in (e.get("args") or {}):
            launch_start.setdefault(e["args"]["correlation"], base + _ns(e["ts"]))
    spans = []
    for e in complete:
        hit = _STEP.match(str(e.get("name", "")))
        if hit and e.get("cat") == "user_annotation":
            start = base + _ns(e["ts"])
            spans.append((int(hit.group(1)), start, start + _ns(e["dur"])))
    device = [e for e in complete if e.get("cat") in DEVICE_CATS]
    starts = np.array([base + _ns(e["ts"]) for e in device], dtype=np.int64)
    ends = starts + np.array([_ns(e["dur"]) for e in device], dtype=np.int64)
    names = [str(e["name"]) for e in device]
    launches = [launch_start.get((e.get("args") or {}).get("correlation")) for e in device]
    has_launch = np.array([t is not None for t in launches], dtype=bool)
    anchor = np.where(has_launch, np.array([t if t is not None else 0 for t in launches], dtype=np.int64), starts)
    if spans:
        step = _steps_of(anchor, spans)
    else:
        step = np.zeros(len(device), dtype=np.int64)
    stream = np.array([(e.get("args") or {}).get("stream", e.get("tid")) for e in device], dtype=np.int64)
    before = _launched_before_profile(stream, starts, has_launch) if has_launch.any() else None
    if before is not None:
        step[before] = NO_STEP
    return DeviceOps(
        rank=rank,
        start_ns=starts,
        end_ns=ends,
        is_comm=_comm(names),
        step=step,
        names=names,
        host_step_end_ns={n: e for n, _, e in spans},
        before_profile=before,
    )


def _comm(names: list[str]) -> np.ndarray:
    return np.array([("nccl" in n.lower()) or ("rccl" in n.lower()) for n in names], dtype=bool)


# ---------------------------------------------------------------------------------------
# Nsight Systems
# ---------------------------------------------------------------------------------------
_PID_SHIFT, _ID_MASK = 24, 0xFFFFFF
# NCCL calls that launch kernels; ncclCommCount and the like launch none
_P2P_CALLS = {"ncclSend", "ncclRecv"}
_COLLECTIVE_CALLS = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast", "ncclReduce"}
# host ranges (torch emit_nvtx / ProcessGroupNCCL titles) that make an NCCL group an all_to_all
_ALL_TO_ALL = re.compile(r"^(nccl:all_to_all|c10d::alltoall)")


@dataclass
class NsysKernelClass:
    """How each NCCL kernel of a report was launched."""

    rank: int
    start_ns: int
    end_ns: int
    name: str
    by_send_recv_group: bool  # inside a lone ncclSend/ncclRecv or a group of sends/receives only
    in_all_to_all: bool  # ... and that group sits inside an all_to_all host range


@dataclass
class NsysReference:
    ranks: list[DeviceOps]
    nccl_kernels: list[NsysKernelClass]
    bubbles: list[BubbleRow]

    def p2p_kernels(self, rank: int) -> list[NsysKernelClass]:
        return [k for k in self.nccl_kernels if k.rank == rank and k.by_send_recv_group and not k.in_all_to_all]


def _names(conn: sqlite3.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT id, value FROM StringIds"))


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def nsys_reference(path: Path) -> NsysReference:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _nsys_reference(conn)
    finally:
        conn.close()


def _nsys_reference(conn: sqlite3.Connection) -> NsysReference:
    tables = _tables(conn)
    strings = _names(conn)
    meta = {}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables:
            meta.update(dict(conn.execute(f"SELECT name, value FROM {table}")))
    # every report here is exported without --ts-normalize: absolute = session start + ts
    assert meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false") == "false"
    assert int(meta.get("EXPORT_PARAM_TIME_SHIFT", 0) or 0) == 0
    (session_start,) = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()

    ops: dict[int, list[tuple[int, int, str, int, int]]] = {}  # pid -> (start, end, name, correlation, stream)
    devices: dict[int, set[int]] = {}
    kernel_rows = conn.execute(
        "SELECT start, end, globalPid, deviceId, correlationId, demangledName, shortName, streamId "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL"
    ).fetchall()
    for start, end, gpid, device, corr, demangled, short, stream in kernel_rows:
        pid = (gpid >> _PID_SHIFT) & _ID_MASK
        name = strings.get(demangled) or strings.get(short) or "kernel"
        ops.setdefault(pid, []).append((start, end, name, corr, stream))
        devices.setdefault(pid, set()).add(device)
    kernel_rows = [row[:7] for row in kernel_rows]
    for table, label in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if table in tables:
            query = f"SELECT start, end, globalPid, correlationId, streamId FROM {table}"
            for start, end, gpid, corr, stream in conn.execute(query):
                ops.setdefault((gpid >> _PID_SHIFT) & _ID_MASK, []).append((start, end, label, corr, stream))
    # launches: runtime API rows, by process and correlation id
    launched: set[tuple[int, int]] = set()
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        for gtid, corr in conn.execute("SELECT globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            launched.add(((gtid >> _PID_SHIFT) & _ID_MASK, corr))

    nvtx = (
        conn.execute(
            "SELECT start, end, globalTid, domainId, coalesce(text, (SELECT value FROM StringIds WHERE id = textId)) "
            "FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
        ).fetchall()
        if "NVTX_EVENTS" in tables
        else []
    )
    # the reports here hold no ProfilerStep ranges: each rank is one step, 0
    assert not any(_STEP.match((text or "").split(",")[0]) for *_, text in nvtx)

    # rank = the process's one CUDA device when the report holds several processes (each on its own GPU)
    pids = sorted(ops)
    if len(pids) > 1:
        assert all(len(devices.get(p, ())) == 1 for p in pids)
        rank_of = {p: next(iter(devices[p])) for p in pids}
        assert len(set(rank_of.values())) == len(pids)
    else:
        rank_of = {p: 0 for p in pids}

    ranks = []
    for pid in pids:
        rows = ops[pid]
        starts = np.array([r[0] for r in rows], dtype=np.int64) + session_start
        ends = np.array([r[1] for r in rows], dtype=np.int64) + session_start
        names = [r[2] for r in rows]
        has_launch = np.array([(pid, r[3]) in launched for r in rows], dtype=bool)
        stream = np.array([r[4] for r in rows], dtype=np.int64)
        before = _launched_before_profile(stream, starts, has_launch) if has_launch.any() else None
        step = np.zeros(len(rows), dtype=np.int64)
        if before is not None:
            step[before] = NO_STEP
        ranks.append(
            DeviceOps(
                rank=rank_of[pid],
                start_ns=starts,
                end_ns=ends,
                is_comm=_comm(names),
                step=step,
                names=names,
                before_profile=before,
            )
        )
    ranks.sort(key=lambda r: r.rank)

    nccl_kernels = _classify_nccl(conn, kernel_rows, strings, nvtx, rank_of, session_start)
    return NsysReference(ranks=ranks, nccl_kernels=nccl_kernels, bubbles=bubble_rows(ranks))


def _nccl_domains(nvtx) -> set[tuple[int, int]]:
    """(pid, domainId) of NCCL's NVTX domain: the one whose ranges are NCCL API calls."""
    found = set()
    for _, _, gtid, domain, text in nvtx:
        if domain and text in ("ncclGroupStart", "ncclGroupEnd", "ncclSend", "ncclRecv"):
            found.add(((gtid >> _PID_SHIFT) & _ID_MASK, domain))
    return found


def _launching_ranges(nvtx) -> list[tuple[int, int, int, bool, bool]]:
    """(globalTid, start, end, sends/receives only, inside an all_to_all) for each NCCL call
    that launches kernels: a lone ncclSend/ncclRecv/collective, or an outermost ncclGroupEnd."""
    domains = _nccl_domains(nvtx)
    by_thread: dict[int, list] = {}
    for row in nvtx:
        by_thread.setdefault(row[2], []).append(row)
    out = []
    for gtid, rows in by_thread.items():
        pid = (gtid >> _PID_SHIFT) & _ID_MASK
        rows.sort(key=lambda r: (r[0], -r[1]))
        host = [r for r in rows if (pid, r[3]) not in domains and r[4]]
        depth, calls = 0, []
        for start, end, _, domain, text in rows:
            if (pid, domain) not in domains:
                continue
            if text == "ncclGroupStart":
                calls = [] if depth == 0 else calls
                depth += 1
                continue
            if text == "ncclGroupEnd":
                depth = max(depth - 1, 0)
                if depth:
                    continue
                launched = [c for c in calls if c in _P2P_CALLS | _COLLECTIVE_CALLS]
            elif text in _P2P_CALLS | _COLLECTIVE_CALLS:
                if depth:
                    calls.append(text)
                    continue
                launched = [text]
            else:
                continue
            send_recv_only = bool(launched) and all(c in _P2P_CALLS for c in launched)
            in_all_to_all = any(h[0] <= start and end <= h[1] and _ALL_TO_ALL.match(h[4]) for h in host)
            out.append((gtid, start, end, send_recv_only, in_all_to_all))
    return out


def _classify_nccl(conn, kernel_rows, strings, nvtx, rank_of, session_start) -> list[NsysKernelClass]:
    launches = {}
    for start, gtid, corr in conn.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        launches.setdefault(((gtid >> _PID_SHIFT) & _ID_MASK, corr), (start, gtid))
    ranges = _launching_ranges(nvtx)
    out = []
    for start, end, gpid, _, corr, demangled, short in kernel_rows:
        name = strings.get(short) or strings.get(demangled) or ""
        if "nccl" not in name.lower():
            continue
        pid = (gpid >> _PID_SHIFT) & _ID_MASK
        launch = launches.get((pid, corr))
        holder = None
        if launch is not None:
            t, gtid = launch
            holder = next((r for r in ranges if r[0] == gtid and r[1] <= t <= r[2]), None)
        out.append(
            NsysKernelClass(
                rank=rank_of[pid],
                start_ns=start + session_start,
                end_ns=end + session_start,
                name=name,
                by_send_recv_group=bool(holder and holder[3]),
                in_all_to_all=bool(holder and holder[4]),
            )
        )
    out.sort(key=lambda k: (k.rank, k.start_ns))
    return out


def kernel_pairs(side_a: list[tuple[int, int]], side_b: list[tuple[int, int]]) -> list[dict]:
    """The k-th kernel (start_ns, end_ns) of rank a with the k-th of rank b, in start order:
    wait on the side that started first, transfer from the later start to the first end."""
    rows = []
    for (sa, ea), (sb, eb) in zip(sorted(side_a), sorted(side_b)):
        later = max(sa, sb)
        rows.append(
            {
                "start_a_ns": sa,
                "end_a_ns": ea,
                "start_b_ns": sb,
                "end_b_ns": eb,
                "waiting": "a" if sa < sb else ("b" if sb < sa else "none"),
                "wait_ns": later - min(sa, sb),
                "transfer_ns": min(ea, eb) - later,
            }
        )
    return rows
