"""Stream a Chrome-trace document's ``traceEvents`` in batches, one bounded chunk at a time.

A Kineto file is one JSON object whose ``traceEvents`` array holds nearly all of its bytes.
Reading it whole costs the file plus every event as a Python dict (5-10x the file). Here the
(decompressed) bytes are read in chunks; each chunk is cut after the last complete array
element and that run of elements is decoded at once by msgspec into :class:`RawEvent`
structs that keep only the fields the parser reads (the rest, and the bulky shape/type
lists of every op, are skipped without being built). Memory is bounded by a chunk and its
batch, not by the file.

Why a cut is safe: a candidate cut is a ``}`` followed by ``,`` and ``{`` (the seam between
two events). A candidate inside an event or inside a string leaves brackets or a string
open, so ``[`` + prefix + ``]`` is not valid JSON and the decoder refuses it; the first
candidate (from the end) that decodes is an element boundary.

Where the native scanner is built and on (:mod:`tracekit.ingest.kineto_native`), each run is
first offered to it; it answers with the run's row columns only where it reads the same rows
and its run ends at the same seam, so the runs, and what is read of them, are the same as
without it. Every run it declines takes the path above.

Header fields are collected from both ends: Kineto writes ``distributedInfo`` before
``traceEvents`` and, in newer versions, ``baseTimeNanoseconds`` after it. A document whose
layout cannot be streamed (no top-level ``traceEvents`` array found, odd header) is read
whole instead, so every valid file still loads.
"""

from __future__ import annotations

import json
import types
import zlib
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Union

import msgspec
import orjson

from tracekit.errors import TraceFormatError

if TYPE_CHECKING:
    from tracekit.ingest.kineto_native import ScannedRun, Scanner

_inflate: types.ModuleType
try:  # ISA-L's inflate reads the same gzip streams ~2x faster than zlib's (benchmarks/README.md)
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - an install without the wheel: zlib, same bytes
    _inflate = zlib

# Decompressed bytes gathered before a batch is cut and decoded (~3,000 Kineto events).
# With the native scanner each batch's Python work is what a larger one saves: a 26 MB GPU
# rank parses ~10% faster than with 256 KiB chunks, for ~2 MB more peak memory a parser
# (see benchmarks/README.md; through msgspec alone the two were as fast).
CHUNK_BYTES = 1 << 20
# Compressed bytes read from disk at a time.
READ_BYTES = 1 << 20
# A header longer than this without "traceEvents" is not a Chrome trace we can stream.
HEADER_LIMIT = 64 << 20
# Candidate cuts tried per chunk before waiting for more bytes.
CUT_ATTEMPTS = 4

_WS = b" \t\r\n"
_UNSET = msgspec.UNSET


class RawArgs(msgspec.Struct, gc=False):
    """The ``args`` an event row needs. Shape and type lists stay raw JSON bytes: they are
    on every op recorded with shapes but matter only for the few send/recv ops."""

    # -1 when absent, so a batch's values are all ints and convert to an array at once.
    sequence: Any = msgspec.field(name="Sequence number", default=-1)
    external_id: Any = msgspec.field(name="External id", default=-1)
    correlation: Any = msgspec.field(name="correlation", default=-1)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw(b""))
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))
    collective: Any = msgspec.field(name="Collective name", default=_UNSET)
    dst_rank: Any = msgspec.field(name="Dst Rank", default=_UNSET)
    src_rank: Any = msgspec.field(name="Src Rank", default=_UNSET)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=_UNSET)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=_UNSET)
    dtype: Any = msgspec.field(name="dtype", default=_UNSET)
    # the op's process group as ranks start + i * stride (torch's ParamCommsUtils), -1: not strided
    rank_start: Any = msgspec.field(name="Global rank start", default=_UNSET)
    rank_stride: Any = msgspec.field(name="Global rank stride", default=_UNSET)

    def to_dict(self) -> dict[str, Any]:
        """The plain fields as the dict the Chrome trace held (only the fields kept)."""
        out = {}
        for key, attr, default in _PLAIN_KEYS:
            value = getattr(self, attr)
            if value is not default:
                out[key] = value
        return out

    def shapes(self) -> tuple[bytes, ...]:
        """The raw JSON of the shape and type lists (``b""`` where absent), in
        :data:`_RAW_KEYS` order: equal bytes are equal lists (see :func:`decode_shapes`)."""
        return (bytes(self.concrete_inputs), bytes(self.input_dims), bytes(self.input_type))


def decode_shapes(raws: tuple[bytes, ...]) -> dict[Any, Any]:
    """:meth:`RawArgs.shapes` as the dict entries the Chrome trace held."""
    out = {}
    for (key, _), raw in zip(_RAW_KEYS, raws):
        if raw:
            try:
                out[key] = msgspec.json.decode(raw)
            except msgspec.DecodeError:  # nested deeper than msgspec decodes: unusable
                continue
    return out


_ARG_KEYS = [(f.encode_name, f.name) for f in msgspec.structs.fields(RawArgs)]
_RAW_KEYS = [(f.encode_name, f.name) for f in msgspec.structs.fields(RawArgs) if f.type is msgspec.Raw]
_PLAIN_KEYS = [(f.encode_name, f.name, f.default) for f in msgspec.structs.fields(RawArgs) if f.type is not msgspec.Raw]


class RawEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """One complete (``"ph": "X"``) trace event, fields as recorded (any JSON type: checks
    happen in the parser). Defaults mirror ``dict.get`` defaults of the Chrome format: no
    ``cat`` is "", no ``dur`` is 0."""

    cat: Any = ""
    name: Any = ""
    ts: Any = None
    dur: Any = 0
    pid: Any = 0
    tid: Any = 0
    args: RawArgs | None = None


# Every other phase of the Chrome trace format decodes to an empty struct: the parser reads
# only complete events, and skipping the fields of the rest (a GPU trace's memory instants
# and flow arrows are a third of its events) makes decoding ~30% faster. A phase not listed
# fails validation and its batch takes the general path below, so nothing is lost. Their
# ``cat`` is NOT_COMPLETE, so the row builder reads every element's category in one pass and
# tells complete events from the rest by it.
NOT_COMPLETE = object()
# The category of a duration event's begin or end ("B" / "E"): skipped like the other phases
# (tracekit reads complete events, as PyTorch's profiler writes them), but counted apart so
# that a file written by another tool in begin/end pairs is not read as empty without a word.
BEGIN_END = object()
OTHER_PHASES = (
    "B",
    "E",
    "i",
    "I",
    "C",
    "b",
    "n",
    "e",
    "s",
    "t",
    "f",
    "P",
    "N",
    "O",
    "D",
    "M",
    "V",
    "v",
    "R",
    "c",
    "(",
    ")",
)
_OTHERS = tuple(
    msgspec.defstruct(
        f"Phase_{n}", [], tag_field="ph", tag=ph, gc=False, namespace={"cat": BEGIN_END if ph in "BE" else NOT_COMPLETE}
    )
    for n, ph in enumerate(OTHER_PHASES)
)
# What :func:`event_from_object` gives for a "B" or "E" element (its ``cat`` is BEGIN_END).
BEGIN_END_EVENT = _OTHERS[OTHER_PHASES.index("B")]()
# the union is of structs made at run time above: no static type names them
_DECODER = msgspec.json.Decoder(list[Union[(RawEvent, *_OTHERS)]])  # type: ignore[valid-type]
_ELEMENT_DECODER = msgspec.json.Decoder(Union[(RawEvent, *_OTHERS)])
KNOWN_PHASES = frozenset(("X",) + OTHER_PHASES)


def decode_element(element: bytes) -> Any:
    """One array element as :data:`_DECODER` decodes it within a batch of elements it
    decodes: a :class:`RawEvent` or another phase's empty struct."""
    return _ELEMENT_DECODER.decode(element)


def event_from_object(obj: Any, unknown_phases: Counter[str] | None = None) -> RawEvent | Any:
    """A generically decoded element as a :class:`RawEvent` (None unless it is an object
    with ``"ph": "X"``: the parser reads nothing else; a "B" or "E" duration event is
    :data:`BEGIN_END_EVENT`, counted apart). Elements of no phase of the format are counted
    in ``unknown_phases`` by what they hold."""
    if not isinstance(obj, dict):
        if unknown_phases is not None:
            unknown_phases["not an object"] += 1
        return None
    phase = obj.get("ph")
    if phase in ("B", "E"):
        return BEGIN_END_EVENT
    if phase != "X":
        if unknown_phases is not None and not (isinstance(phase, str) and phase in KNOWN_PHASES):
            unknown_phases["no ph" if phase is None else f"ph {_shown(phase)}"] += 1
        return None
    args = obj.get("args")
    raw_args = None
    if isinstance(args, dict) and args:
        raw_args = RawArgs(
            **{
                attr: (_raw_json(args[key]) if attr in _RAW_ATTRS else args[key])
                for key, attr in _ARG_KEYS
                if key in args
            }
        )
    return RawEvent(
        cat=obj.get("cat", ""),
        name=obj.get("name", ""),
        ts=obj.get("ts"),
        dur=obj.get("dur", 0),
        pid=obj.get("pid", 0),
        tid=obj.get("tid", 0),
        args=raw_args,
    )


_RAW_ATTRS = {"concrete_inputs", "input_dims", "input_type"}


def _raw_json(value: Any) -> msgspec.Raw:
    """A decoded value as raw JSON again; empty (absent) when it cannot be encoded (a lone
    surrogate, which Python's decoder of damaged files lets through)."""
    try:
        return msgspec.Raw(msgspec.json.encode(value))
    except (UnicodeEncodeError, msgspec.EncodeError, TypeError, OverflowError):
        return msgspec.Raw(b"")


def _shown(value: Any) -> str:
    """A short printable form of an odd field value, for a warning."""
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 12 else text[:12] + "..."


class _BadCut(Exception):
    """The bytes before a candidate cut are not a run of whole elements."""


def decode_elements(array_text: bytes, unknown_phases: Counter[str] | None = None) -> list[RawEvent | None]:
    """Decode ``[ ... ]`` into events; typed fast path, generic path for odd elements
    (those of no known phase are counted in ``unknown_phases``)."""
    try:
        return _DECODER.decode(array_text)
    except (msgspec.ValidationError, RecursionError):
        # valid JSON so far, but an element is not an event-shaped object, or nests deeper
        # than msgspec recurses (orjson refuses past its own depth limit: damage, below)
        pass
    except msgspec.DecodeError:
        raise _BadCut from None
    try:
        items = orjson.loads(array_text)
    except orjson.JSONDecodeError:
        raise _BadCut from None
    return [event_from_object(item, unknown_phases) for item in items]


class ChromeTraceStream:
    """Iterate over a Chrome-trace file's events in decoded batches.

    After iteration: ``header`` holds every top-level field but ``traceEvents`` (from
    before and after the array), ``truncated`` says the file ended early (its complete
    events were read), ``n_elements`` counts the array's elements, ``unknown_phases``
    those of no phase the Chrome trace format has (by phase).

    With a native ``scanner``, a batch may instead be a :class:`ScannedRun` (the rows of a run,
    read by the scanner for the builder it reads codes from): add each batch to that builder
    before taking the next.
    """

    def __init__(
        self,
        path: Path,
        chunk_bytes: int | None = None,
        progress: Callable[[int], None] | None = None,
        whole_document: Callable[[Path], tuple[dict[str, Any], bool]] | None = None,
        scanner: Scanner | None = None,
    ):
        self.path = Path(path)
        self.scanner = scanner
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.progress = progress
        self.whole_document = whole_document
        self.header: dict[str, Any] = {}
        self.truncated = False
        self.n_elements = 0
        self.unknown_phases: Counter[str] = Counter()
        self.streamed = True
        self.peak_buffer = 0  # most bytes of the document held at once
        self._bare = False

    # -- bytes -------------------------------------------------------------------------
    def _chunks(self) -> Iterator[bytes]:
        """The file's (decompressed) bytes, a bounded chunk at a time."""
        with open(self.path, "rb") as fh:
            data = fh.read(min(READ_BYTES, self.chunk_bytes))
            if data[:2] != b"\x1f\x8b":
                while data:
                    self._advance(len(data))
                    yield data
                    data = fh.read(self.chunk_bytes)
                return
            decomp = _inflate.decompressobj(16 + zlib.MAX_WBITS)
            while data:
                self._advance(len(data))
                while data:
                    try:
                        out = decomp.decompress(data, self.chunk_bytes)
                    except _inflate.error as err:
                        raise TraceFormatError(
                            f"{self.path}: not a readable gzip file ({err}); check the file was copied whole"
                        ) from None
                    if out:
                        yield out
                    if decomp.eof:
                        data = decomp.unused_data
                        if data.strip(b"\x00"):  # another gzip member follows
                            decomp = _inflate.decompressobj(16 + zlib.MAX_WBITS)
                        else:
                            data = b""
                    else:
                        data = decomp.unconsumed_tail
                data = fh.read(READ_BYTES)
            if not decomp.eof:
                self.truncated = True  # the gzip stream was cut off mid-write
                tail = decomp.flush()
                if tail:
                    yield tail

    def _advance(self, nbytes: int) -> None:
        if self.progress:
            self.progress(nbytes)

    # -- elements ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[RawEvent | None] | ScannedRun]:
        chunks = self._chunks()
        buf = b""
        body_start = None
        for chunk in chunks:
            buf += chunk
            self.peak_buffer = max(self.peak_buffer, len(buf))
            body_start = self._find_array(buf)
            if body_start is not None:
                break
            if len(buf) > HEADER_LIMIT:
                raise TraceFormatError(
                    f"{self.path}: no 'traceEvents' array in the first {HEADER_LIMIT >> 20} MB; "
                    "is this a PyTorch profiler trace?"
                )
        if body_start is None or body_start < 0:
            for _ in chunks:
                pass  # count the rest of the file as read
            yield from self._read_whole()
            return
        body = buf[body_start:]
        del buf
        batch: ScannedRun | list[Any] | None
        for chunk in chunks:
            body += chunk
            self.peak_buffer = max(self.peak_buffer, len(body))
            if len(body) < self.chunk_bytes:
                continue
            batch, rest = self._scanned_cut(body)
            if batch is None:
                batch, rest = self._cut(body)
            if batch is not None:
                body = rest
                yield batch
        yield from self._finish(body)

    def _find_array(self, buf: bytes) -> int | None:
        """Where the first element of ``traceEvents`` starts; None: need more bytes;
        -1: this document cannot be streamed (read it whole)."""
        head = buf.lstrip(_WS)
        if head.startswith(b"\xef\xbb\xbf"):
            return -1
        if head[:1] == b"[":  # the bare event-array form
            self._bare = True
            return len(buf) - len(head) + 1
        key = buf.find(b'"traceEvents"')
        if key < 0:
            return None
        pos = _skip_ws(buf, key + len(b'"traceEvents"'))
        if pos >= len(buf):
            return None
        if buf[pos : pos + 1] != b":":
            return -1
        pos = _skip_ws(buf, pos + 1)
        if pos >= len(buf):
            return None
        if buf[pos : pos + 1] != b"[":
            return -1
        try:
            header = orjson.loads(buf[:key].rstrip(_WS).rstrip(b",") + b"}")
        except orjson.JSONDecodeError:
            return -1  # "traceEvents" was not a top-level key: read the document whole
        if not isinstance(header, dict):
            return -1
        self.header = header
        return pos + 1

    def _seams(self, body: bytes) -> Iterator[tuple[int, int]]:
        """``(end, next)`` for each ``}`` followed by ``,`` and ``{``, from the end
        backwards: ``body[:end]`` may be a run of whole elements, the next starting at ``next``."""
        pos = body.rfind(b"}")
        while pos >= 0:
            q = _skip_ws(body, pos + 1)
            if body[q : q + 1] == b",":
                q = _skip_ws(body, q + 1)
                if body[q : q + 1] == b"{":
                    yield pos + 1, q
            pos = body.rfind(b"}", 0, pos)

    def _scanned_cut(self, body: bytes) -> tuple[ScannedRun | None, bytes]:
        """The native scanner's run at the front of ``body`` and the rest, where it answers and
        its run ends at the seam :meth:`_cut` would cut at; else ``(None, body)``."""
        if self.scanner is None:
            return None, body
        run = self.scanner.scan(body)
        if run is None:
            return None, body
        # _cut tries these seams in turn and cuts at the first whose prefix decodes. Those after the
        # run's end lie inside the element that follows it (or past the array's end), so their
        # prefixes never decode: _cut cuts here if it gets this far.
        for attempt, (end, nxt) in enumerate(self._seams(body)):
            if attempt >= CUT_ATTEMPTS:
                break
            if end == run.end and nxt == run.next:
                self.n_elements += run.n_elements
                return run, body[nxt:]
        self.scanner.decline("a seam the Python cut would not reach")
        return None, body

    def _cut(self, body: bytes) -> tuple[list[Any] | None, bytes]:
        """Decode the whole elements at the front of ``body``; return them and the rest."""
        for attempt, (end, nxt) in enumerate(self._seams(body)):
            if attempt >= CUT_ATTEMPTS:
                break
            batch = self._decode_run(memoryview(body)[:end])  # a view: the run is copied once, below
            if batch is not None:
                return batch, body[nxt:]
        return None, body

    def _decode_run(self, run: bytes | memoryview) -> list[Any] | None:
        """The events of ``run`` (array elements without the brackets), counted; None when
        it is not a run of whole elements."""
        try:
            batch = decode_elements(b"".join((b"[", run, b"]")), self.unknown_phases)
        except _BadCut:
            return None
        self.n_elements += len(batch)
        return batch

    def _finish(self, body: bytes) -> Iterator[list[Any] | ScannedRun]:
        """The last elements, the array's end and the fields after it."""
        head = body.lstrip(_WS)
        if head[:1] == b"]":  # empty array (or one that ended right at a cut)
            self._read_trailer(head[1:])
            return
        scanned = self._scanned_last(body)
        if scanned is not None:
            yield scanned
            self._read_trailer(body[scanned.end + 1 :])
            return
        # The array's "]" is usually the last one in the file; fields after it may hold more.
        end = len(body)
        for _ in range(4 * CUT_ATTEMPTS):
            end = body.rfind(b"]", 0, end)
            if end < 0:
                break
            batch = self._decode_run(memoryview(body)[:end])
            if batch is None:
                continue
            yield batch
            self._read_trailer(body[end + 1 :])
            return
        # No end of array: the file stops inside traceEvents. Keep its whole elements.
        self.truncated = True
        batch = self._decode_run(body.rstrip(_WS).rstrip(b","))
        if batch is None:
            batch, _ = self._cut(body)  # counts what it decodes
            if batch is None:
                batch = _salvage_elements(body, self.unknown_phases)
                self.n_elements += len(batch)
        if batch:
            yield batch

    def _scanned_last(self, body: bytes) -> ScannedRun | None:
        """The native scanner's run of the array's last elements, where it answers and its run
        ends at the "]" :meth:`_finish` would end the array at (``scanned.end``), counted."""
        if self.scanner is None:
            return None
        run = self.scanner.scan(body, last=True)
        if run is None:
            return None
        # _finish tries each "]" from the end in turn; those after the array's own never decode
        # (the array would be followed by more than whitespace).
        if body.count(b"]", run.end + 1) >= 4 * CUT_ATTEMPTS:
            self.scanner.decline("an end of the array the Python loop would not reach")
            return None
        self.n_elements += run.n_elements
        return run

    def _read_trailer(self, rest: bytes) -> None:
        rest = rest.strip(_WS)
        if self._bare or rest == b"}":
            self.truncated = self.truncated or (self._bare and rest != b"")
            return
        if not rest.startswith(b","):
            self.truncated = True
            return
        try:
            trailer = orjson.loads(b"{" + rest[1:])
        except orjson.JSONDecodeError:
            self.truncated = True  # cut off after the events: they were all read
            return
        if isinstance(trailer, dict):
            self.header.update(trailer)

    def _read_whole(self) -> Iterator[list[Any]]:
        """A document that cannot be streamed is decoded whole (the old, general way)."""
        self.streamed = False
        if self.whole_document is None:
            raise TraceFormatError(f"{self.path}: not a Chrome trace document")
        doc, truncated = self.whole_document(self.path)
        self.truncated = self.truncated or truncated
        events = doc.pop("traceEvents")
        self.header = doc
        self.n_elements = len(events)
        batch_size = 50_000
        for start in range(0, len(events), batch_size):
            yield [event_from_object(e, self.unknown_phases) for e in events[start : start + batch_size]]


def _skip_ws(data: bytes, pos: int) -> int:
    """The first position at or after ``pos`` that is not JSON whitespace (or the end)."""
    n = len(data)
    while pos < n and data[pos] in _WS:
        pos += 1
    return pos


def complete_elements(text: str, pos: int = 0) -> list[Any]:
    """Every complete JSON value of an array body from ``pos``, one at a time, up to the
    array's end or the first damaged one (slow; only for a truncated or damaged tail)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):  # damaged, or nested beyond any trace
            break
        values.append(value)
    return values


def _salvage_elements(body: bytes, unknown_phases: Counter[str]) -> list[Any]:
    """Every complete element at the front of ``body``, as events."""
    return [event_from_object(e, unknown_phases) for e in complete_elements(body.decode("utf-8", errors="replace"))]
