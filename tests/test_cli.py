"""The command line, driven as a user would through click's CliRunner."""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
from tracekit.cli import main

SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "analysis.schema.json").read_text())


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_help_teaches():
    result = run("--help")
    assert result.exit_code == 0
    assert "analyze" in result.output and "capture" in result.output
    detail = run("analyze", "--help")
    assert "warmup" in detail.output and "imbalance" in detail.output and "Examples" in detail.output


def test_analyze_prints_schedule_and_causes():
    result = run("analyze", str(SAMPLES / "1f1b"), "--no-progress")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "schedule: 1F1B  p=4 v=1 m=8" in out
    assert "bubble ratio" in out and "theory (p-1)/(m+p-1)" in out
    assert "where the idle time goes" in out
    assert "what to try:" in out


def test_slow_stage_headline_names_the_stage():
    result = run("analyze", str(SAMPLES / "1f1b_slow_stage2"), "--json")
    doc = json.loads(result.output)
    top = doc["findings"][0]
    assert top["cause"] == "imbalance" and "Stage 2" in top["headline"]


def test_json_follows_the_schema(tmp_path):
    out_file = tmp_path / "a.json"
    result = run("analyze", str(SAMPLES / "interleaved1f1b"), "--json", "-o", str(out_file))
    assert result.exit_code == 0
    doc = json.loads(result.stdout)  # "wrote a.json" goes to stderr
    jsonschema.validate(doc, SCHEMA)
    assert json.loads(out_file.read_text()) == doc
    assert doc["schedule"]["name"] == "Interleaved1F1B"
    for rank in doc["ranks"]:
        assert sum(rank["causes"].values()) == rank["idle_ns"]


def test_json_of_a_non_pipeline_trace_follows_the_schema():
    from conftest import shared_or_skip

    path = shared_or_skip("kineto-gpu", "hta_trace_filter_sampled_rank-0.json.gz")
    result = run("analyze", str(path), "--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["pipeline"] is False and doc["schedule"] is None


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: d / "nothing-here", "no such file or folder"),
        (lambda d: d, "no trace files found"),
        (lambda d: ((d / "rank0.json").write_text("{ not json"), d)[1], "rank0.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, setup, message):
    target = setup(tmp_path)
    result = run("analyze", str(target))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and message in lines[0]


def test_bad_rank_map_is_a_usage_error():
    result = run("analyze", str(SAMPLES / "1f1b"), "--rank-map", "oops")
    assert result.exit_code == 2 and "PID=RANK" in result.output


def _executable(*args: str, env_extra: dict | None = None):
    """The installed entry point's code path (tracekit.cli.run) in a fresh process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, env=env)


def test_executable_flushes_everything_and_exits_with_the_right_status(tmp_path):
    done = _executable("analyze", str(SAMPLES / "1f1b"), "--json", "--no-cache", "--no-progress")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # the whole document arrived, not a cut-off prefix
    assert doc["schedule"]["name"] == "1F1B"
    bad = _executable("analyze", str(tmp_path / "missing"))
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "no such file or folder" in bad.stderr


PRINTING = pytest.mark.parametrize(
    "args",
    [
        ["analyze", str(SAMPLES / "1f1b"), "--no-cache", "--no-progress"],
        ["analyze", str(SAMPLES / "1f1b"), "--json", "--no-cache", "--no-progress"],
        ["check", str(SAMPLES / "1f1b"), "--max-bubble", "0.9", "--no-config", "--no-cache", "--no-progress"],
        ["--help"],
        ["whatif", "--help"],
    ],
    ids=["analyze", "analyze-json", "check", "help", "whatif-help"],
)


@PRINTING
def test_a_reader_that_went_away_ends_quietly_with_sigpipes_status(args):
    """``tracekit check run/ | head -1``: the reader is gone before the rest is written (EPIPE).
    Was "internal error: BrokenPipeError" (exit 3) from check; now nothing on stderr and 141,
    a shell's status for SIGPIPE. The pipe's read end is closed before tracekit starts, so
    every write fails, whatever the timing."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tracekit.cli", *args], stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


@PRINTING
def test_standard_output_that_cannot_be_written_is_one_line_and_exit_2(args):
    """``> /dev/full`` (ENOSPC on every write): was an internal error (exit 3), or a traceback
    from --help."""
    import os
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "tracekit.cli", *args], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "tracekit: error: standard output cannot be written (No space left on device): free some space or "
        "write it elsewhere"
    ]


def test_executable_loads_pandas_without_pyarrow_and_answers_the_same(tmp_path):
    """The command line skips pandas' optional pyarrow strings (tracekit/_lean.py): same
    answer as the library with pyarrow loaded, and pyarrow never imported for it."""
    import subprocess
    import sys

    from tracekit.analyze import analyze
    from tracekit import LoadOptions, load
    from tracekit.render.json import to_document

    flag = tmp_path / "modules.txt"
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(flag)!r}, 'w').write(str('pyarrow' in sys.modules)))\n"
        "from tracekit.cli import run\n"
        f"sys.argv = ['tracekit', 'analyze', {str(SAMPLES / '1f1b_slow_stage2')!r}, '--json', '--no-cache', '--no-progress']\n"
        "run()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert flag.read_text() == "False"
    here = to_document(analyze(load(SAMPLES / "1f1b_slow_stage2", LoadOptions(rows="analysis"))))
    there = json.loads(done.stdout)
    for doc in (here, there):
        doc.pop("generated_at", None)
    assert there == json.loads(json.dumps(here))


def _this_checkout_env(**extra: str) -> dict:
    """A child process's environment that imports tracekit from this checkout."""
    import os

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_python_m_tracekit_is_the_command():
    import subprocess
    import sys

    version = subprocess.run(
        [sys.executable, "-m", "tracekit", "--version"],
        capture_output=True,
        text=True,
        env=_this_checkout_env(),
        cwd=ROOT,
    )
    from tracekit import __version__

    assert version.returncode == 0, version.stderr
    assert version.stdout == f"tracekit, version {__version__}\n"
    listed = subprocess.run(
        [sys.executable, "-m", "tracekit", "--help"], capture_output=True, text=True, env=_this_checkout_env(), cwd=ROOT
    )
    assert listed.returncode == 0 and "cache" in listed.stdout and "diff" in listed.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tracekit", "analyze", str(ROOT / "no-such-run")],
        capture_output=True,
        text=True,
        env=_this_checkout_env(),
        cwd=ROOT,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("tracekit: error:") and len(bad.stderr.splitlines()) == 1


def test_version_names_the_package_version():
    from tracekit import __version__

    result = run("--version")
    assert result.exit_code == 0 and result.output == f"tracekit, version {__version__}\n"


def _complete(words: str) -> list[str]:
    """What bash completion offers after ``words`` (click's protocol: "type,value" lines)."""
    result = CliRunner().invoke(
        main,
        [],
        prog_name="tracekit",
        env={"_TRACEKIT_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)},
    )
    assert result.exit_code == 0, result.output
    return [line.split(",", 1)[1] for line in result.output.splitlines()]


def test_shell_completion_offers_commands_subcommands_and_options():
    assert {"cache", "capture"} <= set(_complete("tracekit ca"))
    assert _complete("tracekit cache i") == ["info"]
    assert "--max-step-ms" in _complete("tracekit check --max-st")
    assert "--markdown" in _complete("tracekit diff --mark")


def test_the_executable_prints_its_bash_completion_script():
    """What the README tells users to put in ~/.bashrc: eval "$(_TRACEKIT_COMPLETE=bash_source tracekit)"."""
    import subprocess
    import sys

    code = "import sys\nsys.argv = ['tracekit']\nfrom tracekit.cli import run\nrun()\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_this_checkout_env(_TRACEKIT_COMPLETE="bash_source"),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "_TRACEKIT_COMPLETE=bash_complete" in done.stdout
    assert "complete -o nosort -F _tracekit_completion tracekit" in done.stdout


# --- --help: a command's own options first, the shared loading options after them ----------


def _sections(help_text: str) -> dict[str, str]:
    """The help's sections by heading ("Options", "Loading options")."""
    parts: dict[str, str] = {}
    heading = None
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            parts[heading] = ""
        elif heading is not None:
            parts[heading] += line + "\n"
    return parts


@pytest.mark.parametrize("command, own", [("whatif", "--schedule"), ("check", "--max-bubble"), ("analyze", "--ranks")])
def test_help_lists_the_commands_own_options_before_the_loading_options(command, own):
    """Issue #28: whatif --help was 159 lines with --rank-from, --cache-dir, --label-rule ...
    among its own; they now follow under one heading."""
    text = run(command, "--help").output
    sections = _sections(text)
    assert list(sections)[-2:] == ["Options", "Loading options"]
    assert own in sections["Options"] and "--help" in sections["Options"]
    assert not sections["Options"].startswith("  RUN_DIR")  # an argument is in the usage line only
    for shared in ("--rank-from", "--rank-map", "--progress", "--jobs", "--cache-dir", "--iteration", "--timeline"):
        assert shared in sections["Loading options"] and shared not in sections["Options"], shared
    assert "--label-rule" in sections["Loading options"]


def test_every_command_that_reads_a_run_groups_its_help():
    from tracekit.commands.common import LOADING_PARAMS, TracekitCommand

    reading = [c for c in main.commands.values() if any(p.name in LOADING_PARAMS for p in c.params)]
    assert {c.name for c in reading} == {"analyze", "whatif", "report", "check", "baseline", "diff", "export"}
    assert all(isinstance(c, TracekitCommand) for c in reading)
    # each holds every loading option: the section is the same wherever it appears
    assert all(LOADING_PARAMS <= {p.name for p in c.params} for c in reading)


# --- --ranks: the rows analyze shows; pipeline ranks are -p/--pipeline-ranks -----------------


def test_whatif_pipeline_ranks_and_its_old_spelling():
    args = ["whatif", str(SAMPLES / "1f1b"), "--no-cache", "--no-progress", "--replays", "4"]
    for spelling in (["-p", "8"], ["--pipeline-ranks", "8"], ["--ranks", "8"], ["--ranks=8"]):
        refused = CliRunner().invoke(main, [*args, *spelling])
        assert refused.exit_code == 2, (spelling, refused.output)
        assert refused.stdout == "" and "p=8: changing the number of ranks is out of scope" in refused.stderr
        deprecated = [line for line in refused.stderr.splitlines() if "deprecated" in line]
        if spelling[0].startswith("--ranks"):
            assert deprecated == [
                "tracekit: whatif --ranks is deprecated: write -p/--pipeline-ranks (it means the same)"
            ]
        else:
            assert deprecated == []
    assert "-p, --pipeline-ranks P" in run("whatif", "--help").output
    assert "--ranks" not in run("whatif", "--help").output


def test_capture_pipeline_ranks_and_its_old_spelling(tmp_path):
    # refused by the settings check, before torch is imported or anything is written
    for spelling in (["-p", "1"], ["--pipeline-ranks", "1"], ["--ranks", "1"]):
        done = CliRunner().invoke(main, ["capture", "-o", str(tmp_path / "x"), *spelling])
        assert done.exit_code == 2, (spelling, done.output)
        assert done.stderr.splitlines()[-1] == (
            "tracekit: error: -p/--pipeline-ranks must be at least 2 (got 1); a pipeline needs 2 stages"
        )
        assert ("capture --ranks is deprecated" in done.stderr) == (spelling[0] == "--ranks")
    assert not (tmp_path / "x").exists()
    assert "-p, --pipeline-ranks INTEGER" in run("capture", "--help").output


def test_a_command_whose_module_fails_to_import_is_an_error(monkeypatch):
    """It used to be dropped without a word: the CLI simply had one subcommand fewer."""
    from tracekit import commands

    monkeypatch.setattr(commands, "_MODULES", ["analyze", "not_written_yet"])
    with pytest.raises(ModuleNotFoundError, match="not_written_yet"):
        commands._collect()


def test_every_command_module_is_registered():
    """A module under tracekit/commands/ with a ``command`` that _MODULES forgets is a subcommand lost."""
    import pkgutil

    from tracekit import commands

    found = set()
    for info in pkgutil.iter_modules(commands.__path__):
        module = __import__(f"tracekit.commands.{info.name}", fromlist=["command"])
        if hasattr(module, "command"):
            found.add(info.name)
    assert found == set(commands._MODULES)
    assert {c.name for c in commands.COMMANDS} <= set(main.commands)
