"""Finding a run's traces: stray files are skipped with one warning, broken traces still
fail, framework layouts in subfolders are found (the iteration taken is said), .nsys-rep
reports are read through an export into the cache, and bad --rank-from / --cache-dir
values are one line before anything is read."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit.cli import main
from tracekit.errors import RunLayoutError
from tracekit.ingest.discovery import find_traces
from tracekit.ingest.sniff import KINETO, NSYS_JSON, NSYS_SQLITE, trace_format


def _run(*args: str):
    return CliRunner().invoke(main, [*args, "--no-progress"])


def _one_error_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _analysis(*args: str) -> dict:
    result = _run("analyze", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _run_copy(where: Path, ranks=range(4), name: str = "rank{}.json.gz") -> Path:
    """Copies of sample_traces/1f1b's traces of ``ranks`` in ``where``, named ``name``."""
    where.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        shutil.copyfile(SAMPLES / "1f1b" / f"rank{rank}.json.gz", where / name.format(rank))
    return where


# -- files that are not traces ------------------------------------------------------------


def test_stray_json_beside_the_traces_is_skipped_with_one_warning(tmp_path):
    run = _run_copy(tmp_path / "run")
    reference = _analysis(str(SAMPLES / "1f1b"), "--no-cache")
    (run / "config.json").write_text(json.dumps({"lr": 3e-4, "layers": 16}))
    (run / "analysis.json").write_text(json.dumps(reference, indent=1))  # a --json output kept here
    (run / "baseline.json").write_text(json.dumps({"bubble_ratio": 0.3}))
    (run / "meta.json.gz").write_bytes(gzip.compress(b'{"host": "vm"}'))
    doc = _analysis(str(run), "--no-cache")
    skipped = [w for w in doc["warnings"] if w.startswith("skipped")]
    assert skipped == ["skipped 4 files that are not a trace: analysis.json, baseline.json, config.json, meta.json.gz"]
    assert doc["summary"] == reference["summary"]


def test_links_that_loop_or_point_nowhere_are_named_never_a_traceback(tmp_path):
    # a trace that is a link to itself, beside the other ranks' traces
    run = _run_copy(tmp_path / "run", ranks=(1, 2, 3))
    (run / "rank0.json.gz").symlink_to("rank0.json.gz")
    doc = _analysis(str(run), "--no-cache")
    assert doc["completeness"]["missing_ranks"] == [0]
    assert (
        "skipped 1 file that is not a trace: rank0.json.gz (a symbolic link that loops or points nowhere)"
        in doc["warnings"]
    )
    # the link given itself
    _one_error_line(_run("analyze", str(run / "rank0.json.gz")), "rank0.json.gz: a symbolic link that loops")
    # a folder link that loops, beside a folder of traces (os.scandir's is_dir raised ELOOP)
    nested = tmp_path / "nested"
    _run_copy(nested / "traces")
    (nested / "loop").symlink_to("loop")
    (nested / "gone").symlink_to("nowhere")
    assert _analysis(str(nested), "--no-cache")["summary"]["n_ranks"] == 4


def test_a_file_named_like_a_trace_that_is_broken_still_fails(tmp_path):
    """The repro of issue 11: printf x > rank2.json.gz is a broken trace, not a stray file."""
    run = _run_copy(tmp_path / "run")
    (run / "rank2.json.gz").write_bytes(b"x")
    _one_error_line(_run("analyze", str(run)), "rank2.json.gz")


@pytest.mark.parametrize(
    "name, content",
    [
        # no trace-like name, but the start of a Kineto document
        ("profile.json", b'{"schemaVersion": 1, "deviceProperties": [{"id": 0'),
        # a gzip stream that does not decompress: broken, whatever its name
        ("stuff.json.gz", b"\x1f\x8b\x08\x00" + b"\xff" * 64),
        ("rank0.pt.trace.json", b"not json"),
    ],
)
def test_a_file_that_claims_to_be_a_trace_by_content_fails(tmp_path, name, content):
    run = _run_copy(tmp_path / "run", ranks=(1, 2, 3))
    (run / name).write_bytes(content)
    _one_error_line(_run("analyze", str(run)), name)


def test_another_tools_sqlite_database_is_skipped_a_broken_one_fails(tmp_path):
    import sqlite3

    run = _run_copy(tmp_path / "run")
    with contextlib.closing(sqlite3.connect(run / "optuna.sqlite")) as db:
        db.execute("CREATE TABLE trials (id INTEGER, value REAL)")
        db.commit()
    doc = _analysis(str(run), "--no-cache")
    assert "skipped 1 file that is not a trace: optuna.sqlite" in doc["warnings"]
    (run / "optuna.sqlite").unlink()
    (run / "report.sqlite").write_bytes(b"not a database")
    _one_error_line(_run("analyze", str(run), "-j", "1"), "report.sqlite")


def test_only_json_that_is_not_a_trace_in_the_folder_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _one_error_line(_run("analyze", str(tmp_path)), "no trace files found", "config.json")


def test_real_traces_are_recognised_by_content_whatever_their_names():
    kineto = find_traces(shared_or_skip("kineto-gpu"))
    assert len(kineto.files) == 8 and set(kineto.formats.values()) == {KINETO} and not kineto.warnings
    nsys = find_traces(shared_or_skip("nsys", "cpu-only-nvtx"))
    assert sorted(nsys.formats.values()) == [NSYS_JSON] + [NSYS_SQLITE] * 3


def test_an_nsys_json_export_is_read_as_one(tmp_path):
    """It was read as a Kineto document and refused ("not valid JSON")."""
    export = shared_or_skip("nsys", "cpu-only-nvtx", "pp_sim_cpuonly_export2023.4.json")
    doc = _analysis(str(export), "--no-cache")
    assert {f["format"] for f in doc["files"]} == {"nsys-json"}


def test_generated_json_lookalikes_are_not_traces(tmp_path):
    """Generated files: JSON with a key or line shape near a trace's, but not one."""
    cases = {
        "data.json": b'{"data": [1, 2, 3]}',
        "types.json": b'[{"type": "X", "ts": 1}]',
        "nested.json": b'{"run": {"note": "traceEvents is a key we look for"}}',
        "value.json": b'{"rank_source": "distributedInfo", "quoted": "\\"schemaVersion\\": 1"}',
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        assert trace_format(tmp_path / name) is None, name


# -- subfolders -----------------------------------------------------------------------------


def _torchtitan(run: Path, iterations: list[int]) -> Path:
    for n in iterations:
        _run_copy(run / "profiling" / "traces" / f"iteration_{n}", name="rank{}_trace.json.gz")
    return run


def test_torchtitan_iterations_the_highest_is_taken_and_said(tmp_path):
    run = _torchtitan(tmp_path / "run", [2, 4, 6])
    doc = _analysis(str(run), "--no-cache")
    assert {Path(f["path"]).parent.name for f in doc["files"]} == {"iteration_6"}
    assert (
        "3 iterations found (iteration_2, iteration_4, iteration_6): analysed iteration_6; --iteration N to choose"
    ) in doc["warnings"]
    assert doc["summary"]["n_ranks"] == 4


def test_iteration_chooses_another(tmp_path):
    run = _torchtitan(tmp_path / "run", [2, 4, 10])
    doc = _analysis(str(run), "--no-cache", "--iteration", "4")
    assert {Path(f["path"]).parent.name for f in doc["files"]} == {"iteration_4"}
    # numbers sort as numbers: 10 is the highest, not 4
    assert "analysed iteration_10" in " ".join(_analysis(str(run), "--no-cache")["warnings"])


def test_an_iteration_that_is_not_there_is_one_line(tmp_path):
    run = _torchtitan(tmp_path / "run", [2, 4])
    _one_error_line(_run("analyze", str(run), "--iteration", "3"), "--iteration 3", "iteration_2, iteration_4")
    _one_error_line(_run("whatif", str(SAMPLES / "1f1b"), "--iteration", "3"), "--iteration 3", "drop --iteration")


def test_megatron_torch_profile_folder_is_found(tmp_path):
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    _run_copy(run / "torch_profile", name="rank-{}.json.gz")
    (run / "args.json").write_text("{}")
    doc = _analysis(str(run), "--no-cache")
    assert doc["summary"]["n_ranks"] == 4
    assert all("/torch_profile/rank-" in f["path"] for f in doc["files"])


def test_folders_of_different_ranks_make_one_run(tmp_path):
    run = tmp_path / "run"
    _run_copy(run / "node0", ranks=(0, 1))
    _run_copy(run / "node1", ranks=(2, 3))
    assert _analysis(str(run), "--no-cache")["summary"]["n_ranks"] == 4


def test_one_rank_in_two_folders_that_are_not_iterations_is_one_line(tmp_path):
    run = tmp_path / "run"
    _run_copy(run / "a")
    _run_copy(run / "b", ranks=(3,))
    _one_error_line(_run("analyze", str(run)), "rank 3", "a/rank3.json.gz", "b/rank3.json.gz")


def test_hidden_cache_and_too_deep_folders_are_not_searched(tmp_path):
    run = tmp_path / "run"
    _run_copy(run / ".old")
    _run_copy(run / "__pycache__")
    _run_copy(run / "a" / "b" / "c" / "d" / "e")
    with pytest.raises(RunLayoutError, match="no trace files found"):
        find_traces(run)
    _run_copy(run / "a" / "b" / "c" / "d")  # four levels down: found
    assert len(find_traces(run).files) == 4


def test_a_cache_inside_the_run_folder_is_not_read_as_traces(tmp_path):
    """tracekit refuses to write a cache into a run it reads, but a cache left inside a run
    folder by another run (here: written while analysing a copy) is not searched for traces."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _run_copy(run / "traces")
    _run_copy(elsewhere)
    cache = run / "tk-cache"
    _analysis(str(elsewhere), "--cache-dir", str(cache))
    assert list(cache.rglob("*.json")), "the cache holds JSON files the search could have read"
    first = _analysis(str(run), "--no-cache")
    assert not any(w.startswith("skipped") for w in first["warnings"])
    assert [Path(f["path"]).parent.name for f in first["files"]] == ["traces"] * len(first["files"])


def test_a_huge_tree_with_no_traces_is_refused_not_searched_forever(tmp_path, monkeypatch):
    import tracekit.ingest.discovery as discovery

    monkeypatch.setattr(discovery, "_SEARCH_ENTRIES", 50)
    for n in range(60):
        (tmp_path / f"dir{n}").mkdir()
    with pytest.raises(RunLayoutError, match="over 50 folders below"):
        find_traces(tmp_path)


# -- .nsys-rep -----------------------------------------------------------------------------


def _report_run(tmp_path: Path) -> Path:
    """A run folder holding one generated stand-in for an Nsight Systems report."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "nsys_report.nsys-rep").write_bytes(b"generated stand-in for an nsys report\n")
    return run


def test_nsys_rep_without_nsys_says_the_exact_command(tmp_path, monkeypatch):
    run = _report_run(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
    line = _one_error_line(_run("analyze", str(run)), "nsys_report.nsys-rep: an Nsight Systems report")
    report = run / "nsys_report.nsys-rep"
    assert line.endswith(f"nsys export --type sqlite -o {run / 'nsys_report.sqlite'} {report}")
    assert sorted(p.name for p in run.iterdir()) == ["nsys_report.nsys-rep"]


@pytest.fixture
def generated_nsys(tmp_path, monkeypatch) -> Path:
    """A generated stand-in for the nsys command: `nsys export` writes the sample SQLite
    export of sample_traces/nsys_1f1b to --output (or fails when told to), and logs each call."""
    tools = tmp_path / "tools"
    tools.mkdir()
    script = tools / "nsys"
    script.write_text(f"""#!{sys.executable}
import os, shutil, sys
args = sys.argv[1:]
with open(os.environ["GENERATED_NSYS_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
if os.environ.get("GENERATED_NSYS_FAIL"):
    print("ERROR: generated failure", file=sys.stderr)
    sys.exit(1)
shutil.copyfile({str(SAMPLES / "nsys_1f1b" / "nsys_report.sqlite")!r}, args[args.index("--output") + 1])
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GENERATED_NSYS_LOG", str(tmp_path / "nsys.log"))
    return tmp_path / "nsys.log"


def test_nsys_rep_is_exported_into_the_cache_never_beside_it(tmp_path, generated_nsys):
    run = _report_run(tmp_path)
    cache = tmp_path / "cache"
    reference = _analysis(str(SAMPLES / "nsys_1f1b" / "nsys_report.sqlite"), "--no-cache")
    doc = _analysis(str(run), "--cache-dir", str(cache))
    assert {f["path"] for f in doc["files"]} == {str(run / "nsys_report.nsys-rep")}  # one per rank
    assert doc["summary"] == reference["summary"]
    assert sorted(p.name for p in run.iterdir()) == ["nsys_report.nsys-rep"]
    exports = list((cache / "nsys").rglob("*.sqlite"))
    assert [p.name for p in exports] == ["nsys_report.sqlite"]
    assert not list((cache / "nsys").rglob(".export-*")), "a scratch folder was left behind"
    # the export is reused while it is whole; an altered one is made again
    _analysis(str(run), "--cache-dir", str(cache))
    assert len(generated_nsys.read_text().splitlines()) == 1
    exports[0].write_bytes(exports[0].read_bytes()[:4096])
    assert _analysis(str(run), "--cache-dir", str(cache), "--no-attribution")["summary"]["n_ranks"] == 4
    assert len(generated_nsys.read_text().splitlines()) == 2


def test_nsys_rep_without_a_cache_is_exported_to_a_temporary_folder(tmp_path, generated_nsys):
    run = _report_run(tmp_path)
    doc = _analysis(str(run), "--no-cache")
    assert doc["summary"]["n_ranks"] == 4
    output = generated_nsys.read_text().split()
    exported_to = Path(output[output.index("--output") + 1])
    assert run not in exported_to.parents


def test_nsys_export_that_fails_is_one_line(tmp_path, generated_nsys, monkeypatch):
    monkeypatch.setenv("GENERATED_NSYS_FAIL", "1")
    run = _report_run(tmp_path)
    _one_error_line(
        _run("analyze", str(run), "--cache-dir", str(tmp_path / "cache")),
        "nsys_report.nsys-rep: nsys export failed",
        "generated failure",
    )


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys (Nsight Systems CLI) is not on PATH")
def test_real_nsys_exports_a_report(tmp_path):
    reports = sorted(SAMPLES.rglob("*.nsys-rep")) + sorted(Path(shared_or_skip("nsys")).rglob("*.nsys-rep"))
    if not reports:
        pytest.skip("no .nsys-rep report to export beside the checkout")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(reports[0], run / reports[0].name)
    doc = _analysis(str(run), "--cache-dir", str(tmp_path / "cache"))
    assert doc["files"] and sorted(p.name for p in run.iterdir()) == [reports[0].name]


# -- --rank-from, --cache-dir ----------------------------------------------------------------


def test_rank_from_that_is_not_a_regex_is_one_line_before_any_parsing(tmp_path):
    run = _run_copy(tmp_path / "run")
    (run / "rank2.json.gz").write_bytes(b"x")  # parsing would fail on this file first
    _one_error_line(
        _run("analyze", str(run), "--rank-from", "("),
        "--rank-from '(': not a regular expression (missing ), unterminated subpattern at position 0)",
    )


def test_rank_from_without_a_group_or_matching_nothing_is_one_line(tmp_path):
    _one_error_line(_run("analyze", str(SAMPLES / "1f1b"), "--rank-from", r"rank\d"), "has no group")
    run = _run_copy(tmp_path / "run", ranks=(0, 1), name="worker-{}.json.gz")
    _run_copy(run, ranks=(2, 3))
    _one_error_line(
        _run("analyze", str(run), "--rank-from", r"worker-(\d+)"), "finds no rank in rank2.json.gz, rank3.json.gz"
    )


def test_cache_url_of_an_unknown_kind_is_one_line(tmp_path, monkeypatch):
    _one_error_line(
        _run("analyze", str(SAMPLES / "1f1b"), "--cache-dir", "nope://bucket/tk"), "--cache-dir nope://bucket/tk"
    )
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", "nope://bucket/tk")
    _one_error_line(_run("check", str(SAMPLES / "1f1b")), "$TRACEKIT_CACHE_DIR nope://bucket/tk")


def test_cache_url_without_fsspec_installed_is_one_line():
    """fsspec is blocked in a fresh process, as on an installation without it."""
    code = (
        "import sys; sys.modules['fsspec'] = None; from tracekit.cli import run; "
        f"sys.argv = ['tracekit', 'analyze', {str(SAMPLES / '1f1b')!r}, '--cache-dir', 's3://bucket/tk']; run()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cache-dir s3://bucket/tk" in lines[0] and "pip install fsspec s3fs" in lines[0]


@pytest.mark.parametrize("pattern", ["(.*)", "(rank)", "(r)ank"])
def test_a_rank_pattern_whose_group_is_no_number_is_one_line(tmp_path, pattern):
    """Found by fuzz/ (replay 1:1001): --rank-from '(.*)' was an internal error (int('rank0.json.gz'))."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    result = CliRunner().invoke(main, ["analyze", str(run), "--no-cache", "--rank-from", pattern])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: --rank-from"), lines
