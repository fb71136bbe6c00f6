"""Which rank each process of an Nsight Systems report is: the caller's rank map, what the report
states (NVTX marks, thread names, ``rank=N`` in range names, a one-process report's launch
environment, command line or file name), the CUDA device, or the order of pids."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from tracekit.ingest import nsys_names as names
from tracekit.ingest import nsys_sqlite as db
from tracekit.ingest.nsys_read import _Report, pid_of

_RANK_VARS = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "MV2_COMM_WORLD_RANK",
    "PALS_RANKID",
)
_WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE")
_RANK_ARG = re.compile(r"^--(local[_-])?rank[=\s](\d{1,7})$")


@dataclass
class _RankDecision:
    ranks: dict[int, int]  # os pid -> rank (pids absent are dropped)
    source: str
    world_size: int | None = None
    warnings: list[str] = field(default_factory=list)


def _stated_ranks(
    nvtx: pd.DataFrame, pids: list[int]
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


def _decide_ranks(
    report: _Report, pids: list[int], devices: dict[int, set[int]], rank_map: dict[int, int] | None
) -> _RankDecision:
    name = report.path.name
    if rank_map:
        mapped = {p: int(rank_map[p]) for p in pids if p in rank_map}
        if mapped:
            decision = _RankDecision(mapped, "rank_map")
            left = [p for p in pids if p not in mapped]
            if left:
                decision.warnings.append(
                    f"{name}: processes {left} are not in the rank map; their events were left out"
                )
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
        return _RankDecision(
            {p: markers[p] for p in pids}, "NVTX rank marker", sizes.pop() if len(sizes) == 1 else None
        )
    if pids and all(len(tokens[p]) == 1 for p in pids) and len({min(tokens[p]) for p in pids}) == len(pids):
        return _RankDecision(
            {p: min(tokens[p]) for p in pids},
            "NVTX range names (rank=N)",
            warnings=[f"{name}: ranks read from 'rank=N' in NVTX range names"],
        )
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
        return _RankDecision(
            one_device,
            "CUDA device id",
            warnings=[
                f"{name}: {len(pids)} processes, no rank stated; took each process's CUDA device as its "
                "rank (true for one node with one GPU per rank); pass a rank map if not"
            ],
        )
    ordered = {p: i for i, p in enumerate(sorted(pids))}
    return _RankDecision(
        ordered,
        "pid order",
        warnings=[
            f"{name}: {len(pids)} processes and nothing in the report says which rank each is; "
            "numbered them by pid order, which may be wrong; pass a rank map {pid: rank} to fix"
        ],
    )


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


def _is_int(text: object) -> bool:
    """A rank or world size written as decimal digits, within what any job has."""
    return text is not None and _DECIMAL.match(str(text).strip()) is not None


_DECIMAL = re.compile(r"^[0-9]{1,7}$")
