"""Values that cannot be real are refused at ingest: rows dropped with a count and one
warning naming the file, headers that cannot be read refused in one line (exit 2) or
ignored with a warning, never a traceback or a silently wrong figure.

Every fixture here is generated: a copy of a real sample trace (sample_traces/1f1b/rank0,
sample_traces/nsys_1f1b) mutated in tmp_path, named ``generated_*``.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit import load
from tracekit.cli import main
from tracekit.ingest.kineto import read_kineto

RANK0 = SAMPLES / "1f1b" / "rank0.json.gz"
NSYS = SAMPLES / "nsys_1f1b" / "nsys_report.sqlite"
INT64_MAX = 2**63 - 1


def _sample_doc() -> dict:
    return orjson.loads(gzip.decompress(RANK0.read_bytes()))


def _complete_kept(doc: dict) -> list[int]:
    """Indexes of the events the parser keeps (complete cpu_op / user_annotation events)."""
    return [
        i
        for i, e in enumerate(doc["traceEvents"])
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
    ]


def generated_trace(tmp_path: Path, mutate, name: str = "rank0.json.gz", text: bytes | None = None) -> Path:
    """A copy of sample_traces/1f1b/rank0.json.gz with ``mutate(doc)`` applied (or the raw
    ``text`` given), gzipped again, alone in a folder."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    if text is None:
        doc = _sample_doc()
        mutate(doc)
        text = json.dumps(doc, allow_nan=True).encode()
    path = run / name
    path.write_bytes(gzip.compress(text))
    return path


def _analyze(target: Path, *options: str):
    return CliRunner().invoke(main, ["analyze", str(target), "--no-progress", "--no-cache", *options])


def _one_line_error(result, file_name: str) -> str:
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (result.exit_code, result.output[-800:], result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and file_name in lines[0], lines
    return lines[0]


def _warnings_of(path: Path) -> list[str]:
    trace, _ = read_kineto(path, 0)
    return trace.warnings


# ---------------------------------------------------------------------------- rows that cannot be real


def test_impossible_kineto_rows_are_dropped_with_one_warning(tmp_path):
    doc_before = _sample_doc()
    kept = _complete_kept(doc_before)

    def mutate(doc):
        events = doc["traceEvents"]
        events[kept[10]]["dur"] = -5  # ends before it starts
        events[kept[11]]["dur"] = -0.5
        events[kept[12]]["ts"] = 1e16  # 1e19 ns: beyond int64
        events[kept[13]]["ts"] = events[kept[13]]["ts"] + 3 * 24 * 3600 * 1e6  # three days away
        events.append(dict(events[kept[20]]))  # written twice

    path = generated_trace(tmp_path, mutate)
    trace, columns = read_kineto(path, 0)
    _, reference = read_kineto(RANK0, 0)
    assert len(columns) == len(reference) - 4
    dropped = [w for w in trace.warnings if "cannot be real" in w]
    assert dropped == [
        f"rank0.json.gz: dropped 5 of {len(reference) + 1:,} events that cannot be real (1 with a time "
        "that is not a number, overflows int64 ns or lies before the capture began, 2 with end before start, 1 reaching more than 24 h "
        "from the file's other events, 1 exact repeats of another event); analysed the rest"
    ]


def test_ratio_stays_a_ratio_when_a_kernel_starts_at_int64_max(tmp_path):
    """nsys kernel rows at INT64_MAX gave a bubble ratio of 152,676,151."""
    run = generated_nsys(
        tmp_path,
        "UPDATE NVTX_EVENTS SET start = 9223372036854775807 "
        "WHERE rowid IN (SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 3)",
    )
    result = _analyze(run, "--json")
    assert result.exit_code == 0, result.output[-800:]
    doc = json.loads(result.output)
    warning = [w for w in doc["warnings"] if "cannot be real" in w]
    assert len(warning) == 1 and warning[0].startswith("nsys_report.sqlite: dropped 3 of ")
    assert "3 with end before start" in warning[0] or "3 with a time" in warning[0]
    ratios = [r["bubble_ratio"] for r in doc["ranks"] if r.get("bubble_ratio") is not None]
    assert ratios and all(0 <= r <= 1 for r in ratios)


def test_ts_minus_infinity_in_a_damaged_file_is_dropped(tmp_path):
    """-Infinity is not JSON, but Python's decoder (the salvage path for damaged files) reads it."""
    doc = _sample_doc()
    kept = _complete_kept(doc)
    doc["traceEvents"][kept[5]]["ts"] = float("-inf")
    text = json.dumps(doc, allow_nan=True).encode()
    path = generated_trace(tmp_path, None, text=text[: len(text) - 200])  # cut short: salvaged
    warnings = _warnings_of(path)
    assert any("1 with a time that is not a number" in w for w in warnings), warnings


def test_int64_min_ts_among_float_ts_is_dropped(tmp_path):
    def mutate(doc):
        kept = _complete_kept(doc)
        doc["traceEvents"][kept[0]]["ts"] = 1.5 + doc["traceEvents"][kept[0]]["ts"]
        doc["traceEvents"][kept[7]]["ts"] = -(2**63)

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any("dropped 1 of" in w and "not a number, overflows" in w for w in warnings), warnings


def test_unknown_phases_are_counted_in_a_warning(tmp_path):
    def mutate(doc):
        doc["traceEvents"] += [{"ph": "Z", "name": "x", "ts": 1}, {"ph": "Z"}, {"name": "no phase"}]

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert (
        'rank0.json.gz: skipped 3 events of no Chrome-trace phase (ph "Z" x2, no ph x1); read the rest' in warnings
    ), warnings


def test_real_traces_get_no_new_warning():
    for path in [
        RANK0,
        shared_or_skip("kineto-gpu", "hta_negative_queue_length_values_check_rank0.json.gz"),
        shared_or_skip("kineto-gpu", "hta_distributed_info_unavailable_distributed_info_not_found.json.gz"),
    ]:
        assert not [w for w in _warnings_of(path) if "cannot be real" in w or "phase" in w], path


# ---------------------------------------------------------------------------- files with nothing to read


def test_chrome_trace_without_cat_is_refused_in_one_line(tmp_path):
    def mutate(doc):
        for event in doc["traceEvents"]:
            event.pop("cat", None)
        for key in list(doc):
            if key != "traceEvents":
                del doc[key]

    path = generated_trace(tmp_path, mutate, name="trace.json.gz")
    line = _one_line_error(_analyze(path.parent), "trace.json.gz")
    assert "events but none tracekit reads (no 'cat' field" in line and "Nsight Systems SQLite" in line


def test_legacy_autograd_export_is_refused_in_one_line(tmp_path):
    """The legacy autograd profiler's export_chrome_trace: a bare list, no 'cat'."""
    events = [
        {"name": "aten::mm", "ph": "X", "ts": 10.0 * i, "dur": 5.0, "tid": 0, "pid": "CPU functions", "args": {}}
        for i in range(50)
    ]
    path = generated_trace(tmp_path, None, name="legacy.json.gz", text=json.dumps(events).encode())
    line = _one_line_error(_analyze(path), "legacy.json.gz")
    assert "50 events but none tracekit reads" in line


def test_rank_that_recorded_nothing_is_not_refused(tmp_path):
    """A real rank whose profiler kept no op still writes Kineto's header: not an error here."""

    def mutate(doc):
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"]

    trace, columns = read_kineto(generated_trace(tmp_path, mutate), 0)
    assert len(columns) == 0 and trace.rank == 0


def test_file_whose_every_event_is_impossible_is_refused(tmp_path):
    def mutate(doc):
        for event in doc["traceEvents"]:
            if event.get("ph") == "X":
                event["dur"] = -1

    line = _one_line_error(_analyze(generated_trace(tmp_path, mutate)), "rank0.json.gz")
    assert "can be real" in line and "end before start" in line


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("value", [None, 7, True])
def test_trace_events_that_is_not_a_list_is_one_line(tmp_path, value):
    def mutate(doc):
        doc["traceEvents"] = value

    line = _one_line_error(_analyze(generated_trace(tmp_path, mutate)), "rank0.json.gz")
    assert "'traceEvents' is" in line and "not a list of events" in line


def test_world_size_written_as_text_is_read(tmp_path):
    def mutate(doc):
        doc["distributedInfo"]["world_size"] = "4"

    trace, _ = read_kineto(generated_trace(tmp_path, mutate), 0)
    assert trace.world_size == 4


@pytest.mark.parametrize("key", ["world_size", "rank"])
def test_header_count_no_job_has_is_one_line(tmp_path, key):
    def mutate(doc):
        doc["distributedInfo"][key] = 2**64

    line = _one_line_error(_analyze(generated_trace(tmp_path, mutate)), "rank0.json.gz")
    assert f"distributedInfo.{key} is {2**64}" in line and "which no job can have" in line


def test_bad_pg_config_entries_are_ignored_with_a_warning(tmp_path):
    def mutate(doc):
        doc["distributedInfo"]["pg_config"] = ["x", {"pg_name": "0", "ranks": ["a"]}]

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any("ignored 2 entries of distributedInfo.pg_config" in w for w in warnings), warnings


@pytest.mark.parametrize("base, shown", [(1e30, "1e+30"), (12, "12")])
def test_base_time_beyond_any_clock_is_ignored_with_a_warning(tmp_path, base, shown):
    def mutate(doc):
        doc["baseTimeNanoseconds"] = base

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any(
        f"baseTimeNanoseconds {shown} is no wall-clock time (not 2000-2100); ignored it" in w for w in warnings
    ), warnings


def test_nsys_session_start_that_is_no_wall_clock_time_is_a_warning(tmp_path):
    """Found by fuzz/ (replay 1:89): utcEpochNs '12' moved every absolute time to 1970 silently."""
    run = generated_nsys(tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = '12'")
    result = _analyze(run, "--json")
    assert result.exit_code == 0, result.output[-800:]
    assert "utcEpochNs 12 is no wall-clock time" in result.output


def test_tid_as_a_list_gets_an_id_of_its_own(tmp_path):
    def mutate(doc):
        for i in _complete_kept(doc)[:3]:
            doc["traceEvents"][i]["tid"] = [1, 2]

    trace, columns = read_kineto(generated_trace(tmp_path, mutate), 0)
    frame = columns.to_frame()
    assert len(frame) == len(read_kineto(RANK0, 0)[1]) and frame["tid"].head(1).notna().all()


def test_deeply_nested_header_is_no_recursion_error(tmp_path):
    nested = "[" * 100_000 + "]" * 100_000
    body = gzip.decompress(RANK0.read_bytes())
    text = b'{"deep": ' + nested.encode() + b", " + body.lstrip()[1:]
    path = generated_trace(tmp_path, None, text=text)
    line = _one_line_error(_analyze(path.parent), "rank0.json.gz")
    assert "nest deeper than Python can read" in line


def test_lone_surrogate_in_a_name_reaches_every_writer(tmp_path):
    """JSON may escape a lone surrogate; UTF-8 cannot hold one. The name reads as U+FFFD."""
    doc = _sample_doc()
    kept = _complete_kept(doc)
    doc["traceEvents"][kept[3]]["name"] = "op\ud800x"
    text = json.dumps(doc).encode()  # ensure_ascii: the surrogate stays an escape
    path = generated_trace(tmp_path, None, text=text[: len(text) - 100])  # damaged: Python's decoder
    run = load(path.parent)
    names = set(run.events["name"].astype(str))
    assert "op\ufffdx" in names and not any("\ud800" in n for n in names)
    out = tmp_path / "analysis.json"
    result = CliRunner().invoke(
        main, ["analyze", str(path.parent), "--no-progress", "-o", str(out), "--html", str(tmp_path / "r.html")]
    )
    assert result.exit_code == 0, result.output[-800:]
    json.loads(out.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- capture.json


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\xff\xfe{not utf-8", "is not UTF-8 text"),
        (b"42", "holds a JSON int, not an object"),
        (b"[1, 2]", "holds a JSON list, not an object"),
        (b'"a string"', "holds a JSON str, not an object"),
        (b"[" * 100_000, "is not JSON"),
        (b'{"p": NaN, "v": -Infinity}', "is not JSON (NaN"),
        (b'{"p": 1e999}', "is not JSON (NaN"),  # found by fuzz/ (replay 2749:22977:capture)
    ],
)
def test_capture_manifest_that_cannot_be_read_is_a_warning(tmp_path, content, problem):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    (run / "capture.json").write_bytes(content)
    result = _analyze(run, "--json")
    assert result.exit_code == 0, result.output[-800:]
    doc = json.loads(result.output)
    assert doc["capture"] is None
    assert any(w.startswith(f"capture.json {problem}") for w in doc["warnings"]), doc["warnings"]


# ---------------------------------------------------------------------------- nsys


def generated_nsys(tmp_path: Path, *statements: str, source: Path = NSYS) -> Path:
    """A copy of ``source`` (sample_traces/nsys_1f1b) with SQL ``statements`` applied, in
    its own folder of tmp_path."""
    run = tmp_path / "nsys_run"
    run.mkdir()
    target = run / "nsys_report.sqlite"
    shutil.copyfile(source, target)
    conn = sqlite3.connect(target)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return run


def test_nsys_times_stored_as_text_are_dropped_and_counted(tmp_path):
    run = generated_nsys(
        tmp_path,
        "UPDATE NVTX_EVENTS SET start = 'soon' "
        "WHERE rowid IN (SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 2)",
    )
    result = _analyze(run, "--json")
    assert result.exit_code == 0, result.output[-800:]
    warnings = json.loads(result.output)["warnings"]
    assert any(
        "nsys_report.sqlite: dropped 2 of" in w and "2 with a time that is not a number" in w for w in warnings
    ), warnings


def test_nsys_session_start_stored_as_text_is_a_warning(tmp_path):
    run = generated_nsys(tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'yesterday'")
    result = _analyze(run, "--json")
    assert result.exit_code == 0, result.output[-800:]
    warnings = json.loads(result.output)["warnings"]
    assert any(
        "nsys_report.sqlite: no session start time (its utcEpochNs 'yesterday' is not a time)" in w for w in warnings
    ), warnings


def test_nsys_missing_string_table_is_no_crash(tmp_path):
    run = generated_nsys(tmp_path, "DROP TABLE StringIds")
    result = _analyze(run)
    assert "Traceback" not in result.output and result.exit_code in (0, 2), result.output[-800:]
    if result.exit_code == 2:
        _one_line_error(result, "nsys_report.sqlite")


def test_html_of_an_nsys_run_whose_names_carry_a_suffix(tmp_path):
    """Names the reconstructor does not recognise (step marks included) leave nothing to
    measure on a CPU-only capture: one line naming the run, not a crash drawing empty bars."""
    run = generated_nsys(
        tmp_path, "UPDATE StringIds SET value = value || ' (suffix)' WHERE value NOT LIKE 'tracekit:rank%'"
    )
    html = tmp_path / "report.html"
    result = _analyze(run, "--html", str(html))
    assert "no work recorded" in _one_line_error(result, run.name)
    assert not html.exists()


def _first_p2p(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == "c10d::send" and e.get("ph") == "X")


@pytest.mark.parametrize(
    "mutation",
    [
        "cat as a list",
        "name as a dict",
        "ts as a list",
        "Concrete Inputs as a number",
        "Input Dims with a lone surrogate",
    ],
)
def test_odd_event_values_found_by_fuzzing_are_no_crash(tmp_path, mutation):
    """Each of these ended in exit 3 (TypeError, ValueError, UnicodeEncodeError)."""

    def mutate(doc):
        kept = _complete_kept(doc)
        event = doc["traceEvents"][kept[4]]
        if mutation == "cat as a list":
            event["cat"] = ["cpu_op"]
        elif mutation == "name as a dict":
            event["name"] = {"a": 1}
        elif mutation == "ts as a list":
            event["ts"] = [1, [2]]
        elif mutation == "Concrete Inputs as a number":
            _first_p2p(doc)["args"]["Concrete Inputs"] = 7
        else:
            _first_p2p(doc)["args"]["Input Dims"] = ["\ud800"]

    doc = _sample_doc()
    mutate(doc)
    text = json.dumps(doc).encode()
    if mutation == "Input Dims with a lone surrogate":
        text = text[: len(text) - 100]  # damaged: read by Python's decoder, which keeps the escape
    path = generated_trace(tmp_path, None, text=text)
    result = _analyze(path.parent, "--json")
    assert result.exit_code == 0, (result.output[-800:], result.exception)
    json.loads(result.output)


def test_nsys_cuda_call_whose_name_is_missing_is_no_crash(tmp_path):
    """A runtime row whose nameId is in no string table read as NaN and ended in exit 3."""
    source = shared_or_skip("nsys", "nsysai_mfu_2gpu_before.sqlite")
    run = generated_nsys(
        tmp_path,
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET nameId = -5 "
        "WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 3)",
        source=source,
    )
    result = _analyze(run, "--json")
    assert result.exit_code == 0, (result.output[-800:], result.exception)
    json.loads(result.output)


def test_nsys_json_export_given_as_a_file_is_read_as_one():
    """Its first line (the string table) is longer than the head the format is told from:
    it was taken for a broken Chrome trace ("no 'traceEvents' found")."""
    path = shared_or_skip("nsys", "cpu-only-nvtx", "pp_sim_cpuonly_export2023.4.json")
    result = _analyze(path, "--json")
    assert result.exit_code == 0, result.output[-800:]
    assert {f["format"] for f in json.loads(result.output)["files"]} == {"nsys-json"}


@pytest.mark.parametrize(
    "text",
    [
        b"[\x0b\xd7\xa6\x0f0\x0e\x0f\xd6\x1b\x9fV",
        b'{"schemaVersion": 1, "traceEvents": [',
        b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1',
    ],
)
def test_a_rank_damaged_before_its_first_event_is_refused_not_read_as_idle(tmp_path, text):
    """Found by the pool tests: random bytes that happen to start with '[' read as a bare
    event array cut short with 0 events, so the run went on as if that rank had done nothing
    (a 4-rank run analysed as p=3, exit 0)."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    (run / "rank3.json.gz").write_bytes(gzip.compress(text))
    _one_line_error(_analyze(run), "rank3.json.gz")


@pytest.mark.parametrize("field, value", [("ts", {}), ("dur", []), ("ts", None), ("dur", "12")])
def test_an_event_time_that_is_no_number_is_dropped_and_counted(tmp_path, field, value):
    """Found by fuzz/ (replays 1:820, 1:5943): such events vanished without a word and the
    bubble ratio moved."""

    def mutate(doc):
        for i in _complete_kept(doc)[:5]:
            doc["traceEvents"][i][field] = value

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any("dropped 5 of" in w and "not a number" in w for w in warnings), warnings


@pytest.mark.parametrize("value", [True, 2, ["cpu_op"]])
def test_an_event_category_that_is_no_text_is_counted(tmp_path, value):
    """Found by fuzz/ (replay 1:1654): events with cat true were skipped without a word."""

    def mutate(doc):
        for i in _complete_kept(doc)[:3]:
            doc["traceEvents"][i]["cat"] = value

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any("dropped 3 of" in w and "category ('cat') that is not text" in w for w in warnings), warnings


@pytest.mark.parametrize("field, value", [("name", {}), ("name", -1e30), ("pid", 1e30), ("tid", [1])])
def test_an_event_name_or_id_of_an_odd_type_is_read_with_a_warning(tmp_path, field, value):
    """Found by fuzz/ (replays 1:5957, 1:6551, 1:7269): such events were renamed or moved to
    another thread without a word."""

    def mutate(doc):
        for i in _complete_kept(doc)[:3]:
            doc["traceEvents"][i][field] = value

    warnings = _warnings_of(generated_trace(tmp_path, mutate))
    assert any("3 events with a name that is not text or a pid/tid that is no integer" in w for w in warnings), warnings
