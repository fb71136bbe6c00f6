"""Streaming Kineto reader: same rows as decoding the whole document, bounded memory,
odd layouts, truncation at any point, progress in bytes."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit.cli import main
from tracekit.errors import TraceFormatError
from tracekit.ingest import kineto_rows, kineto_stream
from tracekit.ingest.kineto import parse_kineto
from tracekit.ingest.kineto_stream import ChromeTraceStream

KEPT = {"cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "runtime"}


def _expected_rows(doc: dict) -> pd.DataFrame:
    """The rows the Chrome-trace rules give, computed plainly from the whole document."""
    base = doc.get("baseTimeNanoseconds") or 0
    rows = []
    for index, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        cat = {"cuda_runtime": "runtime", "cuda_driver": "runtime"}.get(cat, cat)  # CUDA API calls
        ts, dur = e.get("ts"), e.get("dur", 0)
        if cat not in KEPT or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        args = e.get("args") or {}
        seq = args.get("Sequence number", -1)
        start = base + round(ts * 1000)
        name = str(e.get("name", ""))
        if cat == "cpu_op" and name == "record_param_comms":  # named by its collective
            name = f"record_param_comms:{args.get('Collective name', 'unknown')}"
        if dur < 0:  # ends before it starts: cannot be real
            continue
        rows.append(
            {
                "source_index": index,
                "cat": cat,
                "name": name,
                "start_ns": start,
                "end_ns": start + round(dur * 1000),
                "seq": seq if isinstance(seq, int) else -1,
            }
        )
    frame = pd.DataFrame(rows, columns=["source_index", "cat", "name", "start_ns", "end_ns", "seq"])
    # nor can a row more than a day from the file's median start
    median = frame["start_ns"].median()
    day_ns = 24 * 3600 * 10**9
    near = ((frame["start_ns"] - median).abs() <= day_ns) & ((frame["end_ns"] - median).abs() <= day_ns)
    return frame[near].reset_index(drop=True)


def _check_against_whole_document(path: Path, doc: dict) -> None:
    _, events = parse_kineto(path, 0)
    expected = _expected_rows(doc)
    got = events[expected.columns].astype({"cat": object, "name": object}).reset_index(drop=True)
    expected = expected.astype({"source_index": "int64", "start_ns": "int64", "end_ns": "int64", "seq": "int64"})
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def _sample_file() -> Path:
    return sorted((SAMPLES / "1f1b").glob("rank*.json.gz"))[0]


def test_sample_trace_rows_match_whole_document_rules(monkeypatch):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", 64 << 10)  # many cuts in one file
    path = _sample_file()
    _check_against_whole_document(path, orjson.loads(gzip.decompress(path.read_bytes())))


def test_real_gpu_trace_rows_match_whole_document_rules():
    path = shared_or_skip("kineto-gpu", "hta_df_index_resolver_df_index_resolver.json.gz")
    _check_against_whole_document(path, orjson.loads(gzip.decompress(path.read_bytes())))


@pytest.mark.parametrize("chunk", [4 << 10, 97_531, 1 << 20, 64 << 20])
def test_chunk_size_never_changes_the_rows(monkeypatch, chunk):
    path = _sample_file()
    trace_ref, ref = parse_kineto(path, 0)
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", chunk)
    trace, got = parse_kineto(path, 0)
    pd.testing.assert_frame_equal(got, ref)
    assert trace.describe() == trace_ref.describe()


def test_column_and_event_by_event_paths_agree(monkeypatch):
    monkeypatch.setenv("TRACEKIT_NATIVE", "0")  # the two Python paths (tests/test_kineto_native.py: the scanner)
    path = shared_or_skip("kineto-gpu", "hta_nccl_parser_config_nccl_data.json.gz")
    trace_fast, fast = parse_kineto(path, 0)
    calls = []

    def irregular(self, batch):
        calls.append(len(batch))
        raise kineto_rows._Irregular

    monkeypatch.setattr(kineto_rows._RowBuilder, "_add_columns", irregular)
    trace_slow, slow = parse_kineto(path, 0)
    assert calls, "the event-by-event path was not taken"
    pd.testing.assert_frame_equal(fast, slow)
    assert trace_fast.describe() == trace_slow.describe()


def _write(path: Path, text: str | bytes) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _event(i: int, **extra) -> dict:
    event = {
        "ph": "X",
        "cat": "cpu_op",
        "name": f"op{i % 7}",
        "pid": 1,
        "tid": 1,
        "ts": 1000.5 + i * 10,
        "dur": 5.25,
        "args": {"Sequence number": i, "Input Dims": [[i, 2]]},
    }
    event.update(extra)
    return event


def test_header_fields_after_trace_events_are_read(tmp_path):
    # Newer Kineto writes baseTimeNanoseconds after traceEvents: the clock comes from there.
    events = ",\n".join(json.dumps(_event(i)) for i in range(50))
    text = (
        '{"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4},\n'
        f'"traceEvents": [\n{events}\n],\n"baseTimeNanoseconds": 1700000000000000000, "traceName": "x"}}'
    )
    path = _write(tmp_path / "trace.json", text)
    trace, got = parse_kineto(path, 0)
    assert trace.rank == 3 and trace.world_size == 4 and trace.clock == "unix"
    assert got["start_ns"].iloc[0] == 1700000000000000000 + 1000500
    _check_against_whole_document(path, json.loads(text))


@pytest.mark.parametrize("layout", ["minified", "bare-array", "events-first", "odd-values"])
def test_odd_layouts_and_values_follow_the_format_rules(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", 1 << 10)
    events = [_event(i) for i in range(300)]
    if layout == "odd-values":
        events[5] = _event(5, pid="stream 7", tid="Trace 2")
        events[6] = _event(6, cat="Kernel", ts=1669783687493315, dur=51)  # epoch us among relative: dropped
        events[7] = _event(7, name=None, args=None)
        events[8] = _event(8, ts=None)  # dropped
        events[9] = 42  # not an event
        events[10] = _event(10, args={"Sequence number": "x", "note": "a },{ b"})
        events[11] = {"ph": "i", "name": "instant", "ts": 1.0}
        events[12] = _event(12, dur=-3.0)  # dropped
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 1},
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }
    if layout == "minified":
        text = json.dumps(doc, separators=(",", ":"))
    elif layout == "bare-array":
        text = json.dumps(events)
        doc = {"traceEvents": events}
    elif layout == "events-first":
        text = json.dumps(
            {"traceEvents": events, "distributedInfo": {"rank": 1}, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        )
    else:
        text = json.dumps(doc, indent=2)
    path = _write(tmp_path / ("rank1.json.gz" if layout == "minified" else "rank1.json"), text)
    _check_against_whole_document(path, doc)
    trace, got = parse_kineto(path, 0)
    assert trace.rank == 1 and trace.n_events_raw == len(events)
    if layout == "odd-values":
        row = got.set_index("source_index")
        assert row.loc[5, "pid"] == 7 and row.loc[5, "tid"] == 2
        assert row.loc[7, "name"] == "None"
        assert not {6, 8, 9, 12} & set(row.index)
        assert any(
            "dropped 3 of 298 events that cannot be real (1 with a time that is not a number, "
            "overflows int64 ns or lies before the capture began, 1 with end before start, 1 reaching more than 24 h"
            in w
            for w in trace.warnings
        ), trace.warnings


def test_truncation_anywhere_keeps_every_complete_event(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", 2 << 10)
    events = [_event(i) for i in range(120)]
    text = '{"distributedInfo": {"rank": 0}, "traceEvents": [\n' + ",\n".join(json.dumps(e) for e in events)
    ends = []  # where each event's text ends
    pos = text.index("[") + 2
    for e in events:
        pos += len(json.dumps(e))
        ends.append(pos)
        pos += 2
    for cut in range(text.index("[") + 1, len(text), 397):
        path = _write(tmp_path / "rank0.json", text[:cut])
        complete = sum(1 for end in ends if end <= cut)
        if not complete:  # nothing to salvage: refused, never read as a rank that did nothing
            with pytest.raises(TraceFormatError, match="damaged before its first complete event"):
                parse_kineto(path, 0)
            continue
        trace, got = parse_kineto(path, 0)
        assert trace.truncated and any("ends early" in w for w in trace.warnings)
        assert trace.n_events_raw == complete, cut
        assert list(got["source_index"]) == list(range(complete)), cut


@pytest.mark.parametrize("cut", [None, 0.5, 0.999])
def test_isal_and_zlib_inflate_read_the_same_rows(tmp_path, monkeypatch, cut):
    """ISA-L's inflate (used when installed) and zlib's give the same rows and the same
    truncation verdict: on a whole file, on one of two gzip members, on a stream cut off."""
    zlib = pytest.importorskip("zlib")
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    data = _sample_file().read_bytes()
    if cut is None:  # two gzip members, as `cat a.gz b.gz` writes: the second holds the tail
        raw = gzip.decompress(data)
        half = raw.rindex(b"},", 0, len(raw) // 2) + 2
        data = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    else:
        data = data[: int(len(data) * cut)]
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data)
    read = []
    for inflate in (isal_zlib, zlib):
        monkeypatch.setattr(kineto_stream, "_inflate", inflate)
        read.append(parse_kineto(path, 0))
    (trace_isal, rows_isal), (trace_zlib, rows_zlib) = read
    pd.testing.assert_frame_equal(rows_isal, rows_zlib)
    assert trace_isal.describe() == trace_zlib.describe()
    assert trace_isal.truncated == (cut is not None)
    assert len(rows_isal) > 100


@pytest.mark.parametrize("inflater", ["isal.isal_zlib", "zlib"])
def test_a_damaged_gzip_stream_is_one_line_with_either_inflater(tmp_path, monkeypatch, inflater):
    monkeypatch.setattr(kineto_stream, "_inflate", pytest.importorskip(inflater))
    data = bytearray(_sample_file().read_bytes())
    data[200:260] = b"X" * 60  # deflate blocks overwritten just after the header
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="not a readable gzip file .*; check the file was copied whole"):
        parse_kineto(path, 0)


def test_memory_is_bounded_by_a_chunk_not_the_file(tmp_path):
    n_events = 80_000
    events = ",\n".join(json.dumps(_event(i)) for i in range(n_events))
    path = _write(tmp_path / "big.json", '{"traceEvents": [\n' + events + '\n], "baseTimeNanoseconds": 7}')
    size = path.stat().st_size
    chunk = 128 << 10
    stream = ChromeTraceStream(path, chunk_bytes=chunk)
    tracemalloc.start()
    n = sum(len(batch) for batch in stream)
    _, streamed_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == n_events and stream.header == {"baseTimeNanoseconds": 7}
    assert stream.peak_buffer < 3 * chunk < size / 20
    # Decoding the same document whole holds all of it: the bound above is not a given.
    tracemalloc.start()
    whole = orjson.loads(path.read_bytes())
    _, whole_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del whole
    # A chunk's decoded events (~10x its bytes) bound the streamed peak, whatever the size.
    assert streamed_peak < 24 * chunk < size / 3
    assert whole_peak > 3 * size


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_progress_reports_every_byte_of_the_file(tmp_path, monkeypatch, name):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto_stream, "READ_BYTES", 16 << 10)
    events = ",".join(json.dumps(_event(i)) for i in range(5000))
    path = _write(tmp_path / name, '{"traceEvents": [' + events + "]}")
    seen = []
    parse_kineto(path, 0, progress=seen.append)
    assert len(seen) > 1 and sum(seen) == path.stat().st_size


def test_cli_shows_a_byte_progress_bar_for_one_large_file(tmp_path):
    events = ",".join(json.dumps(_event(i)) for i in range(3000))
    path = _write(tmp_path / "rank0.json", '{"traceEvents": [' + events + "]}")
    result = CliRunner().invoke(main, ["analyze", str(path), "--progress", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "reading traces" in result.stderr


def test_events_are_typed_numpy_columns():
    _, events = parse_kineto(_sample_file(), 2)
    assert (events["file_id"] == 2).all()
    assert events["start_ns"].dtype == np.int64 and isinstance(events["name"].dtype, pd.CategoricalDtype)
