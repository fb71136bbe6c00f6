"""Every output of every command goes through one writer (tracekit/output.py): it never writes
over the run being read (by name, symlink or hard link), writes through /dev/stdout, FIFOs and
devices, follows a symlink to its target, and on a full disk or an unwritable path ends in one
line, exit 2, no partial or temporary file and no "wrote"."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.output import OutputTarget

# Small and quick: one 4-rank sample, parsed in this process, nothing cached.
LOADING = ["--no-cache", "--no-progress", "-j", "1"]
CHECK_PASSES = ["--max-bubble", "0.99", "--no-config"]
SUMMARY = "$GITHUB_STEP_SUMMARY"


def _json_end(data: bytes, key: str, value=None) -> int | None:
    try:
        doc, end = json.JSONDecoder().raw_decode(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or key not in doc or (value is not None and doc[key] != value):
        return None
    return len(data.decode()[:end].encode())  # the decoder counts characters, not bytes


def _marked_end(data: bytes, start: bytes, end: bytes) -> int | None:
    stop = data.find(end)
    return stop + len(end) if data.startswith(start) and stop >= 0 else None


def _junit_end(data: bytes) -> int | None:
    end = _marked_end(data, b"<?xml", b"</testsuites>")
    if end is None:
        return None
    with contextlib.suppress(ET.ParseError):
        return end if ET.fromstring(data[:end]).tag == "testsuites" else None
    return None


# Each output: the command line before it, its option (None: the environment variable), and
# where a complete document of its kind ends in the bytes written (None: not complete).
OUTPUTS = {
    "analyze -o": (["analyze"], "-o", lambda d: _json_end(d, "schema_version")),
    "analyze --html": (["analyze"], "--html", lambda d: _marked_end(d, b"<!DOCTYPE html>", b"</html>")),
    "report -o": (["report"], "-o", lambda d: _marked_end(d, b"<!DOCTYPE html>", b"</html>")),
    "export -o": (["export"], "-o", lambda d: _json_end(d, "traceEvents")),
    "baseline -o": (["baseline"], "-o", lambda d: _json_end(d, "kind", "tracekit-baseline")),
    "check --junit": (["check", *CHECK_PASSES], "--junit", _junit_end),
    "check --markdown": (["check", *CHECK_PASSES], "--markdown", lambda d: _marked_end(d, b"### ", b"</details>")),
    f"check {SUMMARY}": (["check", *CHECK_PASSES], None, lambda d: _marked_end(d, b"### ", b"</details>")),
}


def invocation(name: str, run: Path, out: Path | str) -> tuple[list[str], dict[str, str | None]]:
    """The arguments and environment that make command ``name`` write its output to ``out``."""
    before, option, _ = OUTPUTS[name]
    args = [before[0], str(run), *before[1:], *LOADING]
    if option is None:
        return args, {"GITHUB_STEP_SUMMARY": str(out)}
    return args + [option, str(out)], {"GITHUB_STEP_SUMMARY": None}


def complete(name: str, data: bytes) -> bool:
    """The bytes are exactly one whole document of the output's kind (a trailing newline aside)."""
    end = OUTPUTS[name][2](data)
    return end is not None and data[end:].strip() == b""


def cli(name: str, run: Path, out: Path | str):
    args, env = invocation(name, run, out)
    return CliRunner().invoke(main, args, env=env)


def cli_process(name: str, run: Path, out: Path | str, preexec_fn=None) -> subprocess.CompletedProcess:
    """The real executable (its quick exit included), for what only a process can show."""
    args, extra = invocation(name, run, out)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env.update({k: v for k, v in extra.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args], capture_output=True, env=env, preexec_fn=preexec_fn, timeout=300
    )


def assert_one_error_line(output: str, *, says: str) -> None:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), output
    assert says in lines[0], output
    assert "wrote" not in output


@pytest.fixture
def run(tmp_path) -> Path:
    """A copy of sample 1f1b (links to its files must not reach the committed samples)."""
    copy = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", copy)
    return copy


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ------------------------------------------------------------------ never over the run


@pytest.mark.parametrize("how", ["the trace itself", "a symlink to it", "a hard link to it", "the manifest"])
@pytest.mark.parametrize("name", OUTPUTS)
def test_an_output_onto_the_runs_own_files_is_refused_before_loading(name, how, run, tmp_path):
    inputs = _snapshot(run)
    if how == "the trace itself":
        out = run / "rank2.json.gz"
    elif how == "a symlink to it":
        out = tmp_path / "out.link"
        out.symlink_to(run / "rank2.json.gz")
    elif how == "a hard link to it":
        out = tmp_path / "out.hard"
        os.link(run / "rank2.json.gz", out)
    else:
        out = run / "capture.json"
    result = cli(name, run, out)
    assert result.exit_code == 2
    assert_one_error_line(result.output, says="refusing to write over it")
    assert _snapshot(run) == inputs
    assert out.is_symlink() == (how == "a symlink to it")


def test_the_baseline_a_check_reads_is_refused_as_its_output(run, tmp_path):
    baseline = tmp_path / "base.json"
    assert cli("baseline -o", run, baseline).exit_code == 0
    before = baseline.read_bytes()
    for option in ("--junit", "--markdown"):
        result = CliRunner().invoke(
            main,
            ["check", str(run), "--baseline", str(baseline), "--no-config", *LOADING, option, str(baseline)],
            env={"GITHUB_STEP_SUMMARY": None},
        )
        assert result.exit_code == 2
        assert_one_error_line(result.output, says="the baseline this check reads")
    assert baseline.read_bytes() == before


@pytest.mark.parametrize("name", ["analyze -o", "check --markdown"])
def test_two_outputs_onto_one_file_are_refused(name, run, tmp_path):
    out = tmp_path / "both"
    other = "--html" if name.startswith("analyze") else "--junit"
    args, env = invocation(name, run, out)
    result = CliRunner().invoke(main, args + [other, str(tmp_path / "." / "both")], env=env)
    assert result.exit_code == 2 and not out.exists()
    assert_one_error_line(result.output, says="writes too")


def test_a_trace_looking_name_inside_the_run_folder_is_refused(run):
    result = cli("export -o", run, run / "merged.json.gz")
    assert result.exit_code == 2 and not (run / "merged.json.gz").exists()
    assert_one_error_line(result.output, says="would be read as one more trace")


# ------------------------------------------------------------------ where it writes


@pytest.mark.parametrize("name", OUTPUTS)
def test_dev_stdout_gets_the_whole_document(name, run):
    done = cli_process(name, run, "/dev/stdout")
    assert done.returncode == 0, done.stderr.decode()
    end = OUTPUTS[name][2](done.stdout)  # the document first, then what the command prints
    assert end is not None, done.stdout[:300]
    assert b"wrote /dev/stdout" in done.stderr or name.endswith(SUMMARY)


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_fifo_is_written_through_not_replaced(name, run, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    # a second name for the FIFO, which a command that wrongly replaced out.fifo cannot take away
    keeper = tmp_path / "keeper" / "fifo"
    keeper.parent.mkdir()
    os.link(fifo, keeper)
    received = bytearray()

    def read_all() -> None:
        with open(fifo, "rb") as pipe:
            received.extend(pipe.read())

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        result = cli(name, run, fifo)
    finally:
        # Had the command never opened the FIFO, the reader would wait forever: be its writer.
        with contextlib.suppress(OSError):
            os.close(os.open(keeper, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
    assert result.exit_code == 0, result.output
    assert complete(name, bytes(received)), bytes(received[:300])
    assert fifo.is_fifo()


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_symlink_is_followed_to_its_target_and_stays_a_link(name, run, tmp_path):
    target = tmp_path / "elsewhere" / "real.out"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    link = tmp_path / "links" / "out.link"
    link.parent.mkdir()
    link.symlink_to(target)
    result = cli(name, run, link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and link.resolve() == target.resolve()
    data = target.read_bytes()
    if OUTPUTS[name][1] is None:  # the step summary is appended to
        assert data.startswith(b"old\n") and complete(name, data[4:])
    else:
        assert complete(name, data)
    assert target.stat().st_mode & 0o777 == 0o640  # the file's mode is kept
    assert sorted(p.name for p in target.parent.iterdir()) == ["real.out"]  # no temporary file left


# ------------------------------------------------------------------ when it cannot


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_full_device_ends_in_one_line_and_no_wrote(name, run):
    result = cli(name, run, "/dev/full")
    assert result.exit_code == 2
    assert_one_error_line(result.output, says="cannot write /dev/full")
    assert "No space left on device" in result.output


def _file_size_limit(limit_bytes: int):
    def apply() -> None:
        # A write past the limit then fails with EFBIG instead of killing the process.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return apply


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_full_disk_leaves_the_old_file_whole_and_no_temporary_file(name, run, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "existing.out"
    out.write_bytes(b"an earlier output\n")
    # every output is longer than this; the old file is shorter
    done = cli_process(name, run, out, preexec_fn=_file_size_limit(128))
    assert done.returncode == 2, done.stderr.decode()
    assert_one_error_line(done.stderr.decode(), says=f"cannot write {out}")
    assert "File too large" in done.stderr.decode()
    assert _snapshot(folder) == {"existing.out": b"an earlier output\n"}


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_parent_that_is_a_file_is_refused_before_loading(name, run, tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"a file, not a folder")
    result = cli(name, run, plain / "out")
    assert result.exit_code == 2
    assert_one_error_line(result.output, says="Not a directory")
    assert plain.read_bytes() == b"a file, not a folder"


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_folder_as_the_output_is_refused(name, run, tmp_path):
    result = cli(name, run, tmp_path)
    assert result.exit_code == 2
    assert_one_error_line(result.output, says="is a folder")


# ------------------------------------------------------------------ the writer itself


def test_a_new_file_gets_the_mode_open_would_give_it_and_missing_folders_are_made(tmp_path):
    out = tmp_path / "a" / "b" / "new.json"
    OutputTarget(out).write(b"{}")
    assert out.read_bytes() == b"{}"
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_a_write_into_a_missing_folder_is_checked_before_and_made_only_at_the_write(tmp_path):
    out = tmp_path / "later" / "x.json"
    target = OutputTarget(out)
    assert not out.parent.exists()  # a refused or failed command leaves no empty folder
    target.write(b"1")
    assert out.read_bytes() == b"1"


def test_a_dangling_symlink_makes_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    OutputTarget(link).write(b"[]")
    assert link.is_symlink() and (tmp_path / "made.json").read_bytes() == b"[]"


def test_an_append_that_fails_leaves_the_file_as_it_was(tmp_path):
    out = tmp_path / "summary.md"
    out.write_bytes(b"earlier step\n")
    code = (
        "import resource, signal, sys\n"
        "from tracekit.output import OutputTarget\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        f"OutputTarget({str(out)!r}, 'summary').append(b'x' * 1000)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "TracekitError" in done.stderr and "File too large" in done.stderr
    assert out.read_bytes() == b"earlier step\n"


def test_a_closed_descriptor_is_refused():
    unused = os.open(os.devnull, os.O_RDONLY)
    os.close(unused)
    with pytest.raises(TracekitError, match="not open"):
        OutputTarget(f"/dev/fd/{unused}")


def test_the_writer_sits_below_every_layer():
    """tracekit/output.py may be imported from anywhere: it imports only the stdlib, tracekit.errors and tracekit.text."""
    import ast

    import tracekit.output

    tree = ast.parse(Path(tracekit.output.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    tracekit_modules = {name for name in imported if name.split(".")[0] == "tracekit"}
    assert tracekit_modules == {"tracekit.errors", "tracekit.text"}
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in imported - tracekit_modules)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------ the report's default path


def test_the_default_report_path_leaves_the_committed_examples_alone(run, tmp_path, monkeypatch):
    examples = tmp_path / "reports" / "examples"
    examples.mkdir(parents=True)
    committed = examples / "run.html"
    committed.write_bytes(b"<!-- the committed example -->")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["report", str(run), *LOADING])
    assert result.exit_code == 0, result.output
    assert complete("report -o", (tmp_path / "reports" / "run.html").read_bytes())
    assert committed.read_bytes() == b"<!-- the committed example -->"


def test_capture_never_deletes_an_earlier_capture_unasked(tmp_path):
    """`capture -o` into a folder that holds a run (a committed sample, say) refuses before
    anything runs; the traces stay byte for byte."""
    import shutil

    from click.testing import CliRunner

    from conftest import SAMPLES
    from tracekit.cli import main

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = CliRunner().invoke(main, ["capture", "-o", str(run)])
    assert result.exit_code == 2, result.output
    assert "already holds a capture" in result.stderr and "--replace" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_no_output_over_a_trace_of_another_iteration(tmp_path):
    """A run folder of iteration_N subfolders: the command reads the highest, but no output
    may replace a trace of any iteration, nor drop a trace-looking file beside them."""
    import shutil

    from click.testing import CliRunner

    from conftest import SAMPLES
    from tracekit.cli import main

    run = tmp_path / "job"
    for n in (2, 6):
        folder = run / "profiling" / "traces" / f"iteration_{n}"
        folder.mkdir(parents=True)
        for trace in sorted((SAMPLES / "1f1b").glob("rank*.json.gz")):
            shutil.copy(trace, folder / trace.name.replace(".json.gz", "_trace.json.gz"))
    older = run / "profiling" / "traces" / "iteration_2" / "rank0_trace.json.gz"
    before = older.read_bytes()
    for target in (older, older.parent / "analysis.json", run / "profiling" / "traces" / "iteration_6" / "a.json"):
        result = CliRunner().invoke(main, ["analyze", str(run), "--no-cache", "-o", str(target)])
        assert result.exit_code == 2, (target, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert older.read_bytes() == before
