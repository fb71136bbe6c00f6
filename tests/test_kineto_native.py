"""The native scanner (tracekit/ingest/_kineto_scan.c through kineto_native) gives exactly the
Python path's rows or declines.

- ``read_kineto`` with the scanner on and off gives equal ``TraceFile`` fields and equal columns
  (every array, dtype included, and the name list) on every sample trace, the shared real GPU
  traces, generated GPU pipelines (tests/gpu_tracegen.py) and generated ``with_stack`` traces
  (tests/generated_python_frames.py), at the default chunk size and at small ones (many
  cuts); and the scanner answered every run of those files.
- Documents drawn by hypothesis (GENERATED unit-test fixtures, not traces) with odd values:
  escapes, unicode, ints and floats mixed, missing fields, nested args, bools, nulls, huge
  numbers, odd whitespace, unknown phases, repeated keys, other key orders, truncated tails:
  the same outcome both ways (columns, or the same error).
- Keys taken from the scanner's memo of the last elements' keys: elements written alike, then
  one changed at a key (more whitespace, another key, an escape, a repeat, another phase...),
  deterministic cases and drawn ones: the same rows both ways, answered where the generic key
  scan answers.
- The contract at its source: for a run of elements the scanner answers for, the row builder
  ends in the same state as after msgspec's typed decode and ``_add_columns`` (which must not
  have refused the batch), from any earlier state.
- The scanner is used where built, and ``TRACEKIT_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import sysconfig
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SAMPLES, SHARED_TRACES, native_scanner
from generated_python_frames import megatron_cpu, megatron_gpu
from gpu_tracegen import FUSED_SCENARIOS, PLAIN_SCENARIOS, SCENARIOS, generate
from tracekit.ingest import kineto_native, kineto_stream
from tracekit.ingest.kineto import read_kineto
from tracekit.ingest.kineto_rows import _Irregular, _RowBuilder
from tracekit.ingest.kineto_document import read_json_document
from tracekit.ingest.kineto_stream import _DECODER, ChromeTraceStream, decode_elements

needs_scanner = pytest.mark.skipif(
    not kineto_native.available(), reason="the native scanner is not built (no C compiler at install)"
)


def _array(arr: np.ndarray) -> tuple:
    return arr.dtype.str, arr.shape, arr.tobytes()


def _outcome(path: Path, native: bool, chunk_bytes: int | None = None) -> tuple:
    """What read_kineto gives for ``path``: the TraceFile's fields and every column (dtype and
    bytes), or the error it raises."""
    with native_scanner(native, chunk_bytes):
        try:
            trace, columns = read_kineto(path, 3)
        except Exception as err:  # TraceFormatError, or whatever else the Python path raises
            return ("error", type(err).__name__, str(err))
    return (
        vars(trace),
        {k: _array(v) for k, v in columns.numbers.items()},
        {k: _array(v) for k, v in columns.codes.items()},
        columns.values,
    )


def _streamed(path: Path, native: bool, chunk_bytes: int | None = None) -> tuple | dict:
    """The stream's batches (their sizes: where it cut), its progress calls and what it and the
    row builder hold after reading ``path`` as read_kineto does, or the error it raises."""
    with native_scanner(native, chunk_bytes):
        rows = _RowBuilder()
        progress: list[int] = []
        stream = ChromeTraceStream(
            path, progress=progress.append, whole_document=read_json_document, scanner=rows.native_scanner()
        )
        sizes = []
        try:
            for batch in stream:
                rows.add(batch)
                sizes.append(len(batch) if isinstance(batch, list) else batch.n_elements)
        except Exception as err:
            return ("error", type(err).__name__, str(err))
    return {
        "batches": sizes,
        "progress": progress,
        "header": stream.header,
        "truncated": stream.truncated,
        "n_elements": stream.n_elements,
        "unknown_phases": stream.unknown_phases,
        "streamed": stream.streamed,
        "peak_buffer": stream.peak_buffer,
        "rows": _state(rows),
    }


def _both_ways(path: Path, chunk_bytes: int | None = None) -> Counter:
    """Assert both ways give the same; the runs the scanner answered and declined ("refused":
    declined for a reason other than there being no whole element yet, as where an element is
    longer than a small chunk: the Python cut finds none either)."""
    without = _outcome(path, False, chunk_bytes)
    before = Counter(kineto_native.RUNS)
    with_scanner = _outcome(path, True, chunk_bytes)
    runs = Counter(kineto_native.RUNS)
    runs.subtract(before)
    runs["refused"] = runs["declined"] - runs["declined: no whole element yet"]
    assert with_scanner == without, path
    assert _streamed(path, True, chunk_bytes) == _streamed(path, False, chunk_bytes), path
    return runs


# -- real and generated files -----------------------------------------------------------------


def _sample_files() -> list[Path]:
    return sorted(SAMPLES.glob("**/*.json.gz"))


def _shared_files() -> list[Path]:
    folder = SHARED_TRACES / "kineto-gpu"
    return sorted(folder.glob("*.json.gz")) if folder.is_dir() else []


@needs_scanner
@pytest.mark.parametrize("path", _sample_files(), ids=lambda p: str(p.relative_to(SAMPLES)))
def test_sample_traces_read_the_same_with_the_scanner(path):
    runs = _both_ways(path)
    assert runs["answered"] >= 1 and runs["refused"] == 0, runs


@needs_scanner
@pytest.mark.parametrize("chunk", [None, 4096])
def test_shared_real_gpu_traces_read_the_same_with_the_scanner(chunk):
    files = _shared_files()
    if not files:
        pytest.skip(
            f"{SHARED_TRACES / 'kineto-gpu'} is absent: the shared real traces are not laid beside this checkout"
        )
    for path in files:
        runs = _both_ways(path, chunk)
        # the scanner really ran: it read every run of these real files
        assert runs["answered"] >= 1 and runs["refused"] == 0, (path.name, runs)


@needs_scanner
@pytest.mark.parametrize("scenario", PLAIN_SCENARIOS + FUSED_SCENARIOS)
def test_generated_gpu_pipelines_read_the_same_with_the_scanner(tmp_path, scenario):
    folder, _ = generate(SCENARIOS[scenario], tmp_path)
    for path in sorted(folder.glob("rank*.json.gz")):
        for chunk in (None, 2048):
            runs = _both_ways(path, chunk)
            assert runs["answered"] >= 1 and runs["refused"] == 0, (path.name, chunk, runs)


@needs_scanner
@pytest.mark.parametrize("name", ["gpu", "cpu"])
def test_generated_with_stack_traces_read_the_same_with_the_scanner(tmp_path, name):
    """GENERATED Megatron frames (tests/generated_python_frames.py) over a generated GPU
    pipeline and over the real Megatron-core CPU sample: frames kept and dropped alike."""
    if name == "gpu":
        folder, _ = megatron_gpu(SCENARIOS["unlabelled_interleaved"], tmp_path)
    else:
        folder, _ = megatron_cpu(SAMPLES / "megatron_1f1b", tmp_path)
    for path in sorted(folder.glob("rank*.json.gz"))[:2]:
        for chunk in (None, 2048):
            runs = _both_ways(path, chunk)
            assert runs["answered"] >= 1 and runs["refused"] == 0, (path.name, chunk, runs)


# -- generated documents with odd values ----------------------------------------------------------

_WS = ["", "", "", " ", " ", "\n  ", "\n    ", "\t", "\r\n"]
# Not JSON whitespace: a document holding them is damaged (both ways must say the same).
_ODD_WS = ["\x0c", "\x0b", "\u00a0", "\u2028"]
_TEXTS = [
    "",
    "aten::mm",
    "record_param_comms",
    "c10d::send",
    "c10d::recv_",
    "c10d::recv_any_source_",
    "gloo:send",
    "gloo:recv",
    "ProfilerStep#3",
    "caf\u00e9 \u4e2d \U0001f600",
    'quote " and \\ slash /',
    "tab\tnew\nline\x01",
    "\u212aernel",  # KELVIN SIGN: lower() makes it "kernel"
    "stream 7",
    "x" * 40,
    '},{"ph": "X"},{' * 3,  # candidate seams inside a string: the cut must skip them
    # Python frames: two that name actions (kept where their category is python_function),
    # a training script's own forward_step and a module's frame (never kept)
    "megatron/core/pipeline_parallel/schedules.py(403): forward_step",
    "/ws/Megatron-LM/megatron/schedules.py(143): backward_step",
    "pretrain_gpt.py(120): forward_step",
    "nn.Module: Linear_0",
]
_CATS = [
    "cpu_op",
    "kernel",
    "Kernel",
    "CPU_OP",
    "cuda_runtime",
    "cuda_driver",
    "gpu_memcpy",
    "gpu_memset",
    "user_annotation",
    "gpu_user_annotation",
    "runtime",
    "python_function",
    "ac2g",
    "Trace",
    "",
    "\u212aernel",
    "kernel ",
]
# Numbers as written: ints, floats, around 2**53/1000 us (float math on ints stops being exact),
# 2**52 (the scanner's bound), int64 and beyond, overflowing floats, odd but legal forms.
_NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "7",
    "1000",
    "-1.0",
    "2.5",
    "0.0005",
    "1e3",
    "1E-2",
    "-0.0",
    "1.25e+2",
    "1669783687464181",
    "1669783687464181.5",
    "5187634084177.172",
    "9007199254740.991",
    "9007199254740.992",
    "9007199254741",
    "4503599627370495",
    "4503599627370496",
    "4503599627370495.5",
    "9223372036854775",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "123456789012345678901234567890",
    "1e300",
    "1e309",
    "-1e400",
    "4.9e-324",
    "1e-400",
    "0.1e1",
    "123456789012345678.25",
    "0.30000000000000004",
]
_OTHER_VALUES = [
    "true",
    "false",
    "null",
    "[]",
    "{}",
    '"7"',
    '"x"',
    "[1, 2]",
    '{"a": [1, {"b": null}]}',
    '[{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}, {"e": 5}]',  # candidate seams inside an element
]
_PLAIN_TIMES = ["1000", "1000.5", "2.25", "1669783687464181", "5187634084177.172", "0", "7", "12.000001"]
_PLAIN_IDS = ["1", "2", "783658", "0", "-1", "7"]


def _escaped(text: str, rnd, often: float = 0.2) -> str:
    """``text`` as a JSON string literal, characters escaped at random (``often`` of them)."""
    out = []
    for ch in text:
        code = ord(ch)
        must = ch in '"\\' or code < 0x20
        if not must and rnd.random() >= often:
            out.append(ch)
        elif ch in '"\\/\b\f\n\r\t' and rnd.random() < 0.5:
            out.append("\\" + {"\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}.get(ch, ch))
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
        else:
            out.append(f"\\u{code:04x}" if rnd.random() < 0.5 else f"\\u{code:04X}")
    return '"' + "".join(out) + '"'


def _value(rnd) -> str:
    """Any JSON value, mostly numbers and texts; now and then nested deeper than a trace nests."""
    kind = rnd.choice(["number", "number", "text", "other", "deep"])
    if kind == "number":
        return rnd.choice(_NUMBERS)
    if kind == "text":
        return _escaped(rnd.choice(_TEXTS), rnd)
    if kind == "deep":
        depth = rnd.choice([2, 5, 31, 33])
        return "[" * depth + rnd.choice(_NUMBERS) + "]" * depth
    return rnd.choice(_OTHER_VALUES)


def _obj(rnd, fields: list[tuple[str, str]], odd: bool) -> str:
    """An object of the fields in a random order; in an odd one, now and then a field repeated,
    a key escaped, or a character that is not JSON whitespace."""
    fields = list(fields)
    rnd.shuffle(fields)
    if odd and fields and rnd.random() < 0.1:
        fields.append(rnd.choice(fields))  # a repeated key
    parts = []
    for key, value in fields:
        key_text = _escaped(key, rnd, 0.5) if odd and rnd.random() < 0.05 else json.dumps(key)
        ws = rnd.choice(_ODD_WS) if odd and rnd.random() < 0.02 else rnd.choice(_WS)
        parts.append(f"{rnd.choice(_WS)}{key_text}{ws}:{rnd.choice(_WS)}{value}")
    return "{" + ",".join(parts) + rnd.choice(_WS) + "}"


def _element(rnd, odd_share: float) -> str:
    """One traceEvents element: mostly complete events of kept categories with plain values;
    elements with odd values (``odd_share`` of them), other phases, unknown phases and
    non-objects among them."""
    if rnd.random() < odd_share / 20:
        return rnd.choice(["1", "null", '"X"', "[]", '[{"ph": "X"}]'])
    odd = rnd.random() < odd_share  # an element with odd values

    def plain_or_odd(plain: list[str]) -> str:
        return rnd.choice(plain) if not odd or rnd.random() < 0.6 else _value(rnd)

    fields: list[tuple[str, str]] = []
    ph = rnd.choice(["X"] * 10 + ["i", "f", "s", "M", "C", "b", "e", "("])
    if odd and rnd.random() < 0.2:
        ph = rnd.choice(["Q", "XX", "", "x"])
    if not odd or rnd.random() > 0.1:
        fields.append(("ph", json.dumps(ph) if not odd or rnd.random() > 0.1 else rnd.choice(["1", "null"])))
    if not odd or rnd.random() > 0.1:
        cat = _escaped(rnd.choice(_CATS), rnd, 0.02 if not odd else 0.3)
        fields.append(("cat", cat if not odd or rnd.random() < 0.7 else _value(rnd)))
    if not odd or rnd.random() > 0.1:
        name = _escaped(rnd.choice(_TEXTS), rnd, 0.02 if not odd else 0.3)
        fields.append(("name", name if not odd or rnd.random() < 0.7 else _value(rnd)))
    for key in ("ts", "dur", "pid", "tid"):
        if not odd or rnd.random() > 0.1:
            fields.append((key, plain_or_odd(_PLAIN_TIMES if key in ("ts", "dur") else _PLAIN_IDS)))
    if rnd.random() < 0.9:
        args: list[tuple[str, str]] = []
        for key in ("Sequence number", "External id", "correlation", "Ev Idx"):
            if rnd.random() < 0.5:
                args.append((key, plain_or_odd(_PLAIN_IDS)))
        if rnd.random() < 0.2:
            plain = ['"send"', '"recv"', '"allreduce"', "1", "0", "10", '"Float"', '"BFloat16"']
            for key in ("Collective name", "Dst Rank", "Src Rank", "In msg nelems", "Out msg nelems", "dtype"):
                if rnd.random() < 0.5:
                    args.append((key, plain_or_odd(plain)))
        if rnd.random() < 0.2:
            for key, plain in (
                ("Concrete Inputs", '["", "", "1", "0"]'),
                ("Input Dims", "[[[4, 4]], [], [], []]"),
                ("Input type", '["TensorList", "", "Scalar", "Scalar"]'),
            ):
                if rnd.random() < 0.5:
                    args.append((key, plain_or_odd([plain])))
        arg_text = _obj(rnd, args, odd)
        if odd and rnd.random() < 0.15:
            arg_text = rnd.choice(["null", "[]", '"x"', "1", "{}"])
        fields.append(("args", arg_text))
    if rnd.random() < 0.2:
        fields.append(("id", _value(rnd)))  # a field the parser never reads
    return _obj(rnd, fields, odd)


# Hypothesis draws a seed and how odd a document is; random.Random makes the choices with the
# odds written here (hypothesis's own draws favour boundary values, and would make nearly every
# element odd: the scanner would decline nearly everything).
_SEEDS = st.integers(0, 2**63)
_ODD_SHARES = st.sampled_from([0.0, 0.02, 0.1, 0.3, 1.0])


@st.composite
def _document(draw) -> bytes:
    """A Chrome-trace document (or its bare array): header, elements, trailer; cut short or
    damaged now and then."""
    rnd, odd_share = random.Random(draw(_SEEDS)), draw(_ODD_SHARES)
    elements = [_element(rnd, odd_share) for _ in range(rnd.randint(0, 30))]
    if rnd.random() < 0.1:  # no complete event in the first 200 elements or so: the time base probe
        elements[:0] = ['{"ph": "M", "name": "process_name", "args": {"name": "x"}}'] * rnd.randint(150, 260)
    body = "".join(
        e + (f"{rnd.choice(_WS)},{rnd.choice(_WS)}" if i < len(elements) - 1 else "") for i, e in enumerate(elements)
    )
    form = rnd.choice(["header", "header", "trailer", "bare"])
    if form == "bare":
        text = f"[{rnd.choice(_WS)}{body}{rnd.choice(_WS)}]"
    else:
        head = '{"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": ['
        tail = "]}"
        if form == "trailer":
            tail = '], "baseTimeNanoseconds": 1700000000000000000, "deviceProperties": [{"id": [0]}], "x": "]"}'
        text = f"{head}{rnd.choice(_WS)}{body}{rnd.choice(_WS)}{tail}"
    data = text.encode("utf-8", "surrogatepass")
    if rnd.random() < 0.15:
        data = data[: rnd.randint(0, len(data))]  # a truncated file
    if rnd.random() < odd_share / 5 and data:
        data = data.replace(b"a", b"\xff", 1)  # invalid UTF-8
    return data


@needs_scanner
def test_generated_documents_read_the_same_with_the_scanner(tmp_path):
    answered = Counter()

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        doc=_document(),
        chunk=st.sampled_from([None, 16, 64, 200, 1024]),
        compressed=st.booleans(),
    )
    def check(doc, chunk, compressed):
        path = tmp_path / ("trace.json.gz" if compressed else "trace.json")
        path.write_bytes(gzip.compress(doc, mtime=0) if compressed else doc)
        answered.update(_both_ways(path, chunk))

    check()
    # not vacuous: the scanner answered for many runs (and declined others)
    assert answered["answered"] > 400 and answered["declined"] > 50, answered


# -- the contract, run by run --------------------------------------------------------------------


def _state(builder: _RowBuilder) -> dict:
    """Everything a row builder holds that its columns, warnings and errors come from."""
    columns = [_array(np.concatenate(col)) for col in zip(*builder.parts)] if builder.parts else []
    return {
        "n_elements": builder.n_elements,
        "first_x_ts": (type(builder.first_x_ts), builder.first_x_ts),
        "name_codes": list(builder.name_codes.items()),  # in order: the codes
        "cat_code_of": {k: v for k, v in builder.cat_code_of.items()},
        "columns": columns,
        "n_rows": builder.n_rows,
        "special": builder.specials(),
        "n_complete": builder.n_complete,
        "bad_categories": builder.bad_categories,
        "odd_identities": builder.odd_identities,
    }


def _python_add(builder: _RowBuilder, run: bytes) -> str:
    """Add a run the Python way (as ChromeTraceStream and add do); which way it went."""
    try:
        _DECODER.decode(b"[" + run + b"]")
        typed = True
    except (msgspec.ValidationError, RecursionError):
        typed = False
    batch = decode_elements(b"[" + run + b"]")
    try:
        builder._add_columns(batch)
        way = "columns" if typed else "generic"
    except _Irregular:
        builder._add_each(batch)
        way = "each"
    builder.n_elements += len(batch)
    return way


def _add_both_ways(native: _RowBuilder, scanner, python: _RowBuilder, run: bytes, tail: bytes = b"]") -> tuple:
    """Add ``run`` the Python way to ``python``, and to ``native`` through ``scanner`` where
    it answers (else the Python way too); both builders must then agree. The way the Python
    path took, and the scanner's answer (None: declined)."""
    way = _python_add(python, run)
    scanned = scanner.scan(run + tail, last=True)
    if scanned is None:
        _python_add(native, run)
    else:
        # answered: the Python path took the typed decode and the column-wise path
        assert way == "columns", (way, run)
        native.add(scanned)
    assert _state(native) == _state(python), run
    return way, scanned


@st.composite
def _runs(draw) -> list[bytes]:
    """Runs of elements (each valid JSON as an array), one after another in one file."""
    rnd, odd_share = random.Random(draw(_SEEDS)), draw(_ODD_SHARES)
    runs = []
    for _ in range(rnd.randint(1, 4)):
        elements = [_element(rnd, odd_share) for _ in range(rnd.randint(1, 12))]
        run = (rnd.choice(_WS) + ",").join(elements).encode("utf-8", "surrogatepass")
        try:
            decode_elements(b"[" + run + b"]")
        except kineto_stream._BadCut:
            continue  # not JSON: no run (the stream never cuts there)
        runs.append(run)
    return runs


# The drawn-runs tests' settings: 300 draws, the same ones every time, no example database.
_DRAWN_RUNS = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@needs_scanner
def test_each_answered_run_equals_the_typed_decode_and_column_path():
    ways = Counter()

    @_DRAWN_RUNS
    @given(runs=_runs())
    def check(runs):
        native, python = _RowBuilder(), _RowBuilder()
        scanner = native.native_scanner()
        for run in runs:
            way, scanned = _add_both_ways(native, scanner, python, run, b" ]")
            if scanned is not None:
                assert scanned.end == len(run) + 1 and scanned.n_elements == len(decode_elements(b"[" + run + b"]"))
            ways[way if scanned is None else "answered"] += 1

    check()
    assert ways["answered"] > 100 and ways["columns"] + ways["each"] + ways["generic"] > 50, ways


def _run(*elements: dict | str) -> bytes:
    return ", ".join(e if isinstance(e, str) else json.dumps(e, ensure_ascii=False) for e in elements).encode()


_X = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1000.5, "dur": 2.25}

# Runs the scanner must answer (the Python path is plain for them) and runs it must decline.
_ANSWERED = {
    "plain": _run(_X, {**_X, "ts": 1001}),
    "other phases": _run({"ph": "i", "ts": "x", "args": [1]}, _X, {"ph": "M", "name": 5}),
    "not kept": _run({**_X, "cat": "python_function", "name": 7, "ts": "x", "pid": "a"}),
    "python frames": _run(
        {**_X, "cat": "python_function", "name": "megatron/core/pipeline_parallel/schedules.py(403): forward_step"},
        {**_X, "cat": "python_function", "name": "torch/nn/modules/module.py(1784): _call_impl", "ts": "x"},
        {**_X, "cat": "Python_Function", "name": "megatron/schedules.py(143): backward_step", "args": {"Python id": 2}},
        {"ph": "X", "cat": "python_function", "ts": 5},
        {**_X, "cat": "python_function", "name": ["megatron/schedules.py(143): backward_step"], "pid": "a"},
        {**_X, "cat": "python_function", "name": "megatron/schedules.py(143): backward_step\n"},
        {**_X, "cat": "python_function", "name": "pretrain_gpt.py(120): forward_step"},
        _X,
    ),
    # a kept name escaped at its end: read whole, not dropped on its raw last bytes
    "python frame escaped": _run(
        {**_X, "cat": "python_function", "name": "megatron/core/pipeline_parallel/schedules.py(403): forward_step"}
    ).replace(b'forward_step"', b'forward_st\\u0065p"'),
    "unicode": _run({**_X, "name": 'caf\u00e9 \U0001f600 "q" \t'}),
    "escapes": _run({**_X, "name": 'caf\u00e9 \U0001f600 "q" \t'}).replace("é".encode(), b"\\u00e9"),
    "epoch ints": _run({**_X, "ts": 1669783687464181, "dur": 45}),
    "epoch floats": _run({**_X, "ts": 1669783687464181.5, "dur": 45.25}),
    "no dur, pid, tid": _run({"ph": "X", "cat": "kernel", "name": "k", "ts": 5}),
    "args null": _run({**_X, "args": None}),
    "correlation -1.0": _run({**_X, "args": {"correlation": -1.0, "External id": 9}}),
    "ids of other types": _run({**_X, "args": {"Sequence number": 2.0, "External id": "3", "correlation": None}}),
    "nccl": _run({**_X, "name": "record_param_comms", "args": {"Collective name": "send", "Dst Rank": 1}}),
    "nccl, a float field": _run({**_X, "name": "record_param_comms", "args": {"Dst Rank": 1.0}}),
    "gloo": _run({**_X, "name": "c10d::send", "args": {"Input Dims": [[4, 4]], "Concrete Inputs": ["", "", "1"]}}),
    "kelvin sign": _run({**_X, "cat": "\u212aernel"}),
    "new names in the order they come": _run({**_X, "name": "b"}, {**_X, "name": "a"}, {**_X, "name": "b"}, _X),
    "one name escaped two ways": _run({**_X, "name": "ab"}, {**_X, "name": "ab"}).replace(b'"ab"', b'"a\\u0062"', 1),
}
_DECLINED = {
    "unknown phase": (_run(_X, {"ph": "Q"}), "an element of no known phase"),
    "no phase": (_run({"cat": "cpu_op"}), "an element of no known phase"),
    "not an object": (_run(_X, "1"), "an element that is not an object"),
    "category not text": (_run({**_X, "cat": 1}), "a category that is not text"),
    "name not text": (_run({**_X, "name": None}), "a name that is not text"),
    "ts missing": (_run({"ph": "X", "cat": "cpu_op", "dur": 1}), "a ts that is no plain number"),
    "ts a bool": (_run({**_X, "cat": "python_function", "ts": True}), "a ts the time base probe would read"),
    "ts beyond 2**52": (_run({**_X, "ts": 2**52}), "a ts that is no plain number"),
    "pid a label": (_run({**_X, "pid": "stream 7"}), "a pid or tid that is no plain integer"),
    "tid a float": (_run({**_X, "tid": 2.0}), "a pid or tid that is no plain integer"),
    "seq a bool": (_run({**_X, "args": {"Sequence number": True}}), "an args id"),
    "args a list": (_run({**_X, "args": [1]}), "args that is not an object"),
    "args a number": (_run({**_X, "cat": "python_function", "args": 1}), "args that is not an object"),
    "args a string": (_run({**_X, "cat": "python_function", "args": "x"}), "args that is not an object"),
    "repeated key": ('{"ph": "X", "ts": 1, "ts": 2, "cat": "cpu_op"}'.encode(), "a field given twice"),
    "escaped key": ('{"p\\u0068": "X", "ts": 1}'.encode(), "an element key with an escape"),
    "escaped phase": ('{"ph": "\\u0058", "ts": 1}'.encode(), "an element of no known phase"),
    "lone surrogate": (b'{"ph": "X", "cat": "cpu_op", "name": "\\ud800", "ts": 1}', "a lone high surrogate escape"),
    "invalid UTF-8": (b'{"ph": "X", "cat": "cpu_op", "name": "\xff", "ts": 1}', "invalid UTF-8"),
    "a raw control character": (b'{"ph": "X", "cat": "cpu_op", "name": "\x01", "ts": 1}', "a control character"),
    "mixed large times": (_run(_X, {**_X, "ts": 1669783687464181}, {**_X, "ts": 1.5}), "ints and large floats"),
    "float overflow": (_run({**_X, "args": {"x": 1e300}}).replace(b"1e+300", b"1e400"), "a float beyond 1e300"),
    "deep": (_run({**_X, "args": {"x": "DEEP"}}).replace(b'"DEEP"', b"[" * 34 + b"1" + b"]" * 34), "nested too deep"),
}


def _scanned_as_python(run: bytes) -> None:
    """The scanner answers the whole of ``run`` (elements, no brackets) with the rows the
    Python path adds for it."""
    native, python = _RowBuilder(), _RowBuilder()
    scanned = native.native_scanner().scan(run + b"]", last=True)
    assert scanned is not None
    native.add(scanned)
    assert _python_add(python, run) == "columns"
    assert _state(native) == _state(python)


@needs_scanner
@pytest.mark.parametrize("name", sorted(_ANSWERED))
def test_plain_runs_are_answered_with_the_python_rows(name):
    _scanned_as_python(_ANSWERED[name])


@needs_scanner
@pytest.mark.parametrize("name", sorted(_DECLINED))
def test_unusual_runs_are_declined(name):
    run, why = _DECLINED[name]
    scanner = _RowBuilder().native_scanner()
    assert scanner.scan(run + b"]", last=True) is None
    assert scanner._scanner.why.startswith(why)


@needs_scanner
def test_a_run_ends_at_the_seam_the_python_cut_finds():
    """Cut mode: the run ends after the last element whose successor starts in the bytes."""
    scanner = _RowBuilder().native_scanner()
    text = _run(_X, _X, _X) + b' ,\n {"ph": "X", "name": "cut here'
    scanned = scanner.scan(text)
    assert scanned is not None and scanned.n_elements == 3
    assert text[: scanned.end].endswith(b"}") and text[scanned.next :].startswith(b'{"ph": "X", "name": "cut')
    # no seam after the last whole element: it waits for the next bytes
    scanned = scanner.scan(_run(_X, _X) + b" ,")
    assert scanned is not None and scanned.n_elements == 1


def _specials_row_by_row(builder: _RowBuilder, n_rows: int, group_to_global: dict) -> tuple:
    """REFERENCE: the P2P and collective fields worked out row by row (columns()' old loop),
    as (names, peer, tag, nbytes, name_codes) from the builder's specials."""
    from tracekit.ingest.kineto_comm import _gloo_p2p_args, _nccl_comm_args
    from tracekit.ingest.kineto_rows import _nccl_args
    from tracekit.ingest.kineto_stream import decode_shapes

    names = np.concatenate([part[2] for part in builder.parts]).copy()
    peer, tag, nbytes = (np.full(n_rows, -1, dtype=np.int64) for _ in range(3))
    name_codes = dict(builder.name_codes)
    for row, name, args in builder.specials():
        if name == "record_param_comms":
            new_name, p, b, s = _nccl_comm_args(_nccl_args(args) if isinstance(args, tuple) else args, group_to_global)
            code = name_codes.setdefault(new_name, len(name_codes))
            names[row], peer[row], nbytes[row], tag[row] = code, p, b, s
        else:
            fields = decode_shapes(args) if isinstance(args, tuple) else args
            peer[row], tag[row], nbytes[row] = _gloo_p2p_args(fields, group_to_global.get("0"))
    return names, peer, tag, nbytes, list(name_codes)


def _comm(name: str, **args) -> dict:
    return {**_X, "name": name, "args": args}


def _apart(*elements: dict) -> bytes:
    """Elements one us apart (exact repeats would be dropped as duplicates)."""
    return _run(*({**e, "ts": 1000 + i} for i, e in enumerate(elements)))


_COMM_RUN = _apart(
    _comm("record_param_comms", **{"Collective name": "recv", "Src Rank": 1, "In msg nelems": 8, "dtype": "Float"}),
    _X,
    _comm("record_param_comms", **{"Collective name": "send", "Dst Rank": 1, "Out msg nelems": 8, "dtype": "Float"}),
    _comm("record_param_comms", **{"Collective name": "recv", "Src Rank": 1, "In msg nelems": 8, "dtype": "Float"}),
    _comm("record_param_comms", **{"Collective name": "allreduce", "In msg nelems": 4, "dtype": "BFloat16"}),
    _comm("record_param_comms", **{"Collective name": "send", "Dst Rank": 1.0}),  # a float: its own kind
    _comm("record_param_comms", **{"Collective name": "send", "Dst Rank": 1.0}),
    {**_X, "name": "record_param_comms"},  # no args
    _comm("c10d::send", **{"Concrete Inputs": ["", "", "1", "7"], "Input Dims": [[4, 4]], "Input type": ["Float"]}),
    _comm("c10d::recv_", **{"Concrete Inputs": ["", "", "1", "7"], "Input Dims": [[4, 4]], "Input type": ["Float"]}),
    _comm("c10d::send", **{"Concrete Inputs": ["", "", "1", "7"], "Input Dims": [[4, 4]], "Input type": ["Float"]}),
    _comm("c10d::recv_", **{"Concrete Inputs": ["", "", "0", "3"], "Input Dims": [[2]], "Input type": ["Float"]}),
)


@pytest.mark.parametrize("native", [False, True])
def test_comm_fields_are_worked_out_once_per_kind_as_row_by_row(native):
    if native and not kineto_native.available():
        pytest.skip("the native scanner is not built")
    builder = _RowBuilder()
    if native:
        scanned = builder.native_scanner().scan(_COMM_RUN + b"]", last=True)
        assert scanned is not None
        builder.add(scanned)
    else:
        assert _python_add(builder, _COMM_RUN) == "columns"
    kinds = len(builder.special_keys)
    # repeats share a kind; args given as a dict (a float field, no args) are each their own
    assert len(builder.specials()) == 11 and kinds == 9
    group_to_global = {"0": [0, 1]}
    names, peer, tag, nbytes, name_codes = _specials_row_by_row(builder, builder.n_rows, group_to_global)
    columns = builder.columns(0, group_to_global, rank=0, file_id=0)
    assert list(builder.name_codes) == name_codes  # new names coded in the order of their first row
    assert np.array_equal(columns.codes["name"], names)
    for key, want in (("peer", peer), ("tag", tag), ("nbytes", nbytes)):
        got = columns.numbers[key]
        assert np.array_equal(got, want), (key, got, want)


# -- keys read from the memo of the last elements' keys --------------------------------------------
#
# The scanner remembers the bytes of each key of the last elements (whitespace, quoted key, ':')
# and takes a key from that memo where the same bytes come again. Elements written alike, then
# one changed at a key: the scanner answers exactly as the Python path reads, or declines.


def _layout(element: dict, args: dict | None = None) -> bytes:
    """``element`` as Kineto writes it: a key per line, args on one line."""
    lines = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in element.items()]
    if args is not None:
        lines.append(f'    "args": {json.dumps(args, separators=(",", ":"))}')
    return ("{\n" + ",\n".join(lines) + "\n  }").encode()


_ARGS = {"External id": 3076, "Ev Idx": 3, "Sequence number": 12}
_LAID_OUT = _layout(_X, _ARGS)
_MEMO_VARIANTS = {
    "the same again": _LAID_OUT,
    "more whitespace after a colon": _LAID_OUT.replace(b'"ts": ', b'"ts":   '),
    "whitespace before a colon": _LAID_OUT.replace(b'"ts": ', b'"ts" : '),
    "a longer key where one was": _LAID_OUT.replace(b'"pid": ', b'"pidx": '),
    "a shorter key where one was": _LAID_OUT.replace(b'"dur": ', b'"du": '),
    "another known key where one was": _LAID_OUT.replace(b'"pid": 1', b'"tid": 1'),
    "a tab for the spaces": _LAID_OUT.replace(b'\n    "name"', b'\n\t"name"'),
    "an escaped key": _LAID_OUT.replace(b'"cat": ', b'"c\\u0061t": '),
    "a key repeated": _LAID_OUT.replace(b'"pid": 1,', b'"pid": 1,\n    "pid": 1,'),
    "a key missing": _LAID_OUT.replace(b'\n    "dur": 2.25,', b""),
    "keys swapped": _LAID_OUT.replace(b'"pid": 1,\n    "tid": 2', b'"tid": 2,\n    "pid": 1'),
    "an args key changed": _LAID_OUT.replace(b'"Ev Idx":3', b'"Ev Idx ":3'),
    "an args key repeated": _LAID_OUT.replace(b'"Ev Idx":3', b'"External id":3'),
    "args keys spaced": _LAID_OUT.replace(b'{"External id":', b'{ "External id" :'),
    "no args": _layout(_X),
    "another phase": _layout({"ph": "i", "cat": "cpu_instant_event", "name": "x", "pid": 1, "tid": 2, "ts": 5}),
    "a flow end": _layout({"ph": "f", "id": 9, "pid": 1, "tid": 2, "ts": 5, "cat": "ac2g", "name": "x", "bp": "e"}),
    "ph not first": _layout({"cat": "cpu_op", "ph": "X", "name": "n", "pid": 1, "tid": 2, "ts": 7}, _ARGS),
    "a trailing comma": _LAID_OUT.replace(b"\n  }", b",\n  }"),
}


# (declined by the generic key scan too; a trailing comma is no JSON at all)
_MEMO_DECLINED = {
    "an escaped key",
    "a key repeated",
    "another known key where one was",
    "an args key repeated",
    "a trailing comma",
}


def _memo_check(native: _RowBuilder, scanner, python: _RowBuilder, run: bytes) -> bool:
    """Add ``run`` both ways (:func:`_add_both_ways`); whether the scanner answered."""
    try:
        decode_elements(b"[" + run + b"]")
    except kineto_stream._BadCut:  # not JSON: the scanner must not answer for it either
        assert scanner.scan(run + b"]", last=True) is None
        return False
    return _add_both_ways(native, scanner, python, run)[1] is not None


@needs_scanner
@pytest.mark.parametrize("name", sorted(_MEMO_VARIANTS))
def test_keys_taken_from_the_memo_read_as_the_python_path_reads_them(name):
    native, python = _RowBuilder(), _RowBuilder()
    scanner = native.native_scanner()  # one scanner: its memo carries over
    seam = b",\n  "
    primer = seam.join([_LAID_OUT] * 3)
    assert _memo_check(native, scanner, python, primer)
    variant = _MEMO_VARIANTS[name]
    # the variant after elements alike (keys from the memo), then alike ones again; answered
    # wherever the generic key scan answers (declining would be safe, but slow)
    answer = name not in _MEMO_DECLINED
    assert _memo_check(native, scanner, python, seam.join([_LAID_OUT, variant, _LAID_OUT])) == answer
    assert _memo_check(native, scanner, python, seam.join([variant, variant])) == answer
    assert _memo_check(native, scanner, python, primer)


@needs_scanner
def test_keys_the_scanner_must_decline_are_declined_after_the_memo_is_filled():
    scanner = _RowBuilder().native_scanner()
    seam = b",\n  "
    assert scanner.scan(seam.join([_LAID_OUT] * 3) + b"]", last=True) is not None
    for name, why in (
        ("an escaped key", "an element key with an escape"),
        ("a key repeated", "a field given twice"),
        ("an args key repeated", "an args field given twice"),
    ):
        assert scanner.scan(seam.join([_LAID_OUT, _MEMO_VARIANTS[name]]) + b"]", last=True) is None, name
        assert scanner._scanner.why.startswith(why), (name, scanner._scanner.why)


_KEY_MUTATIONS = [
    "ws after colon",
    "ws before colon",
    "longer key",
    "other key",
    "escaped key",
    "repeat",
    "drop",
    "swap",
    "lead ws",
    "odd value",
    "args key",
    "args repeat",
    "seam",
]


@st.composite
def _templated_runs(draw) -> list[bytes]:
    """Runs of elements written alike (one or two layouts, as a profiler writes), a share of
    them changed at one key: the memo's hits and near misses."""
    rnd = random.Random(draw(_SEEDS))
    share = draw(st.sampled_from([0.0, 0.1, 0.3, 1.0]))

    def template() -> list[list[str]]:
        text = _element(random.Random(rnd.random()), 0.0)
        fields = json.loads(text) if text.startswith("{") else {"ph": "X", "ts": 1}
        if not isinstance(fields, dict):
            fields = {"ph": "X", "ts": 1}
        lead, after = rnd.choice(["\n    ", " ", "", "\t"]), rnd.choice([" ", ""])
        return [[lead, json.dumps(k), "", after, json.dumps(v, separators=(",", ":"))] for k, v in fields.items()]

    layouts = [template() for _ in range(rnd.randint(1, 2))]
    seam = rnd.choice([",\n  ", ", ", ","])
    runs = []
    for _ in range(rnd.randint(1, 4)):
        texts = []
        for _ in range(rnd.randint(1, 12)):
            fields = [list(f) for f in rnd.choice(layouts)]
            this_seam = seam
            if fields and rnd.random() < share:
                k = rnd.randrange(len(fields))
                what = rnd.choice(_KEY_MUTATIONS)
                if what == "ws after colon":
                    fields[k][3] += rnd.choice([" ", "\n", "\t  "])
                elif what == "ws before colon":
                    fields[k][2] = rnd.choice([" ", "\t"])
                elif what == "longer key":
                    fields[k][1] = fields[k][1][:-1] + rnd.choice(["x", " ", "s"]) + '"'
                elif what == "other key":
                    fields[k][1] = json.dumps(
                        rnd.choice(["ph", "ts", "dur", "pid", "tid", "cat", "name", "args", "id"])
                    )
                elif what == "escaped key":
                    fields[k][1] = _escaped(json.loads(fields[k][1]), rnd, 0.5)
                elif what == "repeat":
                    fields.insert(k, list(fields[k]))
                elif what == "drop":
                    del fields[k]
                elif what == "swap" and len(fields) > 1:
                    j = rnd.randrange(len(fields))
                    fields[k], fields[j] = fields[j], fields[k]
                elif what == "lead ws":
                    fields[k][0] = rnd.choice(["\n  ", "\n     ", " \n    ", "\r\n    ", ""])
                elif what == "odd value":
                    fields[k][4] = _value(rnd)
                elif what in ("args key", "args repeat") and fields[k][1] == '"args"' and fields[k][4].startswith("{"):
                    args = json.loads(fields[k][4])
                    if isinstance(args, dict) and args:
                        key = rnd.choice(list(args))
                        text = fields[k][4]
                        old = json.dumps(key) + ":"
                        new = (
                            json.dumps(key + " ") if what == "args key" else json.dumps(rnd.choice(list(args)))
                        ) + ":"
                        fields[k][4] = text.replace(old, new, 1)
                elif what == "seam":
                    this_seam = rnd.choice([" ,\n  ", ",\n\t", ",  "])
            texts.append(("{" + ",".join("".join(f[:3]) + ":" + "".join(f[3:]) for f in fields) + "\n  }", this_seam))
        run = "".join(t + (s if i < len(texts) - 1 else "") for i, (t, s) in enumerate(texts))
        runs.append(run.encode("utf-8", "surrogatepass"))
    return runs


@needs_scanner
def test_elements_written_alike_read_the_same_when_one_changes_at_a_key():
    ways = Counter()

    @_DRAWN_RUNS
    @given(runs=_templated_runs())
    def check(runs):
        native, python = _RowBuilder(), _RowBuilder()
        scanner = native.native_scanner()
        for run in runs:
            try:
                decode_elements(b"[" + run + b"]")
            except kineto_stream._BadCut:
                ways["not JSON"] += 1
                continue
            ways["answered" if _memo_check(native, scanner, python, run) else "declined"] += 1

    check()
    assert ways["answered"] > 200 and ways["declined"] > 20, ways


def _decimal(rnd) -> str:
    """A JSON number of 1 to 25 significant digits (many past the 15-17 a double keeps)."""
    digits = "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 25))).lstrip("0") or "0"
    point = rnd.randint(0, len(digits))
    text = (digits[:point] or "0") + "." + (digits[point:] or "0")
    if rnd.random() < 0.3:
        text += rnd.choice("eE") + rnd.choice(["", "+", "-"]) + str(rnd.randint(0, 40))
    return rnd.choice(["", "-"]) + text


@needs_scanner
def test_numbers_are_read_as_msgspec_reads_them():
    """Each float exactly (the time base probe keeps the value itself), and as a time in ns."""
    rnd = random.Random(11)
    scanner = _RowBuilder().native_scanner()
    read = 0
    for _ in range(20_000):
        text = _decimal(rnd)
        run = b'{"ph": "X", "cat": "python_function", "ts": ' + text.encode() + b"}"
        scanned = scanner.scan(run + b"]", last=True)
        if scanned is None:
            assert scanner._scanner.why == "a float beyond 1e300", text
            continue
        want = msgspec.json.decode(text.encode())
        assert scanned.first_ts is not None and type(scanned.first_ts[1]) is type(want), text
        assert scanned.first_ts[1].hex() == want.hex(), text
        read += 1
    assert read > 15_000
    times = [_decimal(rnd) for _ in range(20_000)]
    times = [t for t in times if abs(float(t)) < 2.0**52]
    run = ", ".join(f'{{"ph": "X", "cat": "kernel", "ts": {t}, "dur": {t.lstrip("-")}}}' for t in times).encode()
    _scanned_as_python(run)


@needs_scanner
def test_integers_of_every_length_are_read_as_the_python_path_reads_them():
    """Integer times and ids of 1 to 18 digits (the scanner reads up to eight digits at a step),
    with and without a sign, as times, durations and correlation ids."""
    rnd = random.Random(12)
    elements = []
    for _ in range(20_000):
        ts = rnd.choice(["", "-"]) + str(rnd.randint(0, 10 ** rnd.randint(0, 15)))
        dur = str(rnd.randint(0, 10 ** rnd.randint(0, 15)))
        corr = str(rnd.randint(0, 10 ** rnd.randint(1, 18) - 1))
        elements.append(
            f'{{"ph": "X", "cat": "kernel", "name": "k", "ts": {ts}, "dur": {dur}, "args": {{"correlation": {corr}}}}}'
        )
    _scanned_as_python(", ".join(elements).encode())


# -- used where built, off with TRACEKIT_NATIVE=0 ------------------------------------------------


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def test_the_scanner_is_built_where_a_compiler_is():
    if not _compiler():
        pytest.skip("no C compiler here: tracekit installs without its native scanner")
    assert kineto_native.available(), "a C compiler is here but tracekit.ingest._kineto_scan was not built"


@needs_scanner
def test_read_kineto_uses_the_scanner_and_TRACEKIT_NATIVE_0_turns_it_off(monkeypatch):
    path = SAMPLES / "1f1b" / "rank0.json.gz"
    for setting, used in (("1", True), (None, True), ("0", False), (" 0 ", False)):
        if setting is None:
            monkeypatch.delenv("TRACEKIT_NATIVE", raising=False)
        else:
            monkeypatch.setenv("TRACEKIT_NATIVE", setting)
        assert (_RowBuilder().native_scanner() is not None) == used
        before = Counter(kineto_native.RUNS)
        read_kineto(path, 0)
        answered = kineto_native.RUNS["answered"] - before["answered"]
        assert (answered > 0) == used, (setting, answered)


# -- begin/end pairs (issue #28) -------------------------------------------------------------


@pytest.mark.parametrize("on", [True, False], ids=["scanner", "python"])
@pytest.mark.parametrize("chunk_bytes", [None, 4096], ids=["one-chunk", "small-chunks"])
def test_begin_end_duration_events_are_counted_and_said_both_ways(tmp_path, on, chunk_bytes):
    """generated_begin_end: sample_traces/1f1b rank 0 with its first 200 complete events
    also written as B/E pairs (other Chrome-trace writers do): those were skipped without a
    word. Both paths count them (and the same rows are read either way)."""
    doc = json.loads(gzip.decompress((SAMPLES / "1f1b" / "rank0.json.gz").read_bytes()))
    complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"][:200]
    pairs = []
    for e in complete:
        pairs.append({**{k: v for k, v in e.items() if k != "dur"}, "ph": "B"})
        pairs.append({"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e.get("dur", 0)})
    doc["traceEvents"] = doc["traceEvents"] + pairs
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    with native_scanner(on, chunk_bytes):
        trace, columns = read_kineto(path, 0)
        _, plain = read_kineto(SAMPLES / "1f1b" / "rank0.json.gz", 0)
    said = [w for w in trace.warnings if "begin/end" in w]
    assert said == [
        "rank0.json: skipped 400 duration events written as begin/end pairs (ph B and E): tracekit reads "
        "complete events (ph X), as PyTorch's profiler writes them, so the work they mark is not counted; "
        "export the trace with complete events"
    ]
    assert len(columns) == len(plain)
