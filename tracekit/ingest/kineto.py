"""PyTorch profiler (Kineto) Chrome-trace JSON: ``.json`` and ``.json.gz``, one file per rank.

Reads only what the analysis needs from each complete (``ph: "X"``) event and turns it into
rows of the normalised event table (:mod:`tracekit.model.events`). A truncated file (a
profiler killed mid-write) yields the events it holds, with a warning.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest.nesting import nesting_depth
from tracekit.model.events import TraceFile, conform

# Categories kept; everything else (python_function, cuda_runtime, flows, instants) is dropped.
KEPT_CATEGORIES = {
    "cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset",
}
# Annotations that span from posting a message to its wait's return, across other ops.
ASYNC_SPANS = ("gloo:send", "gloo:recv")
_GPU_CATEGORIES = {"gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset"}
_P2P_CPU_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_"}
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "c10::Half": 2, "half": 2,
    "float16": 2, "c10::BFloat16": 2, "bfloat16": 2, "long int": 8, "int64": 8, "int": 4,
    "int32": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "int8": 1, "uint8": 1,
    "bool": 1, "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4,
    "Byte": 1, "Char": 1, "Bool": 1,
}
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def read_json_document(path: Path) -> tuple[dict, bool]:
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
    return doc, truncated


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


def _salvage(raw: bytes, path: Path) -> dict:
    """Recover the header fields and every complete event of a truncated document."""
    text = raw.decode("utf-8", errors="replace")
    start = text.find('"traceEvents"')
    if start < 0:
        raise TraceFormatError(
            f"{path}: not valid JSON and no 'traceEvents' found; is this a PyTorch profiler trace?"
        )
    bracket = text.find("[", start)
    decoder = json.JSONDecoder()
    events: list = []
    pos = bracket + 1
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            event, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        events.append(event)
    header: dict = {}
    head_text = text[:start].rstrip().rstrip(",") + "}"
    try:
        header = json.loads(head_text)
    except json.JSONDecodeError:
        header = {}
    header["traceEvents"] = events
    return header


def rank_from_name(path: Path) -> int | None:
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def parse_kineto(path: Path, file_id: int, rank_pattern: str | None = None) -> tuple[TraceFile, pd.DataFrame]:
    """Parse one Kineto trace file into its :class:`TraceFile` and event rows."""
    doc, truncated = read_json_document(path)
    trace = TraceFile(path=path, format="kineto", rank=-1, truncated=truncated)
    if truncated:
        trace.warnings.append(
            f"{path.name}: the file ends early (profiler stopped mid-write?); read the "
            f"{len(doc['traceEvents'])} complete events it holds"
        )
    info = doc.get("distributedInfo") or {}
    trace.rank, trace.rank_source = _decide_rank(path, info, rank_pattern)
    trace.ranks = [trace.rank]
    trace.world_size = info.get("world_size")
    trace.backend = info.get("backend")
    trace.host = doc.get("host_name")
    trace.profiler = {
        k: doc[k] for k in ("schemaVersion", "trace_id", "record_shapes", "displayTimeUnit")
        if k in doc
    }
    if info.get("nccl_version"):
        trace.profiler["nccl_version"] = info["nccl_version"]
    base_ns, trace.clock = _time_base(doc)
    if trace.clock == "relative":
        trace.warnings.append(
            f"{path.name}: no baseTimeNanoseconds and timestamps are not epoch times; they are "
            "aligned across ranks only if all ranks share this file's origin"
        )
    group_to_global = _group_rank_maps(info)
    raw_events = doc["traceEvents"]
    trace.n_events_raw = len(raw_events)
    rows = _extract_rows(raw_events, base_ns, group_to_global)
    events = pd.DataFrame(rows)
    if len(events) == 0:
        events = pd.DataFrame({c: [] for c in _ROW_KEYS})
    events["rank"] = trace.rank
    events["file_id"] = file_id
    events["depth"] = nesting_depth(events["pid"].to_numpy(), events["tid"].to_numpy(),
                                    events["start_ns"].to_numpy(), events["end_ns"].to_numpy(),
                                    transparent=events["name"].isin(ASYNC_SPANS).to_numpy())
    return trace, conform(events)


_ROW_KEYS = ["source_index", "cat", "name", "start_ns", "end_ns", "pid", "tid", "on_gpu", "seq",
             "peer", "tag", "nbytes", "correlation"]


# Older Kineto wrote epoch microseconds in ``ts`` and no base; ~1e15 us is year 2001.
_EPOCH_US_FLOOR = 9.0e14


def _time_base(doc: dict) -> tuple[int, str]:
    """The ns to add to ``ts * 1000``, and whether the result is Unix time."""
    base_ns = doc.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and base_ns > 0:
        return int(base_ns), "unix"
    for event in doc["traceEvents"][:200]:
        if isinstance(event, dict) and isinstance(event.get("ts"), (int, float)) and event.get("ph") == "X":
            return 0, ("unix" if event["ts"] > _EPOCH_US_FLOOR else "relative")
    return 0, "relative"


def _decide_rank(path: Path, info: dict, rank_pattern: str | None) -> tuple[int, str]:
    if rank_pattern:
        match = re.search(rank_pattern, path.name)
        if not match or not match.groups():
            raise TraceFormatError(
                f"{path}: --rank-from pattern {rank_pattern!r} does not match this file name "
                "with a group; give a regex like 'rank(\\d+)'"
            )
        return int(match.group(1)), "--rank-from"
    if isinstance(info.get("rank"), int):
        return int(info["rank"]), "distributedInfo"
    from_name = rank_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    return -1, "unknown"


def _group_rank_maps(info: dict) -> dict[str, list[int]]:
    maps = {}
    for pg in info.get("pg_config") or []:
        ranks = pg.get("ranks")
        if isinstance(ranks, list):
            maps[str(pg.get("pg_name"))] = ranks
    return maps


def _as_int(value) -> int:
    """Kineto pids/tids are usually ints, but some exporters write labels ("stream 7")."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    text = str(value)
    digits = re.search(r"-?\d+", text)
    if digits:
        return int(digits.group(0))
    return -(zlib.crc32(text.encode()) & 0x7FFFFFFF)


def _extract_rows(raw_events: list, base_ns: int, group_to_global: dict[str, list[int]]) -> dict:
    cols: dict[str, list] = {k: [] for k in _ROW_KEYS}
    default_group = group_to_global.get("0")
    for index, event in enumerate(raw_events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        cat = str(event.get("cat", "")).lower()
        if cat not in KEPT_CATEGORIES:
            continue
        ts = event.get("ts")
        dur = event.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        name = str(event.get("name", ""))
        args = event.get("args") or {}
        start = base_ns + round(ts * 1000)
        peer = tag = nbytes = -1
        if cat == "cpu_op" and name in _P2P_CPU_OPS:
            peer, tag, nbytes = _gloo_p2p_args(args, default_group)
        elif cat == "cpu_op" and name == "record_param_comms":
            name, peer, nbytes = _nccl_comm_args(args, group_to_global)
        seq = args.get("Sequence number", -1)
        corr = args.get("External id", args.get("correlation", -1))
        cols["source_index"].append(index)
        cols["cat"].append(cat)
        cols["name"].append(name)
        cols["start_ns"].append(start)
        cols["end_ns"].append(start + max(0, round(dur * 1000)))
        cols["pid"].append(_as_int(event.get("pid", 0)))
        cols["tid"].append(_as_int(event.get("tid", 0)))
        cols["on_gpu"].append(cat in _GPU_CATEGORIES)
        cols["seq"].append(seq if isinstance(seq, int) else -1)
        cols["peer"].append(peer)
        cols["tag"].append(tag)
        cols["nbytes"].append(nbytes)
        cols["correlation"].append(corr if isinstance(corr, int) else -1)
    return cols


def _gloo_p2p_args(args: dict, default_group: list[int] | None) -> tuple[int, int, int]:
    """Peer, tag and size of a c10d::send / c10d::recv_ (present with record_shapes=True)."""
    concrete = args.get("Concrete Inputs") or []
    peer = tag = nbytes = -1
    if len(concrete) > 3:
        peer = _int_or(concrete[2], -1)
        tag = _int_or(concrete[3], -1)
        if peer >= 0 and default_group and peer < len(default_group):
            peer = int(default_group[peer])
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    if dims and isinstance(dims[0], list) and dims[0] and isinstance(dims[0][0], list):
        # send/recv_ take a list of tensors: dims[0] is a list of shapes
        shapes = dims[0]
        dtype = types[0] if types else "float"
        nbytes = sum(int(np.prod(s)) for s in shapes if isinstance(s, list)) * _DTYPE_BYTES.get(
            str(dtype).replace("TensorList", "").strip() or "float", 4)
    elif dims and isinstance(dims[0], list):
        dtype = types[0] if types else "float"
        nbytes = int(np.prod(dims[0])) * _DTYPE_BYTES.get(str(dtype), 4)
    return peer, tag, nbytes


def _nccl_comm_args(args: dict, group_to_global: dict[str, list[int]]) -> tuple[str, int, int]:
    """NCCL's record_param_comms: name it by collective, find the P2P peer where given."""
    collective = str(args.get("Collective name", "unknown"))
    name = f"record_param_comms:{collective}"
    peer = -1
    if collective == "send":
        peer = _int_or(args.get("Dst Rank"), -1)
    elif collective in ("recv", "recv_"):
        peer = _int_or(args.get("Src Rank"), -1)
    nelems = _int_or(args.get("In msg nelems") if collective == "send" else args.get("Out msg nelems"), -1)
    dtype = str(args.get("dtype", "Float"))
    nbytes = nelems * _DTYPE_BYTES.get(dtype, 4) if nelems >= 0 else -1
    return name, peer, nbytes


def _int_or(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
