"""The peer, tag and size of a communication op, from its Kineto ``args``: gloo's ``c10d::send`` /
``c10d::recv_`` (their ``Concrete Inputs`` and shapes, with ``record_shapes=True``) and NCCL's
``record_param_comms``."""

from __future__ import annotations

from typing import Any

from tracekit.ingest.validate import valid_text

_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "c10::Half": 2,
    "half": 2,
    "float16": 2,
    "c10::BFloat16": 2,
    "bfloat16": 2,
    "long int": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
}


def _gloo_p2p_args(args: dict[str, Any], default_group: list[int] | None) -> tuple[int, int, int]:
    """Peer, tag and size of a c10d::send / c10d::recv_ (present with record_shapes=True)."""
    concrete = args.get("Concrete Inputs") or []
    peer = tag = nbytes = -1
    if isinstance(concrete, list) and len(concrete) > 3:
        peer = _int_or(concrete[2], -1)
        tag = _int_or(concrete[3], -1)
        if peer >= 0 and default_group and peer < len(default_group):
            peer = int(default_group[peer])
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    if not isinstance(dims, list) or not isinstance(types, list):
        return peer, tag, nbytes
    if dims and isinstance(dims[0], list) and dims[0] and isinstance(dims[0][0], list):
        # send/recv_ take a list of tensors: dims[0] is a list of shapes
        shapes = dims[0]
        dtype = types[0] if types else "float"
        nbytes = sum(_elements(s) for s in shapes if isinstance(s, list)) * _DTYPE_BYTES.get(
            str(dtype).replace("TensorList", "").strip() or "float", 4
        )
    elif dims and isinstance(dims[0], list):
        dtype = types[0] if types else "float"
        nbytes = _elements(dims[0]) * _DTYPE_BYTES.get(str(dtype), 4)
    return peer, tag, (nbytes if 0 <= nbytes < _MAX_BYTES else -1)


# A message larger than this (an exabyte) is a damaged shape, not a tensor.
_MAX_BYTES = 1 << 60


def _elements(shape: list[Any]) -> int:
    """Elements of a tensor shape; a huge number where a dimension is not a size."""
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return _MAX_BYTES
        count *= dim
    return min(count, _MAX_BYTES)


def _nccl_comm_args(args: dict[str, Any], group_to_global: dict[str, list[int]]) -> tuple[str, int, int, int]:
    """NCCL's record_param_comms: name it by collective, find the P2P peer where given, and
    its size; for a collective, the stride of its group's ranks (-1: not given or not
    strided), which tells a tensor-parallel group from a data-parallel one."""
    collective = valid_text(str(args.get("Collective name", "unknown")))
    name = f"record_param_comms:{collective}"
    peer = -1
    if collective == "send":
        peer = _int_or(args.get("Dst Rank"), -1)
    elif collective in ("recv", "recv_"):
        peer = _int_or(args.get("Src Rank"), -1)
    # The peer is a rank of the op's process group; torch writes the group's ranks as start +
    # i * stride where they are evenly spaced (ParamCommsUtils' globalRankStart/Stride; -1:
    # not). Without pg_config (which the peer resolver reads) that maps it to the job's rank.
    start, stride = _int_or(args.get("Global rank start"), -1), _int_or(args.get("Global rank stride"), -1)
    if peer >= 0 and start >= 0 and stride > 0 and not group_to_global:
        peer = start + peer * stride
    group_stride = stride if stride > 0 and collective not in ("send", "recv", "recv_") else -1
    nelems = _int_or(
        args.get("In msg nelems") if collective == "send" else args.get("Out msg nelems"), -1, limit=_MAX_BYTES // 8
    )
    dtype = str(args.get("dtype", "Float"))
    nbytes = nelems * _DTYPE_BYTES.get(dtype, 4) if nelems >= 0 else -1
    return name, peer, nbytes, group_stride


def _int_or(value: Any, default: int, limit: int = 2**31) -> int:
    """``value`` as an int in ``[-limit, limit)`` (peers and tags are int32), else ``default``."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -limit <= number < limit else default
