"""PyTorch profiler (Kineto) Chrome-trace JSON: ``.json`` and ``.json.gz``, one file per rank.

Reads only what the analysis needs from each complete (``ph: "X"``) event and turns it into
rows of the normalised event table (:mod:`tracekit.model.events`). Files are streamed in
bounded chunks and decoded into typed structs (:mod:`tracekit.ingest.kineto_stream`), so a
file larger than memory still loads. A truncated file (a profiler killed mid-write) yields
the events it holds, with a warning.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import orjson

if TYPE_CHECKING:  # pandas loads on first use: parser workers never import it
    import pandas as pd

from tracekit.errors import TraceFormatError
from tracekit.ingest.columns import EventColumns
from tracekit.ingest.kineto_stream import ChromeTraceStream, RawEvent, complete_elements
from tracekit.ingest.nesting import nesting_depth
from tracekit.ingest.validate import (
    DroppedRows, add_ns, drop_impossible, is_wall_clock, ns_from_us, ns_of_us, offset_fits, plural,
    valid_text,
)
from tracekit.model.events import TraceFile

# Categories kept; everything else (python_function, flows, instants) is dropped. CUDA API
# calls are kept as ``runtime`` (as Nsight Systems' are): a kernel's launch, joined on the
# ``correlation`` id, says on which host thread and when the host asked for it, so device
# work can be put in the step and the action that launched it.
KEPT_CATEGORIES = {
    "cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "runtime",
}
_CATEGORY_ALIASES = {"cuda_runtime": "runtime", "cuda_driver": "runtime"}
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
    if not isinstance(doc["traceEvents"], list):
        raise TraceFormatError(
            f"{path}: 'traceEvents' is {_json_kind(doc['traceEvents'])}, not a list of events; "
            "the file is damaged or not a PyTorch profiler trace: re-export it"
        )
    return doc, truncated


def _json_kind(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            dict: "an object"}.get(type(value), type(value).__name__)


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
    events = complete_elements(text, text.find("[", start) + 1)
    header: dict = {}
    head_text = text[:start].rstrip().rstrip(",") + "}"
    try:
        header = json.loads(head_text)
    except json.JSONDecodeError:
        header = {}
    except RecursionError:
        raise TraceFormatError(
            f"{path}: the fields before 'traceEvents' nest deeper than Python can read; no profiler "
            "writes such a header: the file is damaged or not a PyTorch profiler trace"
        ) from None
    if not isinstance(header, dict):
        header = {}
    header["traceEvents"] = events
    return header


def rank_from_name(path: Path) -> int | None:
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def parse_kineto(path: Path, file_id: int, rank_pattern: str | None = None,
                 progress: Callable[[int], None] | None = None) -> tuple[TraceFile, pd.DataFrame]:
    """Parse one Kineto trace file into its :class:`TraceFile` and event rows."""
    trace, columns = read_kineto(path, file_id, rank_pattern, progress)
    return trace, columns.to_frame()


def read_kineto(path: Path, file_id: int, rank_pattern: str | None = None,
                progress: Callable[[int], None] | None = None) -> tuple[TraceFile, EventColumns]:
    """Parse one Kineto trace file into its :class:`TraceFile` and typed event columns.

    The file is streamed (see :mod:`tracekit.ingest.kineto_stream`): memory holds one chunk
    of it plus the rows kept so far. ``progress`` is called with each count of file bytes read.
    """
    if rank_pattern:
        _decide_rank(path, {}, rank_pattern)  # a pattern that cannot match fails before reading
    stream = ChromeTraceStream(path, progress=progress, whole_document=read_json_document)
    rows = _RowBuilder()
    for batch in stream:
        rows.add(batch)
    doc = stream.header
    trace = TraceFile(path=path, format="kineto", rank=-1, truncated=stream.truncated)
    if stream.truncated and not stream.n_elements:
        # Nothing salvageable: analysing the run without this rank's events would read it as
        # a rank that did nothing (or a smaller pipeline), a wrong answer rather than a warning.
        raise TraceFormatError(
            f"{path}: damaged before its first complete event (not a whole JSON trace, nothing "
            "to salvage); copy the file again or re-export it from the profiler"
        )
    if stream.truncated:
        trace.warnings.append(
            f"{path.name}: the file ends early or is damaged (profiler stopped mid-write?); "
            f"read the {stream.n_elements} complete events before that point; re-export the trace "
            "if you need the rest"
        )
    if stream.n_elements and not rows.n_rows and "schemaVersion" not in doc:
        # A rank that recorded nothing still writes Kineto's header; this file has neither.
        raise TraceFormatError(
            f"{path}: {stream.n_elements:,} events but none tracekit reads ({rows.why_none()}); "
            f"tracekit reads {_WHAT_WE_READ}"
        )
    if stream.unknown_phases:
        shown = ", ".join(f"{what} x{n:,}" for what, n in stream.unknown_phases.most_common(4))
        trace.warnings.append(
            f"{path.name}: skipped {plural(sum(stream.unknown_phases.values()), 'event')} of no "
            f"Chrome-trace phase ({shown}); read the rest"
        )
    info = doc.get("distributedInfo") or {}
    if not isinstance(info, dict):
        trace.warnings.append(f"{path.name}: distributedInfo is not an object; ignored it")
        info = {}
    trace.rank, trace.rank_source = _decide_rank(path, info, rank_pattern, trace.warnings)
    trace.ranks = [trace.rank]
    trace.world_size = _header_count(path, info, "world_size", 1, trace.warnings)
    trace.backend = _header_text(info.get("backend"))
    trace.host = _header_text(doc.get("host_name"))
    trace.profiler = {
        k: doc[k] for k in ("schemaVersion", "trace_id", "record_shapes", "displayTimeUnit")
        if k in doc
    }
    if info.get("nccl_version"):
        trace.profiler["nccl_version"] = info["nccl_version"]
    base_ns, trace.clock = _time_base(path, doc, rows.first_x_ts, trace.warnings)
    if trace.clock == "relative":
        trace.warnings.append(
            f"{path.name}: no baseTimeNanoseconds and timestamps are not epoch times; they are "
            "aligned across ranks only if all ranks share this file's origin"
        )
    trace.n_events_raw = stream.n_elements
    columns = rows.columns(base_ns, _group_rank_maps(path, info, trace.warnings), trace.rank, file_id)
    if rows.dropped.total and not len(columns):
        raise TraceFormatError(
            f"{path}: none of its {rows.dropped.of_rows:,} events tracekit reads can be real "
            f"({rows.dropped.reasons()}); the file is damaged: re-export the trace"
        )
    dropped = rows.dropped.warning(path.name)
    if dropped:
        trace.warnings.append(dropped)
    if rows.odd_identities:
        trace.warnings.append(f"{path.name}: {plural(rows.odd_identities, 'event')} with a name that is not text "
                              "or a pid/tid that is no integer (a number beyond int64, a float, an object); "
                              "read them with their value's text as name or id")
    return trace, columns


_WHAT_WE_READ = "PyTorch profiler (Kineto) traces and Nsight Systems SQLite exports"
# More ranks than any job has run: a larger rank or world size in a header is damage.
_MAX_RANKS = 1 << 24


def _header_count(path: Path, info: dict, key: str, least: int, warnings: list[str]) -> int | None:
    """An integer of ``distributedInfo`` (``world_size``, ``rank``): a number written as
    text is read as one; a value of another type is ignored with a warning; a number no
    job can have is a damaged header (one line)."""
    value = info.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal():
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)  # orjson reads an integer beyond 64 bits as a float
    if type(value) is not int:
        warnings.append(f"{path.name}: distributedInfo.{key} is {_shown(value)}, not a number; ignored it")
        return None
    if not least <= value < _MAX_RANKS:
        raise TraceFormatError(
            f"{path}: distributedInfo.{key} is {value}, which no job can have; the file's header is "
            "damaged: re-export the trace"
        )
    return value


def _shown(value) -> str:
    text = valid_text(repr(value))
    return text if len(text) <= 40 else text[:40] + "..."


def _header_text(value) -> str | None:
    """A header string (host name, backend) as text every writer can encode; None if absent
    or not a string."""
    return valid_text(value) if isinstance(value, str) else None


_NUMBER = (int, float)
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_SPECIAL_OPS = sorted(_P2P_CPU_OPS | {"record_param_comms"})
# Below this, an integer ts in microseconds times 1000 is exact in a float64.
_EXACT_FLOAT_US = 2.0 ** 53 / 1000


def _special_args(name: str, args) -> dict:
    """The args a P2P or collective op's fields come from (NCCL's need no shape lists)."""
    if args is None:
        return {}
    return args.to_dict(shapes=name != "record_param_comms")


class _Irregular(Exception):
    """A batch with values the column-wise path does not handle (odd types)."""


def _numbers(values: list) -> np.ndarray:
    """``ts`` or ``dur`` values as an int64 or float64 array; irregular unless all are
    numbers and converting them to float loses nothing the exact path would keep."""
    try:
        arr = np.array(values)
    except (ValueError, OverflowError):  # ragged lists, ints of no numpy type
        raise _Irregular from None
    kind = arr.dtype.kind
    if kind == "b":
        return arr.astype(np.int64)
    if kind == "i" and arr.ndim == 1:
        return arr  # values beyond int64 ns become NOT_A_TIME in ns_from_us
    if kind == "f" and arr.ndim == 1:
        if len(arr) and np.abs(arr).max() >= _EXACT_FLOAT_US and any(type(v) is not float for v in values):
            raise _Irregular  # big integers mixed with floats: float math would round them
        return arr
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    raise _Irregular  # a missing or non-numeric value: that event is skipped, event by event


def _int_array(values: list) -> np.ndarray | None:
    """``values`` as an int64 array when they are all plain ints that fit, else None."""
    try:
        arr = np.array(values)
    except (ValueError, OverflowError):  # ragged lists, ints of no numpy type
        return None
    if arr.dtype.kind == "i" and arr.ndim == 1:
        return arr.astype(np.int64)
    return None


def _ints_or_minus_one(values: list) -> np.ndarray:
    arr = _int_array(values)
    if arr is not None:
        return arr
    return np.array([_int64_or_minus_one(v) for v in values], dtype=np.int64)


def _int64_or_minus_one(value) -> int:
    return value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX else -1


# The cat code of a category that is not text (true, 2, []): dropped like an unknown one, counted.
_CAT_NOT_TEXT = -2


def _normal_category(cat) -> str | None:
    text = str(cat).lower()
    text = _CATEGORY_ALIASES.get(text, text)
    return text if text in KEPT_CATEGORIES else None


class _RowBuilder:
    """Accumulates the kept events of a stream as typed arrays (~60 bytes a row), batch by
    batch, so a file's rows cost far less than its decoded events would."""

    _CATS = sorted(KEPT_CATEGORIES)

    def __init__(self) -> None:
        self.n_elements = 0                 # elements of traceEvents seen so far
        self.first_x_ts = None              # ts of the first complete event (time base probe)
        self.name_codes: dict[str, int] = {}
        self.cat_codes = {c: i for i, c in enumerate(self._CATS)}
        self.cat_of: dict = {}              # raw cat value -> normalised cat (None: dropped)
        self.cat_code_of: dict = {}         # raw cat value -> cat code (-1: dropped)
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.n_rows = 0
        self.special: list[tuple[int, str, dict]] = []   # (row, name, args) of P2P/comm ops
        self.dropped = DroppedRows()        # rows that cannot be real (see columns())
        self.n_complete = 0                 # complete ("X") events seen, kept or not
        self.bad_categories = 0             # complete events whose cat is no text (true, 2, [])
        self.odd_identities = 0             # kept events whose name is no text or pid/tid no int or label

    def add(self, batch: list) -> None:
        """Keep the rows of one batch of events."""
        try:
            self._add_columns(batch)
        except _Irregular:
            self._add_each(batch)
        self.n_elements += len(batch)

    def _add_columns(self, batch: list) -> None:
        """The fast way: one pass per field, numbers converted by numpy. Raises
        :class:`_Irregular` (having changed nothing that matters) on anything unusual, for
        :meth:`_add_each` to handle event by event."""
        base = self.n_elements
        xi = [i for i, e in enumerate(batch) if type(e) is RawEvent]
        xs = [batch[i] for i in xi]
        cat_of = self.cat_code_of
        raw_cats = [e.cat for e in xs]
        try:
            codes = [cat_of[c] for c in raw_cats]
        except KeyError:
            try:
                new_cats = set(raw_cats)
            except TypeError:  # an unhashable cat (list, dict)
                raise _Irregular from None
            for c in new_cats:
                if c not in cat_of:
                    cat = _normal_category(c)
                    cat_of[c] = (_CAT_NOT_TEXT if type(c) is not str else
                                 -1 if cat is None else self.cat_codes[cat])
            codes = [cat_of[c] for c in raw_cats]
        except TypeError:
            raise _Irregular from None
        rows = [k for k, c in enumerate(codes) if c >= 0]
        kept = [xs[k] for k in rows]
        starts = ns_from_us(_numbers([e.ts for e in kept]))
        durs = ns_from_us(_numbers([e.dur for e in kept]))
        names = [e.name for e in kept]
        name_codes = self.name_codes
        try:
            name_idx = [name_codes[n] for n in names]
        except KeyError:
            try:
                new_names = set(names)
            except TypeError:  # an unhashable name (list, dict)
                raise _Irregular from None
            for n in new_names:
                if n not in name_codes:
                    if type(n) is not str:
                        raise _Irregular from None
                    name_codes[n] = len(name_codes)
            name_idx = [name_codes[n] for n in names]
        except TypeError:
            raise _Irregular from None
        args = [e.args for e in kept]
        seqs = _ints_or_minus_one([-1 if a is None else a.sequence for a in args])
        corrs = _ints_or_minus_one([
            -1 if a is None else (a.external_id if a.correlation == -1 else a.correlation) for a in args])
        pids = self._ids([e.pid for e in kept])
        tids = self._ids([e.tid for e in kept])
        self.bad_categories += codes.count(_CAT_NOT_TEXT)  # nothing raises _Irregular past here
        if self.first_x_ts is None and base < 200:
            for i in xi:
                if base + i >= 200:
                    break
                if isinstance(batch[i].ts, _NUMBER):
                    self.first_x_ts = batch[i].ts
                    break
        self.n_complete += len(xs)
        if not kept:
            return
        cat_arr = np.array([codes[k] for k in rows], dtype=np.int8)
        name_arr = np.array(name_idx, dtype=np.int32)
        special = [name_codes[n] for n in _SPECIAL_OPS if n in name_codes]
        if special:
            hits = np.flatnonzero(np.isin(name_arr, special) & (cat_arr == self.cat_codes["cpu_op"]))
            for k in hits:
                a, name = args[k], names[k]
                self.special.append((self.n_rows + int(k), name, _special_args(name, a)))
        self.parts.append((
            np.array([base + xi[k] for k in rows], dtype=np.int64), cat_arr, name_arr,
            starts, durs, pids, tids, seqs, corrs,
        ))
        self.n_rows += len(kept)

    def _ids(self, values: list) -> np.ndarray:
        """pids or tids as int64; odd ones (a float, a number beyond int64, an object) counted."""
        arr = _int_array(values)
        if arr is not None:
            return arr
        self.odd_identities += sum(1 for v in values if not _plain_id(v))
        return np.array([_as_int(v) for v in values], dtype=np.int64)

    def _add_each(self, batch: list) -> None:
        """The general way, event by event: any JSON types, exactly as the format allows."""
        src, cats, names, starts, durs, pids, tids, seqs, corrs = ([] for _ in range(9))
        cat_of, name_codes, cat_codes = self.cat_of, self.name_codes, self.cat_codes
        base = self.n_elements
        probing = self.first_x_ts is None and base < 200
        for offset, event in enumerate(batch):
            if type(event) is not RawEvent:
                continue
            self.n_complete += 1
            ts = event.ts
            if probing and isinstance(ts, _NUMBER) and base + offset < 200:
                self.first_x_ts, probing = ts, False
            raw_cat = event.cat
            if type(raw_cat) is not str:
                self.bad_categories += 1
            try:
                cat = cat_of[raw_cat]
            except KeyError:
                cat = cat_of[raw_cat] = _normal_category(raw_cat)
            except TypeError:  # an unhashable cat (list, dict): never a kept one
                cat = _normal_category(raw_cat)
            if cat is None:
                continue
            dur = event.dur
            # A time that is no number (absent, a list, an object) is kept as "not a time":
            # the validation step drops the row and counts it in the file's warning.
            if not isinstance(ts, _NUMBER):
                ts = math.nan
            if not isinstance(dur, _NUMBER):
                dur = math.nan
            name = event.name
            if type(name) is not str or not _plain_id(event.pid) or not _plain_id(event.tid):
                self.odd_identities += 1
            if type(name) is not str:
                name = str(name)
            args = event.args
            if cat == "cpu_op" and (name in _P2P_CPU_OPS or name == "record_param_comms"):
                self.special.append((self.n_rows + len(src), name, _special_args(name, args)))
            if args is None:
                seq = corr = -1
            else:
                seq = _int64_or_minus_one(args.sequence)
                corr = _int64_or_minus_one(args.external_id if args.correlation == -1 else args.correlation)
            code = name_codes.get(name)
            if code is None:
                code = name_codes[name] = len(name_codes)
            src.append(base + offset)
            cats.append(cat_codes[cat])
            names.append(code)
            starts.append(ns_of_us(ts))
            durs.append(ns_of_us(dur))
            pids.append(_as_int(event.pid))
            tids.append(_as_int(event.tid))
            seqs.append(seq)
            corrs.append(corr)
        if src:
            self.parts.append((
                np.array(src, dtype=np.int64), np.array(cats, dtype=np.int8),
                np.array(names, dtype=np.int32), np.array(starts, dtype=np.int64),
                np.array(durs, dtype=np.int64), np.array(pids, dtype=np.int64),
                np.array(tids, dtype=np.int64), np.array(seqs, dtype=np.int64),
                np.array(corrs, dtype=np.int64),
            ))
            self.n_rows += len(src)

    def why_none(self) -> str:
        """Why no event was kept, for a file that has events."""
        if not self.n_complete:
            return "no complete ('ph': 'X') events: not a profiler timeline?"
        seen = {str(c) for c in list(self.cat_of) + list(self.cat_code_of)}
        if seen <= {""}:
            return "no 'cat' field: a Chrome trace not written by the PyTorch profiler?"
        shown = ", ".join(sorted(valid_text(c)[:30] for c in seen if c)[:5])
        return f"categories {shown}; none is one tracekit reads"

    def columns(self, base_ns: int, group_to_global: dict[str, list[int]], rank: int,
                file_id: int) -> EventColumns:
        """The rows as event columns: times made absolute, P2P fields filled in, depth found."""
        if self.parts:
            src, cats, names, starts, durs, pids, tids, seqs, corrs = (
                np.concatenate(col) for col in zip(*self.parts))
        else:
            src, starts, durs, pids, tids, seqs, corrs = (np.zeros(0, np.int64) for _ in range(7))
            cats, names = np.zeros(0, np.int8), np.zeros(0, np.int32)
        self.parts = []
        n = len(src)
        peer = np.full(n, -1, dtype=np.int64)
        tag = np.full(n, -1, dtype=np.int64)
        nbytes = np.full(n, -1, dtype=np.int64)
        default_group = group_to_global.get("0")
        name_list = list(self.name_codes)
        for row, name, args in self.special:
            if name == "record_param_comms":
                new_name, peer[row], nbytes[row] = _nccl_comm_args(args, group_to_global)
                code = self.name_codes.get(new_name)
                if code is None:
                    code = self.name_codes[new_name] = len(name_list)
                    name_list.append(new_name)
                names[row] = code
            else:
                peer[row], tag[row], nbytes[row] = _gloo_p2p_args(args, default_group)
        start_ns = add_ns(starts, base_ns)
        end_ns = add_ns(start_ns, durs)
        keep, self.dropped = drop_impossible(start_ns, end_ns,
                                             [pids, tids, cats, names, seqs, corrs, peer, tag, nbytes])
        if self.bad_categories:  # never rows: skipped at decoding, counted here
            self.dropped.counts["category_not_text"] = self.bad_categories
            self.dropped.of_rows += self.bad_categories
        if keep is not None:
            src, cats, names, start_ns, end_ns, pids, tids, seqs, corrs, peer, tag, nbytes = (
                col[keep] for col in (src, cats, names, start_ns, end_ns, pids, tids, seqs, corrs,
                                      peer, tag, nbytes))
            n = len(src)
        name_list = [valid_text(name) for name in name_list]
        async_codes = [self.name_codes[s] for s in ASYNC_SPANS if s in self.name_codes]
        depth = nesting_depth(pids, tids, start_ns, end_ns, transparent=np.isin(names, async_codes))
        numbers = {
            "rank": np.full(n, rank, dtype=np.int32),
            "file_id": np.full(n, file_id, dtype=np.int32),
            "source_index": src,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "pid": pids,
            "tid": tids,
            "on_gpu": np.isin(cats, [self.cat_codes[c] for c in _GPU_CATEGORIES]),
            "depth": depth,
            "seq": seqs,
            "peer": peer,
            "tag": tag,
            "nbytes": nbytes,
            "correlation": corrs,
        }
        return EventColumns(numbers, {"cat": cats.astype(np.int32), "name": names},
                            {"cat": list(self._CATS), "name": name_list})


# Older Kineto wrote epoch microseconds in ``ts`` and no base; ~1e15 us is year 2001.
_EPOCH_US_FLOOR = 9.0e14


def _time_base(path: Path, doc: dict, first_x_ts, warnings: list[str]) -> tuple[int, str]:
    """The ns to add to ``ts * 1000``, and whether the result is Unix time."""
    base_ns = doc.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) and base_ns > 0:
        if math.isfinite(base_ns) and offset_fits(int(base_ns)) and is_wall_clock(int(base_ns)):
            return int(base_ns), "unix"
        warnings.append(f"{path.name}: baseTimeNanoseconds {_shown(base_ns)} is no wall-clock time "
                        "(not 2000-2100); ignored it")
    if isinstance(first_x_ts, _NUMBER) and math.isfinite(first_x_ts):
        return 0, ("unix" if first_x_ts > _EPOCH_US_FLOOR else "relative")
    return 0, "relative"


def _decide_rank(path: Path, info: dict, rank_pattern: str | None,
                 warnings: list[str] | None = None) -> tuple[int, str]:
    if rank_pattern:
        match = re.search(rank_pattern, path.name)
        if not match or not match.groups():
            raise TraceFormatError(
                f"{path}: --rank-from pattern {rank_pattern!r} does not match this file name "
                "with a group; give a regex like 'rank(\\d+)'"
            )
        if not (match.group(1) or "").isdecimal():
            raise TraceFormatError(f"{path}: --rank-from pattern {rank_pattern!r} matches {match.group(1)!r} "
                                   "here, not a rank number; make its group match digits only")
        return int(match.group(1)), "--rank-from"
    stated = _header_count(path, info, "rank", 0, [] if warnings is None else warnings)
    if stated is not None:
        return stated, "distributedInfo"
    from_name = rank_from_name(path)
    if from_name is not None:
        return from_name, "file name"
    return -1, "unknown"


def _group_rank_maps(path: Path, info: dict, warnings: list[str]) -> dict[str, list[int]]:
    """Process group name -> its global ranks, from ``distributedInfo.pg_config``; entries
    that are not a group with a list of ranks are ignored (with one warning)."""
    groups = info.get("pg_config") or []
    if not isinstance(groups, list):
        warnings.append(f"{path.name}: distributedInfo.pg_config is not a list; ignored it")
        return {}
    maps = {}
    ignored = 0
    for pg in groups:
        ranks = pg.get("ranks") if isinstance(pg, dict) else None
        if isinstance(ranks, list) and all(type(r) is int and 0 <= r < _MAX_RANKS for r in ranks):
            maps[valid_text(str(pg.get("pg_name")))] = ranks
        elif not (isinstance(pg, dict) and ranks is None):
            ignored += 1
    if ignored:
        warnings.append(f"{path.name}: ignored {ignored} entries of distributedInfo.pg_config that are "
                        "not a process group with a list of ranks")
    return maps


def _plain_id(value) -> bool:
    """A pid or tid as profilers write them: an int64, or a label such as "stream 7"."""
    return isinstance(value, str) or (type(value) is int and _INT64_MIN <= value <= _INT64_MAX)


def _as_int(value) -> int:
    """Kineto pids/tids are usually ints, but some exporters write labels ("stream 7").
    Anything else (a list, a number beyond int64) gets an id of its own from its text."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and abs(value) < 2.0 ** 63:
        return int(value)
    if isinstance(value, str):
        digits = re.search(r"-?\d+", value)
        if digits and _INT64_MIN <= int(digits.group(0)) <= _INT64_MAX:
            return int(digits.group(0))
    text = valid_text(str(value))
    return -(zlib.crc32(text.encode()) & 0x7FFFFFFF)


def _gloo_p2p_args(args: dict, default_group: list[int] | None) -> tuple[int, int, int]:
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
            str(dtype).replace("TensorList", "").strip() or "float", 4)
    elif dims and isinstance(dims[0], list):
        dtype = types[0] if types else "float"
        nbytes = _elements(dims[0]) * _DTYPE_BYTES.get(str(dtype), 4)
    return peer, tag, (nbytes if 0 <= nbytes < _MAX_BYTES else -1)


# A message larger than this (an exabyte) is a damaged shape, not a tensor.
_MAX_BYTES = 1 << 60


def _elements(shape: list) -> int:
    """Elements of a tensor shape; a huge number where a dimension is not a size."""
    count = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return _MAX_BYTES
        count *= dim
    return min(count, _MAX_BYTES)


def _nccl_comm_args(args: dict, group_to_global: dict[str, list[int]]) -> tuple[str, int, int]:
    """NCCL's record_param_comms: name it by collective, find the P2P peer where given."""
    collective = valid_text(str(args.get("Collective name", "unknown")))
    name = f"record_param_comms:{collective}"
    peer = -1
    if collective == "send":
        peer = _int_or(args.get("Dst Rank"), -1)
    elif collective in ("recv", "recv_"):
        peer = _int_or(args.get("Src Rank"), -1)
    nelems = _int_or(args.get("In msg nelems") if collective == "send" else args.get("Out msg nelems"), -1,
                     limit=_MAX_BYTES // 8)
    dtype = str(args.get("dtype", "Float"))
    nbytes = nelems * _DTYPE_BYTES.get(dtype, 4) if nelems >= 0 else -1
    return name, peer, nbytes


def _int_or(value, default: int, limit: int = 2 ** 31) -> int:
    """``value`` as an int in ``[-limit, limit)`` (peers and tags are int32), else ``default``."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -limit <= number < limit else default
