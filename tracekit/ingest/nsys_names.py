"""NVTX range names as the rest of tracekit expects them (Kineto conventions).

Three producers of NVTX ranges matter for training traces:

* ``torch.autograd.profiler.emit_nvtx`` writes every RecordFunction as
  ``"<name>[, seq = N][, op_id = K][, sizes = [[..], ..]][, input_op_ids = ...]"``.
  Ops (``aten::mm``, ``c10d::send``, ``autograd::engine::evaluate_function: MmBackward0``,
  custom autograd Functions) become ``cpu_op`` rows named by the op alone, ``seq`` in its
  column; ``record_function`` labels (``ProfilerStep#3``, ``PP:1F0``, ``gloo:recv``)
  become ``user_annotation`` rows.
* NCCL's own NVTX domain (``ncclSend``, ``ncclRecv``, ``ncclGroupStart``, ``ncclGroupEnd``,
  collectives): ``user_annotation`` rows named ``nccl:<call>``.
* Anything else (``record_function`` through ``nvtx.annotate``, Megatron's ranges, MPI):
  ``user_annotation`` rows with the name as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TypeGuard

# emit_nvtx's suffixes, in the order torch writes them (torch/csrc/profiler/util.cpp getNvtxStr)
_EMIT_NVTX = re.compile(
    r"^(?P<name>.*?)"
    r"(?:, seq = (?P<seq>-?\d+))?"
    r"(?:, op_id = (?P<op_id>\d+))?"
    r"(?:, sizes = (?P<sizes>\[.*?\]))?"
    r"(?:, input_op_ids = .*)?$",
    re.DOTALL,
)
# record_function labels that Kineto files under user_annotation
_ANNOTATION = re.compile(
    r"^(ProfilerStep#\d+|PP:|Optimizer\.|gloo:|nccl:|mpi:|ucc:|Forward \d|Backward \d|FSDP::|"
    r"DDP::|tracekit:|## )"
)
# names emit_nvtx gives ops that are neither "ns::op" nor autograd nodes
_BARE_OPS = {"detach", "detach_", "record_param_comms"}
_BACKWARD_NODE = re.compile(r"Backward\d*$")

NCCL_DOMAIN = "nccl"
_NCCL_CALL = re.compile(r"^nccl[A-Z]")
NCCL_P2P_CALLS = {"ncclSend", "ncclRecv"}
NCCL_GROUP_START, NCCL_GROUP_END = "ncclGroupStart", "ncclGroupEnd"


def split_emit_nvtx(text: str) -> tuple[str, int, bool]:
    """``(op name, seq or -1, whether the text carried emit_nvtx suffixes)``."""
    match = _EMIT_NVTX.match(text)
    if not match or not (match.group("seq") or match.group("op_id") or match.group("sizes")):
        return text, -1, False
    seq = int(match.group("seq")) if match.group("seq") else -1
    return match.group("name"), seq, True


def classify(text: str, domain: str) -> tuple[str, str, int]:
    """``(cat, name, seq)`` for one NVTX range in ``domain`` ("" = the default domain)."""
    if domain.lower() == NCCL_DOMAIN:
        return "user_annotation", f"nccl:{text}", -1
    name, seq, from_torch = split_emit_nvtx(text)
    if _ANNOTATION.match(name):
        return "user_annotation", name, seq
    if from_torch and (seq >= 0 or "::" in name or name in _BARE_OPS or _BACKWARD_NODE.search(name)):
        return "cpu_op", name, seq
    if not from_torch and "::" in name and " " not in name.split("::", 1)[0]:
        # old emit_nvtx (no op_id) wrote ops without suffixes: "aten::add"
        return "cpu_op", name, -1
    return "user_annotation", name, seq


def looks_like_nccl_domain(names: set[str]) -> bool:
    """NCCL's domain when the report lost its domain-create row (windowed exports)."""
    return bool(names) and all(_NCCL_CALL.match(n or "") for n in names)


def nccl_payload(json_text: str | None) -> tuple[int, int]:
    """``(peer, nbytes)`` from an NCCL range's exported payload (``--include-json``), else -1."""
    if not json_text:
        return -1, -1
    try:
        doc = json.loads(json_text)
    except (TypeError, ValueError, RecursionError):  # not JSON, or nested beyond any payload
        return -1, -1
    peer = nbytes = -1
    for key, value in _walk(doc):
        low = key.lower()
        if low.startswith("peer") and _count(value, 1 << 24):
            peer = int(value)
        elif low.startswith("message size") and _count(value, 1 << 60):
            nbytes = int(value)
    return peer, nbytes


def _count(value: object, limit: int) -> TypeGuard[int | float]:
    """A JSON number usable as a peer rank or a size (finite, 0 <= value < limit)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < limit


def _walk(doc: object) -> Iterator[tuple[str, object]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, (dict, list)):
                yield from _walk(value)
            else:
                yield str(key), value
    elif isinstance(doc, list):
        for item in doc:
            yield from _walk(item)


# ---- kernels and CUDA API names ---------------------------------------------------------
# Fallback only: a SendRecv-named kernel is a P2P candidate when its launch cannot be placed.
NCCL_P2P_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_(?:SendRecv|Send|Recv)\b|ncclKernel_SendRecv")
NCCL_P2P_NAME = "nccl:SendRecv"
_API_VERSION = re.compile(r"_v\d+$")

MEMCPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",
    12: "DtoH",
    13: "DtoD",
}


def api_name(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (Kineto's spelling)."""
    return _API_VERSION.sub("", name)


def memcpy_name(copy_kind: int) -> str:
    return f"Memcpy {MEMCPY_KINDS.get(int(copy_kind), 'Unknown')}"


# Ranks and world sizes of at most 7 digits: a longer number is no rank any job has.
_RANK_TEXT = re.compile(
    r"^(?:tracekit[:.]\s*)?rank\s*[=:]?\s*(\d{1,7})"
    r"(?:[\s,;/]+(?:world_size\s*[=:]?\s*)?(\d{1,7}))?\s*$",
    re.IGNORECASE,
)
_RANK_TOKEN = re.compile(r"(?:^|[\s,;(])(?:mpi\s+)?rank\s*[=:#]?\s*(\d{1,7})\b", re.IGNORECASE)


def rank_marker(text: str) -> tuple[int, int | None] | None:
    """A mark or thread name that states the rank: ``tracekit:rank=3 world_size=4``, ``MPI Rank 0``."""
    text = (text or "").strip()
    match = _RANK_TEXT.match(text)
    if match:
        return int(match.group(1)), (int(match.group(2)) if match.group(2) else None)
    if text.lower().startswith("mpi rank"):
        token = _RANK_TOKEN.search(text)
        if token:
            return int(token.group(1)), None
    return None


def rank_tokens(text: str) -> set[int]:
    """Every ``rank=N`` / ``rank N`` a range name mentions."""
    return {int(m.group(1)) for m in _RANK_TOKEN.finditer(text or "")}
