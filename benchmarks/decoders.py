"""Which JSON decoder for Kineto traces: measured on real traces, not assumed.

For each file (decompressed once; gzip time is not counted here): decode time (best of 3)
and peak Python memory (tracemalloc, a separate run) of

- ``json``       stdlib ``json.loads`` of the whole document (what HTA 0.5.0 uses)
- ``orjson``     ``orjson.loads`` of the whole document (tracekit before streaming)
- ``msgspec``    ``msgspec.json.decode`` of the whole document into plain objects
- ``msgspec-typed``  msgspec into tracekit's ``RawEvent`` structs (only the fields read;
                 shape lists kept as raw bytes), whole document
- ``pyarrow``    ``pyarrow.json.read_json`` with an explicit schema, given the events as
                 newline-delimited JSON (Kineto does not write that: the conversion is not
                 counted, which favours pyarrow)
- ``tracekit``   the whole parse as shipped: streamed typed decoding from the ``.gz`` file,
                 rows, nesting depth (gzip included)

Run: ``python benchmarks/decoders.py`` (add file paths to measure others).
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import sys
import time
import tracemalloc
from pathlib import Path

import msgspec
import orjson

from tracekit.ingest.kineto import read_kineto
from tracekit.ingest.kineto_stream import RawEvent

try:  # the inflater tracekit's parser uses
    from isal import isal_zlib as _INFLATE

    INFLATER = "ISA-L"
except ImportError:
    import zlib as _INFLATE

    INFLATER = "zlib"

ROOT = Path(__file__).resolve().parents[1]


class _Document(msgspec.Struct):
    traceEvents: list[RawEvent]


_TYPED = msgspec.json.Decoder(_Document)


def _typed(data: bytes):
    """tracekit's typed structs (only the fields read); a document with an event the structs
    do not take (an instant "i") is decoded generically instead, as tracekit's parser does
    for such a run of events."""
    try:
        return _TYPED.decode(data)
    except msgspec.ValidationError:
        return orjson.loads(data)


# Whole-document decoders; "msgspec-typed" builds only the fields tracekit reads, so it is
# the floor for any decoder of those fields.
WHOLE_DOCUMENT = {"orjson": orjson.loads, "msgspec": msgspec.json.decode, "msgspec-typed": _typed}


def gunzip_decode(job: tuple[Path, str]) -> int:
    """Decompress one .json.gz file and decode it with the named decoder (``"none"``: only
    decompress); the number of bytes of JSON (the decoded document is dropped). For
    ``bench.py``'s decode limit. It inflates with what tracekit's parser uses (ISA-L where
    installed, else zlib), so the comparison is decoder against decoder."""
    path, name = job
    data = _INFLATE.decompress(path.read_bytes(), 16 + 15)
    if name != "none":
        WHOLE_DOCUMENT[name](data)
    return len(data)


def _pyarrow(ndjson: bytes):
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema(
        [
            ("ph", pa.string()),
            ("cat", pa.string()),
            ("name", pa.string()),
            ("ts", pa.float64()),
            ("dur", pa.float64()),
            ("pid", pa.int64()),
            ("tid", pa.int64()),
        ]
    )
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(io.BytesIO(ndjson), parse_options=options)


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
        del result
    return min(times)


def _peak(fn) -> float:
    gc.collect()
    tracemalloc.start()
    result = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    return peak / 1e6


def measure(path: Path) -> None:
    raw = path.read_bytes()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    events = orjson.loads(data)["traceEvents"]
    ndjson = b"\n".join(orjson.dumps(e) for e in events)
    mb = len(data) / 1e6
    print(f"\n{path.parent.name}/{path.name}: {mb:.1f} MB of JSON, {len(events)} events")
    print(f"  {'decoder':15} {'s':>7} {'MB/s':>7} {'peak MB':>8}")
    candidates = {
        "json": lambda: json.loads(data),
        "orjson": lambda: orjson.loads(data),
        "msgspec": lambda: msgspec.json.decode(data),
        "msgspec-typed": lambda: _TYPED.decode(data),
        "pyarrow": lambda: _pyarrow(ndjson),
        "tracekit": lambda: read_kineto(path, 0),
    }
    del events
    for name, fn in candidates.items():
        try:
            seconds = _best(fn)
            peak = _peak(fn)
        except Exception as err:  # pyarrow refuses mixed-type columns (pid "Spans" vs 123)
            print(f"  {name:15} failed: {type(err).__name__}: {str(err)[:90]}")
            continue
        print(f"  {name:15} {seconds:7.3f} {mb / seconds:7.0f} {peak:8.1f}")


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        paths = [
            sorted((ROOT / "sample_traces" / run).glob("rank0.json.gz"))[0]
            for run in ("1f1b", "interleaved1f1b", "zbv")
        ]
        shared = ROOT.parent / "shared" / "real-traces" / "kineto-gpu"
        paths += [
            shared / "hta_df_index_resolver_df_index_resolver.json.gz",
            shared / "hta_negative_queue_length_values_check_rank0.json.gz",
        ]
    for path in paths:
        if path.exists():
            measure(path)
        else:
            print(f"\n{path}: absent, skipped")


if __name__ == "__main__":
    main()
