"""The normalised event table of a Kineto trace, built batch by batch as the stream is decoded:
which categories are kept, typed arrays per batch (:class:`_RowBuilder`), and the columns
(absolute times, P2P fields, nesting depth) once the file is read. Runs the native scanner read
(:mod:`tracekit.ingest.kineto_native`) arrive as those typed arrays already."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator
from itertools import compress
from typing import Any

import msgspec
import numpy as np
from numpy.typing import ArrayLike

from tracekit.ingest import kineto_native
from tracekit.ingest.columns import EventColumns
from tracekit.ingest.kineto_native import ScannedRun
from tracekit.ingest.kineto_stream import BEGIN_END, NOT_COMPLETE, RawEvent, decode_element, decode_shapes
from tracekit.ingest.nesting import nesting_depth
from tracekit.ingest.validate import _LIMIT_US, DroppedRows, add_ns, drop_impossible, ns_from_us, ns_of_us, valid_text
from tracekit.ingest.kineto_comm import _gloo_p2p_args, _nccl_comm_args
from tracekit.model.names import FRAME_CATEGORY, KEPT_FRAME_ENDINGS, is_kept_frame

# Categories kept; everything else (flows, instants) is dropped. CUDA API calls are kept as
# ``runtime`` (as Nsight Systems' are), and so are HIP's, which Kineto files under
# ``cuda_runtime`` too: a kernel's launch, joined on the ``correlation`` id, says on which
# host thread and when the host asked for it, so device work can be put in the step and the
# action that launched it. Of python_function events (with_stack) only the frames of
# frameworks' action entry points, which name actions, and of nn.Module calls, which name
# the model's layers (model.names.is_kept_frame).
KEPT_CATEGORIES = {
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "runtime",
    FRAME_CATEGORY,
}
_CATEGORY_ALIASES = {"cuda_runtime": "runtime", "cuda_driver": "runtime"}
# Annotations that span from posting a message to its wait's return, across other ops.
ASYNC_SPANS = ("gloo:send", "gloo:recv")
_GPU_CATEGORIES = {"gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset"}
_P2P_CPU_OPS = {"c10d::send", "c10d::recv_", "c10d::recv_any_source_"}


_NUMBER = (int, float)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SPECIAL_OPS = sorted(_P2P_CPU_OPS | {"record_param_comms"})
# Below this, an integer ts in microseconds times 1000 is exact in a float64.
_EXACT_FLOAT_US = 2.0**53 / 1000


# The args of NCCL's record_param_comms that give its name, peer and size (_nccl_comm_args),
# in the order _special_args reads them.
_NCCL_ARGS = (
    "Collective name",
    "Dst Rank",
    "Src Rank",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Global rank start",
    "Global rank stride",
)
# Exact types (no bool, no float) of which equal values are the same value; UNSET: absent.
_PLAIN_TYPES = {str, int, type(msgspec.UNSET)}


def _special_args(name: str, args: Any) -> dict[str, Any] | tuple[Any, ...]:
    """The args a P2P or collective op's fields come from, in a form :meth:`_RowBuilder.columns`
    works out once per distinct value (a rank repeats a few peers, tags, shapes and sizes
    thousands of times): a gloo send/recv's raw shape and type lists (:meth:`RawArgs.shapes`),
    a record_param_comms's fields as a tuple when they are all text, ints or absent (of
    exactly these types, equal tuples are the same values: no 1 == 1.0 == True), else their
    dict (NCCL's need no shape lists)."""
    if args is None:
        return {}
    if name != "record_param_comms":
        shapes: tuple[Any, ...] = args.shapes()
        return shapes
    fields = (
        args.collective,
        args.dst_rank,
        args.src_rank,
        args.in_nelems,
        args.out_nelems,
        args.dtype,
        args.rank_start,
        args.rank_stride,
    )
    if set(map(type, fields)) <= _PLAIN_TYPES:
        return fields
    fields_dict: dict[str, Any] = args.to_dict()
    return fields_dict


def _nccl_args(fields: tuple[Any, ...]) -> dict[str, Any]:
    """The args dict of record_param_comms fields given as a tuple by :func:`_special_args`."""
    return {key: v for key, v in zip(_NCCL_ARGS, fields) if v is not msgspec.UNSET}


class _Irregular(Exception):
    """A batch with values the column-wise path does not handle (odd types)."""


def _numbers(values: list[Any]) -> np.ndarray:
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


def _ns(values: list[Any]) -> np.ndarray:
    """``ts`` or ``dur`` values in microseconds as int64 ns, as ``ns_from_us(_numbers(values))``
    gives them; floats well inside the exact range (what profilers write) in one pass."""
    try:
        arr = np.array(values)
    except (ValueError, OverflowError):  # ragged lists, ints of no numpy type
        raise _Irregular from None
    kind = arr.dtype.kind
    if kind == "f" and arr.ndim == 1 and len(arr):
        # A NaN fails the comparisons. Below 2**53 / 1000 us every float fits and converts
        # exactly; up to the int64 limit too when every value is a float (epoch times): no int
        # of more than 53 bits was rounded into the array.
        top = np.abs(arr).max()
        if top < _EXACT_FLOAT_US or (top < _LIMIT_US and list(map(type, values)).count(float) == len(values)):
            return np.rint(arr * 1000.0).astype(np.int64)
    if kind == "i" and arr.ndim == 1:
        return ns_from_us(arr)  # what _numbers gives for ints
    return ns_from_us(_numbers(values))


def _int_array(values: list[Any]) -> np.ndarray | None:
    """``values`` as an int64 array when they are all plain ints that fit, else None."""
    try:
        arr = np.array(values)
    except (ValueError, OverflowError):  # ragged lists, ints of no numpy type
        return None
    if arr.dtype.kind == "i" and arr.ndim == 1:
        return arr.astype(np.int64, copy=False)
    return None


def _ints_or_minus_one(values: list[Any]) -> np.ndarray:
    arr = _int_array(values)
    if arr is not None:
        return arr
    return np.array([_int64_or_minus_one(v) for v in values], dtype=np.int64)


def _int64_or_minus_one(value: object) -> int:
    return value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX else -1


# The cat code of a category that is not text (true, 2, []): dropped like an unknown one, counted.
_CAT_NOT_TEXT = -2
# The cat code of an element that is no complete event (another phase): not counted at all.
_NOT_COMPLETE_CODE = -3
_BEGIN_END_CODE = -4
# The cat code of a python_function event: kept, as FRAME_CATEGORY, where its name is that of
# an action frame (_RowBuilder.keeps_frame), else dropped.
_FRAME_CODE = -5


def _normal_category(cat: object) -> str | None:
    text = str(cat).lower()
    text = _CATEGORY_ALIASES.get(text, text)
    return text if text in KEPT_CATEGORIES else None


class _RowBuilder:
    """Accumulates the kept events of a stream as typed arrays (~60 bytes a row), batch by
    batch, so a file's rows cost far less than its decoded events would."""

    _CATS = sorted(KEPT_CATEGORIES)

    def __init__(self) -> None:
        self.n_elements = 0  # elements of traceEvents seen so far
        self.first_x_ts: int | float | None = None  # ts of the first complete event (time base probe)
        self.name_codes: dict[str, int] = {}
        self.cat_codes = {c: i for i, c in enumerate(self._CATS)}
        self.cat_of: dict[Any, Any] = {}  # raw cat value -> normalised cat (None: dropped)
        # raw cat value -> cat code (< 0: dropped)
        self.cat_code_of: dict[Any, Any] = {NOT_COMPLETE: _NOT_COMPLETE_CODE, BEGIN_END: _BEGIN_END_CODE}
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.n_rows = 0
        # The P2P and collective ops whose args columns() reads, by kind: each distinct (name,
        # args) once (a rank repeats a few peers, tags and sizes thousands of times; args that
        # are a dict are each their own kind), and the rows of each batch with their kinds.
        self.special_keys: list[tuple[str, dict[str, Any] | tuple[Any, ...]]] = []  # (name, args) of each kind
        self.special_ids: dict[tuple[Any, ...], int] = {}  # (name, args) -> its kind, where args is a tuple
        self.special_rows: list[np.ndarray] = []
        self.special_kinds: list[np.ndarray] = []
        self.dropped = DroppedRows()  # rows that cannot be real (see columns())
        self.n_complete = 0  # complete ("X") events seen, kept or not
        self.n_begin_end = 0  # duration events ("B" / "E") seen, not read
        self.bad_categories = 0  # complete events whose cat is no text (true, 2, [])
        self.odd_identities = 0  # kept events whose name is no text or pid/tid no int or label
        self.frame_names: dict[str, bool] = {}  # python_function name -> kept (keeps_frame)

    def native_scanner(self) -> kineto_native.Scanner | None:
        """A native scanner reading runs of elements into this builder's codes, or None (not
        built, or turned off by ``TRACEKIT_NATIVE=0``)."""
        if not kineto_native.enabled():
            return None
        return kineto_native.Scanner(
            self.cat_code_of,
            self._cat_code,
            self.name_codes,
            self.cat_codes["cpu_op"],
            _SPECIAL_OPS,
            self.special_ids,
            self.special_keys,
            _FRAME_CODE,
            self.cat_codes[FRAME_CATEGORY],
            self.keeps_frame,
            KEPT_FRAME_ENDINGS,
        )

    def keeps_frame(self, name: object) -> bool:
        """Whether a python_function event named ``name`` is kept: an action frame's or a
        module frame's name (a name that is no text is none), worked out once per name."""
        if type(name) is not str:
            return False
        kept = self.frame_names.get(name)
        if kept is None:
            kept = self.frame_names[name] = is_kept_frame(name)
        return kept

    def add(self, batch: list[Any] | ScannedRun) -> None:
        """Keep the rows of one batch of events (or of a run the native scanner read)."""
        if type(batch) is ScannedRun:
            self._add_scanned(batch)
            self.n_elements += batch.n_elements
            return
        assert isinstance(batch, list)  # a run is no list: handled above
        try:
            self._add_columns(batch)
        except _Irregular:
            self._add_each(batch)
        self.n_elements += len(batch)

    def _add_columns(self, batch: list[Any]) -> None:
        """The fast way: one pass per field, numbers converted by numpy. Raises
        :class:`_Irregular` (having changed nothing that matters) on anything unusual, for
        :meth:`_add_each` to handle event by event."""
        base = self.n_elements
        cat_of = self.cat_code_of
        try:
            codes = [cat_of[e.cat] for e in batch]  # other phases: NOT_COMPLETE's code
        except (KeyError, TypeError, AttributeError):  # a new category, an odd one, or a generic batch
            codes = self._new_cat_codes(batch)
        code_arr = np.array(codes, dtype=np.int8)
        frames = np.flatnonzero(code_arr == _FRAME_CODE)
        if len(frames):  # a with_stack trace: only the action frames among its python_function events
            actions = [self.keeps_frame(batch[k].name) for k in frames.tolist()]
            code_arr[frames] = np.where(actions, self.cat_codes[FRAME_CATEGORY], -1)
        keep = code_arr >= 0
        rows = np.flatnonzero(keep)
        kept = batch if len(rows) == len(batch) else list(compress(batch, keep.tolist()))
        starts = _ns([e.ts for e in kept])
        durs = _ns([e.dur for e in kept])
        name_codes = self.name_codes
        try:
            name_idx = [name_codes[e.name] for e in kept]
        except (KeyError, TypeError):
            names = [e.name for e in kept]
            try:
                new_names = dict.fromkeys(names)  # new names are coded in the order they come
            except TypeError:  # an unhashable name (list, dict)
                raise _Irregular from None
            for n in new_names:
                if n not in name_codes:
                    if type(n) is not str:
                        raise _Irregular from None
                    name_codes[n] = len(name_codes)
            name_idx = [name_codes[n] for n in names]
        args = [e.args for e in kept]
        try:
            seqs = _ints_or_minus_one([a.sequence for a in args])
            corrs = _ints_or_minus_one([a.external_id if a.correlation == -1 else a.correlation for a in args])
        except AttributeError:  # events without args
            seqs = _ints_or_minus_one([-1 if a is None else a.sequence for a in args])
            corrs = _ints_or_minus_one(
                [-1 if a is None else (a.external_id if a.correlation == -1 else a.correlation) for a in args]
            )
        pids = self._ids([e.pid for e in kept])
        tids = self._ids([e.tid for e in kept])
        self.bad_categories += int(np.count_nonzero(code_arr == _CAT_NOT_TEXT))  # nothing raises _Irregular past here
        if self.first_x_ts is None and base < 200:
            for e in batch[: 200 - base]:
                if type(e) is RawEvent and isinstance(e.ts, _NUMBER):
                    self.first_x_ts = e.ts
                    break
        n_begin_end = int(np.count_nonzero(code_arr == _BEGIN_END_CODE))
        self.n_begin_end += n_begin_end
        self.n_complete += len(batch) - int(np.count_nonzero(code_arr == _NOT_COMPLETE_CODE)) - n_begin_end
        if not kept:
            return
        cat_arr = code_arr[rows]
        name_arr = np.array(name_idx, dtype=np.int32)
        special = [name_codes[n] for n in _SPECIAL_OPS if n in name_codes]
        if special:
            named = name_arr == special[0]  # (np.isin costs more on a batch than these few ==)
            for code in special[1:]:
                named |= name_arr == code
            hits = np.flatnonzero(named & (cat_arr == self.cat_codes["cpu_op"]))
            if len(hits):
                kinds = [self._special_kind(kept[k].name, _special_args(kept[k].name, args[k])) for k in hits]
                self._keep_specials(hits + self.n_rows, kinds)
        self.parts.append((rows + base, cat_arr, name_arr, starts, durs, pids, tids, seqs, corrs))
        self.n_rows += len(kept)

    def _add_scanned(self, run: ScannedRun) -> None:
        """Keep the rows the native scanner read: what :meth:`_add_columns` keeps of the same
        elements (the scanner declines every run where it would not know), with names new to
        the file coded in the order :meth:`_add_columns` codes them."""
        base = self.n_elements
        for cat in run.cats:  # as _new_cat_codes records the categories it meets
            if cat not in self.cat_code_of:
                self.cat_code_of[cat] = self._cat_code(cat)
        if self.first_x_ts is None and base < 200 and run.first_ts is not None and run.first_ts[0] < 200 - base:
            self.first_x_ts = run.first_ts[1]
        self.n_complete += run.n_complete
        self.n_begin_end += run.n_begin_end
        kineto_native.RUNS["answered"] += 1
        kineto_native.RUNS["elements"] += run.n_elements
        if not run.n_rows:
            return
        if run.names is not None:  # names new to the file, coded in the order they came
            name_codes = self.name_codes
            for n in run.names:  # the run's codes for them: len(name_codes) on, in this order
                name_codes[n] = len(name_codes)
        for name, args, element in run.special_new:  # its kinds from len(special_keys) on, in order
            if element is not None:  # args the scanner leaves to msgspec and _special_args
                event = decode_element(element)
                args = _special_args(event.name, event.args)
            assert args is not None  # the scanner gives a kind's args or its element's bytes
            self._new_kind(name, args)
        if len(run.special_rows):
            self._keep_specials(run.special_rows + self.n_rows, run.special_kinds)
        self.parts.append((run.src + base, run.cat, run.name, run.start, run.dur, run.pid, run.tid, run.seq, run.corr))
        self.n_rows += run.n_rows

    def _special_kind(self, name: str, args: dict[str, Any] | tuple[Any, ...]) -> int:
        """The kind of a P2P or collective op of ``name`` with ``args`` (see ``special_keys``)."""
        kind = self.special_ids.get((name, args)) if isinstance(args, tuple) else None
        return self._new_kind(name, args) if kind is None else kind

    def _new_kind(self, name: str, args: dict[str, Any] | tuple[Any, ...]) -> int:
        """A new kind for ``(name, args)``, the next one; known by its args where they are a
        tuple and no kind has them yet."""
        kind = len(self.special_keys)
        self.special_keys.append((name, args))
        if isinstance(args, tuple):
            self.special_ids.setdefault((name, args), kind)
        return kind

    def _keep_specials(self, rows: ArrayLike, kinds: ArrayLike) -> None:
        self.special_rows.append(np.asarray(rows, dtype=np.int64))
        self.special_kinds.append(np.asarray(kinds, dtype=np.int32))

    def specials(self) -> list[tuple[int, str, dict[str, Any] | tuple[Any, ...]]]:
        """``(row, name, args)`` of each P2P or collective op, in row order."""
        if not self.special_rows:
            return []
        rows, kinds = np.concatenate(self.special_rows), np.concatenate(self.special_kinds)
        return [(row, *self.special_keys[kind]) for row, kind in zip(rows.tolist(), kinds.tolist())]

    def _new_cat_codes(self, batch: list[Any]) -> list[int]:
        """The cat codes of a batch with categories not seen before (added to ``cat_code_of``);
        elements that are None (a generically decoded batch) are no complete events."""
        cat_of = self.cat_code_of
        raw_cats = [NOT_COMPLETE if e is None else e.cat for e in batch]
        try:
            new_cats = set(raw_cats)
        except TypeError:  # an unhashable cat (list, dict)
            raise _Irregular from None
        for c in new_cats:
            if c not in cat_of:
                cat_of[c] = self._cat_code(c)
        return [cat_of[c] for c in raw_cats]

    def _cat_code(self, raw_cat: object) -> int:
        """The cat code of a raw category value (< 0: dropped), as ``cat_code_of`` records it."""
        cat = _normal_category(raw_cat)
        if type(raw_cat) is not str:
            return _CAT_NOT_TEXT
        return -1 if cat is None else _FRAME_CODE if cat == FRAME_CATEGORY else self.cat_codes[cat]

    def _ids(self, values: list[Any]) -> np.ndarray:
        """pids or tids as int64; odd ones (a float, a number beyond int64, an object) counted."""
        arr = _int_array(values)
        if arr is not None:
            return arr
        self.odd_identities += sum(1 for v in values if not _plain_id(v))
        return np.array([_as_int(v) for v in values], dtype=np.int64)

    def _add_each(self, batch: list[Any]) -> None:
        """The general way, event by event: any JSON types, exactly as the format allows."""
        empty_lists: Iterator[list[Any]] = ([] for _ in range(9))
        src, cats, names, starts, durs, pids, tids, seqs, corrs = empty_lists
        special_rows: list[int] = []
        special_kinds: list[int] = []
        cat_of, name_codes, cat_codes = self.cat_of, self.name_codes, self.cat_codes
        base = self.n_elements
        probing = self.first_x_ts is None and base < 200
        for offset, event in enumerate(batch):
            if type(event) is not RawEvent:
                if getattr(event, "cat", None) is BEGIN_END:
                    self.n_begin_end += 1
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
            if cat is None or (cat == FRAME_CATEGORY and not self.keeps_frame(event.name)):
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
                special_rows.append(self.n_rows + len(src))
                special_kinds.append(self._special_kind(name, _special_args(name, args)))
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
        if special_rows:
            self._keep_specials(special_rows, special_kinds)
        if src:
            self.parts.append(
                (
                    np.array(src, dtype=np.int64),
                    np.array(cats, dtype=np.int8),
                    np.array(names, dtype=np.int32),
                    np.array(starts, dtype=np.int64),
                    np.array(durs, dtype=np.int64),
                    np.array(pids, dtype=np.int64),
                    np.array(tids, dtype=np.int64),
                    np.array(seqs, dtype=np.int64),
                    np.array(corrs, dtype=np.int64),
                )
            )
            self.n_rows += len(src)

    def why_none(self) -> str:
        """Why no event was kept, for a file that has events."""
        if not self.n_complete:
            return "no complete ('ph': 'X') events: not a profiler timeline?"
        seen = {
            str(c) for c in list(self.cat_of) + list(self.cat_code_of) if c is not NOT_COMPLETE and c is not BEGIN_END
        }
        if seen <= {""}:
            return "no 'cat' field: a Chrome trace not written by the PyTorch profiler?"
        shown = ", ".join(sorted(valid_text(c)[:30] for c in seen if c)[:5])
        return f"categories {shown}; none is one tracekit reads"

    def _fill_specials(
        self,
        names: np.ndarray,
        peer: np.ndarray,
        tag: np.ndarray,
        nbytes: np.ndarray,
        group_to_global: dict[str, list[int]],
    ) -> None:
        """Each P2P or collective op's name (an NCCL op's own, e.g. ``nccl:send``), peer, tag and
        size from its args, worked out once per kind, in the order of each kind's first row (so
        names new to the file are coded in the order they come)."""
        rows, kinds = np.concatenate(self.special_rows), np.concatenate(self.special_kinds)
        met, first = np.unique(kinds, return_index=True)
        n_kinds = len(self.special_keys)
        code_of, peer_of, tag_of, size_of = (np.full(n_kinds, -1, dtype=np.int64) for _ in range(4))
        default_group = group_to_global.get("0")
        nccl: dict[tuple[Any, ...], tuple[int, int, int, int]] = {}  # fields -> name code, peer, size, group stride
        gloo: dict[tuple[Any, ...], tuple[int, int, int]] = {}  # raw shapes -> peer, tag, size
        for kind in met[np.argsort(rows[first], kind="stable")].tolist():
            name, args = self.special_keys[kind]
            if name == "record_param_comms":
                found = nccl.get(args) if isinstance(args, tuple) else None
                if found is None:
                    new_name, p, b, s = _nccl_comm_args(
                        _nccl_args(args) if isinstance(args, tuple) else args, group_to_global
                    )
                    code = self.name_codes.get(new_name)
                    if code is None:
                        code = self.name_codes[new_name] = len(self.name_codes)
                    found = (code, p, b, s)
                    if isinstance(args, tuple):
                        nccl[args] = found
                code_of[kind], peer_of[kind], size_of[kind], tag_of[kind] = found
            else:
                found_p2p = gloo.get(args) if isinstance(args, tuple) else None
                if found_p2p is None:
                    found_p2p = _gloo_p2p_args(decode_shapes(args) if isinstance(args, tuple) else args, default_group)
                    if isinstance(args, tuple):
                        gloo[args] = found_p2p
                peer_of[kind], tag_of[kind], size_of[kind] = found_p2p
        renamed = code_of[kinds] >= 0  # NCCL ops take their own names; a gloo op keeps its own
        names[rows[renamed]] = code_of[kinds[renamed]]
        peer[rows], tag[rows], nbytes[rows] = peer_of[kinds], tag_of[kinds], size_of[kinds]

    def columns(self, base_ns: int, group_to_global: dict[str, list[int]], rank: int, file_id: int) -> EventColumns:
        """The rows as event columns: times made absolute, P2P fields filled in, depth found."""
        if self.parts:
            src, cats, names, starts, durs, pids, tids, seqs, corrs = (np.concatenate(col) for col in zip(*self.parts))
        else:
            src, starts, durs, pids, tids, seqs, corrs = (np.zeros(0, np.int64) for _ in range(7))
            cats, names = np.zeros(0, np.int8), np.zeros(0, np.int32)
        self.parts = []
        n = len(src)
        peer = np.full(n, -1, dtype=np.int64)
        tag = np.full(n, -1, dtype=np.int64)
        nbytes = np.full(n, -1, dtype=np.int64)
        if self.special_rows:
            self._fill_specials(names, peer, tag, nbytes, group_to_global)
        start_ns = add_ns(starts, base_ns)
        end_ns = add_ns(start_ns, durs)
        keep, self.dropped = drop_impossible(
            start_ns, end_ns, [pids, tids, cats, names, seqs, corrs, peer, tag, nbytes]
        )
        if self.bad_categories:  # never rows: skipped at decoding, counted here
            self.dropped.counts["category_not_text"] = self.bad_categories
            self.dropped.of_rows += self.bad_categories
        if keep is not None:
            src, cats, names, start_ns, end_ns, pids, tids, seqs, corrs, peer, tag, nbytes = (
                col[keep] for col in (src, cats, names, start_ns, end_ns, pids, tids, seqs, corrs, peer, tag, nbytes)
            )
            n = len(src)
        name_list = [valid_text(name) for name in self.name_codes]
        async_codes = [self.name_codes[s] for s in ASYNC_SPANS if s in self.name_codes]
        depth = nesting_depth(
            pids,
            tids,
            start_ns,
            end_ns,
            transparent=np.isin(names, async_codes),
            apart=cats == self.cat_codes[FRAME_CATEGORY],
        )
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
        return EventColumns(
            numbers, {"cat": cats.astype(np.int32), "name": names}, {"cat": list(self._CATS), "name": name_list}
        )


def _plain_id(value: object) -> bool:
    """A pid or tid as profilers write them: an int64, or a label such as "stream 7"."""
    return isinstance(value, str) or (type(value) is int and _INT64_MIN <= value <= _INT64_MAX)


def _as_int(value: object) -> int:
    """Kineto pids/tids are usually ints, but some exporters write labels ("stream 7").
    Anything else (a list, a number beyond int64) gets an id of its own from its text."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and abs(value) < 2.0**63:
        return int(value)
    if isinstance(value, str):
        digits = re.search(r"-?\d+", value)
        if digits and _INT64_MIN <= int(digits.group(0)) <= _INT64_MAX:
            return int(digits.group(0))
    text = valid_text(str(value))
    return -(zlib.crc32(text.encode()) & 0x7FFFFFFF)
