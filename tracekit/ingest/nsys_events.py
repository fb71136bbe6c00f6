"""The normalised event table of an Nsight Systems report: kernels, memory ops and the CUDA API
calls that launched them, NVTX ranges in Kineto's names, NCCL point-to-point kernels told
apart by where they were launched, and the rows of each rank assembled."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest import nsys_names as names
from tracekit.ingest import nsys_sqlite as db
from tracekit.ingest.kineto_rows import ASYNC_SPANS
from tracekit.ingest.nesting import nesting_depth
from tracekit.ingest.nsys_ranks import _decide_ranks
from tracekit.ingest.nsys_read import _Report, pid_of, tid_of
from tracekit.ingest.validate import NOT_A_TIME, add_ns, drop_impossible
from tracekit.model.events import EVENT_COLUMNS, TraceFile, conform

_ROW_KEYS = [
    "source_index",
    "cat",
    "name",
    "start_ns",
    "end_ns",
    "pid",
    "tid",
    "on_gpu",
    "seq",
    "peer",
    "tag",
    "nbytes",
    "correlation",
]
_COLLECTIVE_CALL = re.compile(r"^nccl(All|Reduce|Broadcast|Bcast)")
# host ranges around NCCL calls that make their sends/receives an all_to_all (ProcessGroupNCCL's
# title, c10d's op): a collective, however its NCCL calls look
_ALL_TO_ALL_RANGE = re.compile(r"^(nccl:all_to_all|c10d::alltoall)")

Parsed = list[tuple[TraceFile, pd.DataFrame]]


def _frame(**cols: Any) -> pd.DataFrame:
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
    return _frame(
        source_index=z,
        cat=np.zeros(0, object),
        name=np.zeros(0, object),
        start_ns=z,
        end_ns=z,
        pid=z,
        tid=z,
        on_gpu=np.zeros(0, bool),
        os_pid=z,
    )


def _absolute(raw: pd.Series, report: _Report) -> np.ndarray:
    """A column of the report's own times as epoch ns; a time below 0 where none can be
    (times from the session start, or epoch ns) is NOT_A_TIME: the row is dropped and
    counted with the other rows that cannot be real, whatever its table."""
    values = raw.to_numpy(np.int64)
    out = add_ns(values, report.offset_ns)
    if report.never_negative:
        out = np.where(values < 0, NOT_A_TIME, out)
    return out


def _gpu_rows(frame: pd.DataFrame, cat: str, names_: pd.Series, report: _Report) -> pd.DataFrame:
    return _frame(
        source_index=frame["row"].to_numpy(np.int64),
        cat=np.full(len(frame), cat, dtype=object),
        name=names_.to_numpy(object),
        start_ns=_absolute(frame["start"], report),
        end_ns=_absolute(frame["end_"], report),
        pid=frame["device"].to_numpy(np.int64),
        tid=frame["stream"].to_numpy(np.int64),
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
            key = (int(cast(int, pid)), int(cast(int, dom)))
            if key not in found and names.looks_like_nccl_domain(set(group["text"].dropna().astype(str))):
                found[key] = "NCCL"
    return found


def _nvtx_rows(nvtx: pd.DataFrame, report: _Report, domains: dict[tuple[int, int], str]) -> pd.DataFrame:
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
        source_index=ranges["row"].to_numpy(np.int64),
        cat=np.array(cats, dtype=object),
        name=np.array(labels, dtype=object),
        start_ns=_absolute(ranges["start"], report),
        end_ns=_absolute(ranges["end_"], report),
        pid=pids,
        tid=tids,
        on_gpu=np.zeros(len(ranges), dtype=bool),
        seq=np.array(seqs, dtype=np.int64),
        peer=np.array(peers, dtype=np.int64),
        nbytes=np.array(sizes, dtype=np.int64),
        os_pid=pids,
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
    spans = {
        key: (g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        for key, g in all_to_all.groupby(["pid", "tid"])
    }
    out: dict[str, list[Any]] = {k: [] for k in ("pid", "tid", "start_ns", "end_ns", "p2p", "peer", "nbytes")}
    for (pid, tid), thread in nccl.groupby(["pid", "tid"]):
        a2a_start, a2a_end = spans.get((pid, tid), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        depth = 0
        calls: list[tuple[str, int, int]] = []
        thread_rows: Iterable[Any] = thread.itertuples(index=False)
        for row in thread_rows:
            call = row.name[len("nccl:") :]
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
            p2p = (
                bool(sends)
                and not any(_COLLECTIVE_CALL.match(c[0]) for c in launched)
                and not ((a2a_start <= row.start_ns) & (row.end_ns <= a2a_end)).any()
            )
            peers = {c[1] for c in sends if c[1] >= 0}
            out["pid"].append(pid)
            out["tid"].append(tid)
            out["start_ns"].append(row.start_ns)
            out["end_ns"].append(row.end_ns)
            out["p2p"].append(p2p)
            out["peer"].append(peers.pop() if len(peers) == 1 else -1)
            out["nbytes"].append(sends[0][2] if len(sends) == 1 else -1)
    return pd.DataFrame(out)


def _classify_p2p(
    kernels: pd.DataFrame, short_names: np.ndarray, launches: pd.DataFrame, groups: pd.DataFrame
) -> np.ndarray:
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
        launch = (
            kernels[["os_pid", "correlation"]]
            .reset_index(names="kernel")
            .merge(launches, left_on=["os_pid", "correlation"], right_on=["pid", "correlation"])
        )
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


def _launch_table(runtime: pd.DataFrame, report: _Report) -> pd.DataFrame:
    if runtime.empty:
        return pd.DataFrame(columns=["pid", "tid", "correlation", "start_ns", "end_ns", "row", "name"])
    return pd.DataFrame(
        {
            "pid": pid_of(runtime["gtid"]),
            "tid": tid_of(runtime["gtid"]),
            "correlation": runtime["correlation"].to_numpy(np.int64),
            "start_ns": _absolute(runtime["start"], report),
            "end_ns": _absolute(runtime["end_"], report),
            "row": runtime["row"].to_numpy(np.int64),
            "name": runtime["name"].astype(str).to_numpy(object),
        }
    ).drop_duplicates(["pid", "correlation"])


def _runtime_rows(launches: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """The API calls that launched the GPU rows kept (not every CUDA API call)."""
    if launches.empty or gpu.empty:
        return _empty()
    wanted = gpu[["os_pid", "correlation"]].drop_duplicates().rename(columns={"os_pid": "pid"})
    used = launches.merge(wanted, on=["pid", "correlation"])
    return _frame(
        source_index=used["row"].to_numpy(np.int64),
        cat=np.full(len(used), "runtime", dtype=object),
        name=np.array([names.api_name(n) for n in used["name"]], dtype=object),
        start_ns=used["start_ns"].to_numpy(np.int64),
        end_ns=used["end_ns"].to_numpy(np.int64),
        pid=used["pid"].to_numpy(np.int64),
        tid=used["tid"].to_numpy(np.int64),
        on_gpu=np.zeros(len(used), dtype=bool),
        correlation=used["correlation"].to_numpy(np.int64),
        os_pid=used["pid"].to_numpy(np.int64),
    )


def _build(report: _Report, file_id: int, rank_map: dict[int, int] | None) -> Parsed:
    parts = []
    launches = _launch_table(report.runtime, report)
    nvtx_rows = _nvtx_rows(report.nvtx, report, _domain_names(report.nvtx)) if not report.nvtx.empty else _empty()
    p2p_how = pd.DataFrame({"os_pid": np.zeros(0, np.int64), "how": np.zeros(0, object)})
    if not report.kernels.empty:
        kernels = _gpu_rows(report.kernels, "kernel", report.kernels["name"].astype(str), report)
        groups = _nccl_groups(nvtx_rows)
        how = _classify_p2p(kernels, report.kernels["short_name"].astype(str).to_numpy(object), launches, groups)
        p2p_how = pd.DataFrame({"os_pid": kernels["os_pid"], "how": how})
        parts.append(kernels)
    if not report.memcpy.empty:
        kinds = report.memcpy["copy_kind"].astype(int)
        parts.append(_gpu_rows(report.memcpy, "gpu_memcpy", kinds.map(names.memcpy_name), report))
    if not report.memset.empty:
        memset_names = pd.Series(["Memset (Device)"] * len(report.memset))
        parts.append(_gpu_rows(report.memset, "gpu_memset", memset_names, report))
    gpu = pd.concat(parts, ignore_index=True) if parts else _empty()
    events = pd.concat([gpu, _runtime_rows(launches, gpu), nvtx_rows], ignore_index=True)
    events, dropped = _drop_impossible(report, events)
    events = events.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)

    pids = sorted(int(p) for p in pd.unique(pd.concat([gpu["os_pid"], nvtx_rows["os_pid"]])))
    devices = {int(cast(int, p)): set(g["pid"].astype(int)) for p, g in gpu[gpu["cat"] == "kernel"].groupby("os_pid")}
    decision = _decide_ranks(report, pids, devices, rank_map)
    report_warnings = list(report.warnings) + decision.warnings + ([dropped] if dropped else [])
    by_name = int((p2p_how["how"] == "name").sum())
    if by_name:
        report_warnings.append(
            f"{report.path.name}: {by_name} NCCL kernels were taken as P2P by their name alone "
            "(their launch or an NCCL NVTX range around it is not in the report)"
        )
    unplaced = int((p2p_how["how"] == "unplaced").sum())
    if unplaced:
        report_warnings.append(
            f"{report.path.name}: {unplaced} SendRecv-named NCCL kernels whose launch is not in the "
            "report were not taken as P2P: kernels of that name ran collectives in the same process"
        )
    raw_counts = _raw_counts(report)
    nccl_pids = set(events.loc[events["name"].str.startswith("nccl:"), "os_pid"].astype(int))
    gloo_pids = set(events.loc[events["name"].str.startswith("gloo:"), "os_pid"].astype(int))

    if not pids:
        trace = TraceFile(
            path=report.path,
            format=report.format,
            rank=-1,
            ranks=[-1],
            clock=report.clock,
            rank_source="unknown",
            profiler=dict(report.profiler),
            host=report.host,
            warnings=report_warnings + [f"{report.path.name}: the report holds no kernels or NVTX ranges"],
        )
        return [(trace, conform(_finish(events.iloc[0:0], -1, file_id)))]
    out = []
    first = True
    for pid in sorted(decision.ranks, key=lambda p: (decision.ranks[p], p)):
        rank = decision.ranks[pid]
        rows = events[events["os_pid"] == pid]
        counts = p2p_how.loc[p2p_how["os_pid"] == pid, "how"].value_counts()
        profiler = dict(
            report.profiler,
            pid=pid,
            processes_in_report=len(pids),
            nccl_p2p_kernels={
                "by_launch": int(counts.get("launch", 0)),
                "by_name": int(counts.get("name", 0)),
                "sendrecv_named_in_collectives": int(counts.get("collective", 0)),
                "sendrecv_named_unplaced": int(counts.get("unplaced", 0)),
            },
        )
        trace = TraceFile(
            path=report.path,
            format=report.format,
            rank=rank,
            ranks=[rank],
            world_size=decision.world_size,
            host=report.host,
            clock=report.clock,
            rank_source=decision.source,
            n_events_raw=raw_counts.get(pid, 0),
            profiler=profiler,
            backend="nccl" if pid in nccl_pids else ("gloo" if pid in gloo_pids else None),
            warnings=report_warnings if first else [],
        )
        first = False
        out.append((trace, conform(_finish(rows, rank, file_id))))
    return out


def _drop_impossible(report: _Report, events: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The rows that can be real, and the report's one warning about the rest."""
    identity = [
        events["os_pid"].to_numpy(np.int64),
        events["pid"].to_numpy(np.int64),
        events["tid"].to_numpy(np.int64),
        pd.factorize(events["cat"])[0],
        pd.factorize(events["name"])[0],
        events["correlation"].to_numpy(np.int64),
        events["seq"].to_numpy(np.int64),
        events["peer"].to_numpy(np.int64),
        events["nbytes"].to_numpy(np.int64),
    ]
    keep, dropped = drop_impossible(
        events["start_ns"].to_numpy(np.int64), events["end_ns"].to_numpy(np.int64), identity
    )
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
    rows["depth"] = nesting_depth(
        rows["pid"].to_numpy(),
        rows["tid"].to_numpy(),
        rows["start_ns"].to_numpy(),
        rows["end_ns"].to_numpy(),
        transparent=transparent,
    )
    return rows[EVENT_COLUMNS]


def _raw_counts(report: _Report) -> dict[int, int]:
    counts: dict[int, int] = {}
    for frame, key in (
        (report.kernels, "gpid"),
        (report.memcpy, "gpid"),
        (report.memset, "gpid"),
        (report.runtime, "gtid"),
        (report.nvtx, "gtid"),
    ):
        if frame.empty:
            continue
        for pid, n in zip(*np.unique(pid_of(frame[key]), return_counts=True)):
            counts[int(pid)] = counts.get(int(pid), 0) + int(n)
    return counts
