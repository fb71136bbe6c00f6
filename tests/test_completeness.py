"""A run is analysed as what it is: every rank, part of a job, one rank, or nothing at all.

Fixtures are the project's real sample captures, copied into tmp_path and cut down:
a rank file removed, ``distributedInfo`` stripped or rewritten, events filtered out
(``generated_*`` folders, each built by the function that names it).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
from tracekit.cli import main

SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "analysis.schema.json").read_text())


def cli(*args: str):
    return CliRunner().invoke(main, [*args, "--no-cache", "--no-progress"])


def one_error_line(result) -> str:
    """The single ``tracekit: error:`` line a refused command prints (asserts it is one)."""
    assert result.exit_code == 2, (result.exit_code, result.output[-800:])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), result.output[-800:]
    return lines[0]


def _read(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _write(path: Path, doc: dict) -> None:
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def generated_missing_rank2(tmp_path: Path) -> Path:
    """sample_traces/1f1b (native 1F1B, p=4; every file says world_size 4) with rank2 removed."""
    folder = tmp_path / "generated_missing_rank2"
    shutil.copytree(SAMPLES / "1f1b", folder)
    (folder / "rank2.json.gz").unlink()
    return folder


# ---------------------------------------------------------------- a rank missing


def test_missing_rank_is_said_first_and_never_read_as_a_smaller_pipeline(tmp_path):
    result = cli("analyze", str(generated_missing_rank2(tmp_path)))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("INCOMPLETE RUN: rank 2 of 4 has no trace (found ranks 0-1, 3)")
    assert "world size 4 from distributedInfo" in lines[0]
    assert "p=3" not in result.output and "1F1B" not in result.output
    assert "[high]" not in result.output
    assert "theory (" not in result.output and "balanced replay" not in result.output


def test_missing_rank_json_carries_completeness_and_no_whole_pipeline_figures(tmp_path):
    result = cli("analyze", str(generated_missing_rank2(tmp_path)), "--json")
    doc = json.loads(result.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["completeness"] == {
        "complete": False,
        "world_size": 4,
        "world_size_source": "distributedInfo",
        "ranks_present": [0, 1, 3],
        "missing_ranks": [2],
        "cut_short": [],
        "message": doc["warnings"][0],
    }
    assert doc["schedule"]["name"] == "unknown" and doc["schedule"]["p"] == 4
    assert doc["theory"]["bubble_ratio"] is None and doc["theory"]["balanced_replay_bubble_ratio"] is None
    assert all("replay" not in step for step in doc["steps"])  # no replay of part of a pipeline
    assert all("causes" not in rank for rank in doc["ranks"])
    assert {f["severity"] for f in doc["findings"]} <= {"medium", "low", "info"}
    assert all(f["headline"].startswith("On the 3 ranks present") for f in doc["findings"])


def test_complete_run_says_it_is_complete():
    result = cli("analyze", str(SAMPLES / "1f1b"), "--json")
    doc = json.loads(result.output)
    assert doc["completeness"]["complete"] is True and doc["completeness"]["missing_ranks"] == []
    assert doc["schedule"]["name"] == "1F1B" and doc["schedule"]["p"] == 4


def test_check_refuses_an_incomplete_run_unless_allowed(tmp_path):
    run_dir = generated_missing_rank2(tmp_path)
    line = one_error_line(cli("check", str(run_dir), "--max-bubble", "0.9"))
    assert "incomplete run: rank 2 of 4 has no trace" in line and "--allow-incomplete" in line
    allowed = cli("check", str(run_dir), "--max-bubble", "0.9", "--allow-incomplete")
    assert allowed.exit_code == 0, allowed.output
    assert "incomplete run allowed: rank 2 of 4 has no trace" in allowed.output
    failing = cli("check", str(run_dir), "--max-bubble", "0.01", "--allow-incomplete")
    assert failing.exit_code == 1  # an allowed incomplete run is still checked


def test_check_allow_incomplete_from_pyproject(tmp_path):
    run_dir = generated_missing_rank2(tmp_path)
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.tracekit.check]\nmax-bubble = 0.9\nallow-incomplete = true\n")
    assert cli("check", str(run_dir), "--config", str(config)).exit_code == 0
    config.write_text('[tool.tracekit.check]\nmax-bubble = 0.9\nallow-incomplete = "yes"\n')
    assert "allow-incomplete must be true or false" in one_error_line(
        cli("check", str(run_dir), "--config", str(config))
    )


def test_check_cause_limit_on_an_allowed_incomplete_run_says_why(tmp_path):
    line = one_error_line(
        cli("check", str(generated_missing_rank2(tmp_path)), "--max-cause", "comm=0.1", "--allow-incomplete")
    )
    assert "ranks missing is not attributed" in line


def test_baseline_refuses_an_incomplete_run_unless_allowed(tmp_path):
    run_dir = generated_missing_rank2(tmp_path)
    out = tmp_path / "base.json"
    assert "tracekit baseline needs every rank's whole trace" in one_error_line(
        cli("baseline", str(run_dir), "-o", str(out))
    )
    assert not out.exists()
    assert cli("baseline", str(run_dir), "-o", str(out), "--allow-incomplete").exit_code == 0
    assert json.loads(out.read_text())["incomplete"].startswith("rank 2 of 4 has no trace")


def test_diff_says_first_that_a_run_is_incomplete(tmp_path):
    result = cli("diff", str(generated_missing_rank2(tmp_path)), str(SAMPLES / "1f1b"))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("INCOMPLETE RUN A:")
    assert "rank 2 of 4 has no trace" in result.output.splitlines()[0]


def test_whatif_refuses_an_incomplete_run(tmp_path):
    line = one_error_line(cli("whatif", str(generated_missing_rank2(tmp_path))))
    assert "incomplete run: rank 2 of 4" in line


def test_report_of_an_incomplete_run_says_so(tmp_path):
    out = tmp_path / "r.html"
    assert cli("report", str(generated_missing_rank2(tmp_path)), "-o", str(out)).exit_code == 0
    assert "INCOMPLETE RUN: rank 2 of 4 has no trace" in out.read_text()


def test_a_whole_data_parallel_replica_missing_is_still_incomplete(tmp_path):
    """generated_dp_replica_missing: sample_traces/1f1b laid out as a 2 x 4 DP x PP job by the
    benchmark's input builder (every file says world_size 8), replica 4-7 then removed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import make_input

    folder = tmp_path / "generated_dp_replica_missing"
    make_input.build_pp(folder, ranks=8, copies=1, sample="1f1b")
    for rank in range(4, 8):
        (folder / f"rank{rank}.json").unlink()
    result = cli("analyze", str(folder))
    assert result.output.startswith("INCOMPLETE RUN: 4 ranks (4-7) of 8 have no trace (found ranks 0-3)")
    assert "schedule: 1F1B" not in result.output


def test_missing_rank_in_the_middle_is_seen_without_distributed_info(tmp_path):
    """generated_no_world_size: the missing-rank copy with distributedInfo stripped from every
    file (ranks come from the file names): the gap in the rank numbers is the evidence."""
    folder = generated_missing_rank2(tmp_path)
    (folder / "capture.json").unlink()
    for path in folder.glob("rank*.json.gz"):
        doc = _read(path)
        del doc["distributedInfo"]
        _write(path, doc)
    doc = json.loads(cli("analyze", str(folder), "--json").output)
    assert doc["completeness"]["missing_ranks"] == [2]
    assert doc["completeness"]["message"].startswith("INCOMPLETE RUN: rank 2 of at least 4 has no trace")


def test_capture_manifest_gives_the_world_size_when_the_files_do_not(tmp_path):
    """generated_no_world_size_last_rank_missing: sample_traces/1f1b without rank3 and without
    distributedInfo: only capture.json (p=4) says a rank is missing."""
    folder = tmp_path / "generated_no_world_size_last_rank_missing"
    shutil.copytree(SAMPLES / "1f1b", folder)
    (folder / "rank3.json.gz").unlink()
    for path in folder.glob("rank*.json.gz"):
        doc = _read(path)
        del doc["distributedInfo"]
        _write(path, doc)
    doc = json.loads(cli("analyze", str(folder), "--json").output)
    assert doc["completeness"]["world_size_source"] == "capture.json"
    assert doc["completeness"]["missing_ranks"] == [3]


# ---------------------------------------------------------------- a rank's trace cut short


def generated_rank0_cut(tmp_path: Path, at_byte: int = 300_000) -> Path:
    """sample_traces/1f1b with rank 0's JSON cut after ``at_byte`` bytes, as a profiler stopped
    mid-write leaves it (written plain: the cut is in the JSON text, not the gzip stream)."""
    folder = tmp_path / "generated_rank0_cut"
    shutil.copytree(SAMPLES / "1f1b", folder)
    text = gzip.decompress((folder / "rank0.json.gz").read_bytes())
    (folder / "rank0.json.gz").unlink()
    (folder / "rank0.json").write_bytes(text[:at_byte])
    return folder


def generated_rank3_last_step_missing(tmp_path: Path) -> Path:
    """sample_traces/1f1b with every event of rank 3 from its last ProfilerStep on removed (a
    whole, valid JSON file): rank 3's profiler covered one step fewer than the others'."""
    folder = tmp_path / "generated_rank3_last_step_missing"
    shutil.copytree(SAMPLES / "1f1b", folder)
    path = folder / "rank3.json.gz"
    doc = _read(path)
    last = max(e["ts"] for e in doc["traceEvents"] if _is_step_mark(e))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "ts" not in e or e["ts"] < last]
    _write(path, doc)
    return folder


def test_a_cut_trace_is_an_incomplete_run_said_first(tmp_path):
    result = cli("analyze", str(generated_rank0_cut(tmp_path)))
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("INCOMPLETE RUN: rank 0's trace is cut short (rank0.json ends early: "), first
    assert "[high]" not in result.output  # a finding from part of a trace is never urgent
    assert "schedule: 1F1B  p=4" in result.output  # every rank is there: the pipeline's shape is read


def test_a_cut_trace_in_json_names_the_rank_and_why(tmp_path):
    doc = json.loads(cli("analyze", str(generated_rank0_cut(tmp_path)), "--json").output)
    jsonschema.validate(doc, SCHEMA)
    completeness = doc["completeness"]
    assert completeness["complete"] is False and completeness["missing_ranks"] == []
    assert [c["rank"] for c in completeness["cut_short"]] == [0]
    assert "rank0.json ends early" in completeness["cut_short"][0]["why"]
    assert doc["warnings"][0] == completeness["message"]


def test_check_and_baseline_refuse_a_cut_trace_unless_allowed(tmp_path):
    run_dir = generated_rank0_cut(tmp_path)
    # the cut rank reads as idle, yet the run's bubble (29.7%) passed a 35% gate before
    line = one_error_line(cli("check", str(run_dir), "--max-bubble", "0.35"))
    assert "incomplete run: rank 0's trace is cut short" in line and "--allow-incomplete" in line
    allowed = cli("check", str(run_dir), "--max-bubble", "0.35", "--allow-incomplete")
    assert allowed.exit_code == 0 and "incomplete run allowed: rank 0's trace is cut short" in allowed.output
    out = tmp_path / "base.json"
    assert "incomplete run" in one_error_line(cli("baseline", str(run_dir), "-o", str(out)))
    assert not out.exists()
    assert "incomplete run" in one_error_line(cli("whatif", str(run_dir)))


def test_a_rank_covering_fewer_steps_is_an_incomplete_run(tmp_path):
    run_dir = generated_rank3_last_step_missing(tmp_path)
    doc = json.loads(cli("analyze", str(run_dir), "--json").output)
    assert doc["completeness"]["cut_short"] == [{"rank": 3, "why": "covers steps 2-3 of 2-4"}]
    assert doc["warnings"][0].startswith("INCOMPLETE RUN: rank 3's trace is cut short (covers steps 2-3 of 2-4)")
    assert doc["warnings"].count(doc["warnings"][0]) == 1
    line = one_error_line(cli("check", str(run_dir), "--max-bubble", "0.9"))
    assert "rank 3's trace is cut short (covers steps 2-3 of 2-4)" in line


def test_whole_samples_are_complete_and_cut_none_short():
    for name in ("1f1b", "interleaved1f1b", "megatron_interleaved", "nsys_1f1b", "pipedream_2bw"):
        doc = json.loads(cli("analyze", str(SAMPLES / name), "--json").output)
        assert doc["completeness"]["complete"] is True and doc["completeness"]["cut_short"] == [], name


# ---------------------------------------------------------------- one rank


def generated_single_rank(tmp_path: Path, with_world_size: bool) -> Path:
    """rank0 of sample_traces/interleaved1f1b (PP: labels) alone, with its distributedInfo
    (world_size 4) or without it."""
    folder = tmp_path / f"generated_single_rank_{'ws4' if with_world_size else 'no_ws'}"
    folder.mkdir()
    doc = _read(SAMPLES / "interleaved1f1b" / "rank0.json.gz")
    if not with_world_size:
        del doc["distributedInfo"]
    _write(folder / "rank0.json.gz", doc)
    return folder / "rank0.json.gz"


def test_one_rank_is_not_a_pipeline(tmp_path):
    trace = generated_single_rank(tmp_path, with_world_size=False)
    doc = json.loads(cli("analyze", str(trace), "--json").output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["pipeline"] is False and doc["schedule"] is None and doc["completeness"]["complete"]
    assert [f["severity"] for f in doc["findings"]] == ["info"]
    assert doc["findings"][0]["headline"].startswith("One rank: no pipeline to analyse")
    text = cli("analyze", str(trace)).output
    assert "One rank: no pipeline to analyse" in text and "[high]" not in text
    assert "one rank: no pipeline to vary" in one_error_line(cli("whatif", str(trace)))


def test_one_rank_of_a_larger_job_is_an_incomplete_run(tmp_path):
    result = cli("analyze", str(generated_single_rank(tmp_path, with_world_size=True)))
    assert result.output.startswith("INCOMPLETE RUN: 3 ranks (1-3) of 4 have no trace (found rank 0)")
    assert "[high]" not in result.output


# ---------------------------------------------------------------- files of different jobs


def test_files_disagreeing_on_world_size_are_named(tmp_path):
    """generated_mixed_jobs: sample_traces/1f1b with rank3's distributedInfo saying world_size 8."""
    folder = tmp_path / "generated_mixed_jobs"
    shutil.copytree(SAMPLES / "1f1b", folder)
    doc = _read(folder / "rank3.json.gz")
    doc["distributedInfo"]["world_size"] = 8
    _write(folder / "rank3.json.gz", doc)
    line = one_error_line(cli("analyze", str(folder)))
    assert (
        "files disagree on world size (rank0.json.gz, rank1.json.gz, rank2.json.gz say 4; rank3.json.gz says 8)" in line
    )


def test_a_rank_beyond_the_world_size_is_refused(tmp_path):
    """generated_rank_beyond_world: sample_traces/1f1b with rank3 renamed rank5 and saying so."""
    folder = tmp_path / "generated_rank_beyond_world"
    shutil.copytree(SAMPLES / "1f1b", folder)
    doc = _read(folder / "rank3.json.gz")
    doc["distributedInfo"]["rank"] = 5
    _write(folder / "rank5.json.gz", doc)
    (folder / "rank3.json.gz").unlink()
    line = one_error_line(cli("analyze", str(folder)))
    assert "rank5.json.gz holds rank 5, yet the files say the world size is 4" in line


# ---------------------------------------------------------------- empty and nearly empty runs

_COMM = ("gloo:", "c10d::", "record_param_comms")


def _is_step_mark(event: dict) -> bool:
    return str(event.get("name", "")).startswith("ProfilerStep")


def _first_action_only(events: list[dict]) -> list[dict]:
    kept, seen = [], False
    for event in events:
        if re.match(r"^PP:\d+[FIBW]\d+$", str(event.get("name", ""))):
            if seen:
                continue
            seen = True
        kept.append(event)
    return kept


def _steps_shrunk(events: list[dict]) -> list[dict]:
    """Every ProfilerStep mark cut to 1 us: the actions all fall outside the steps."""
    return [{**e, "dur": 1} if _is_step_mark(e) else e for e in events]


# name -> (sample cut down, which events each rank file keeps)
SHAPES = {
    "no_events": ("1f1b", lambda events: []),
    "metadata_only": ("1f1b", lambda events: [e for e in events if e.get("ph") != "X"]),
    "one_event": ("1f1b", lambda events: [e for e in events if e.get("ph") == "X"][:1]),
    "steps_no_compute": ("1f1b", lambda events: [e for e in events if e.get("ph") != "X" or _is_step_mark(e)]),
    "no_steps": ("1f1b", lambda events: [e for e in events if not _is_step_mark(e)]),
    "compute_no_messages": (
        "interleaved1f1b",
        lambda events: [
            e
            for e in events
            if not str(e.get("name", "")).startswith(_COMM)
            and not re.match(r"^PP:\d+(SEND|RECV)", str(e.get("name", "")))
        ],
    ),
    "one_action": ("interleaved1f1b", _first_action_only),
    "actions_outside_steps": ("interleaved1f1b", _steps_shrunk),
}


def generated_shape(tmp_path: Path, shape: str) -> Path:
    """A real sample run with each rank file's events cut down to ``SHAPES[shape]``."""
    sample, keep = SHAPES[shape]
    folder = tmp_path / f"generated_{shape}"
    folder.mkdir()
    for path in sorted((SAMPLES / sample).glob("rank*.json.gz")):
        doc = _read(path)
        doc["traceEvents"] = keep(doc["traceEvents"])
        _write(folder / path.name, doc)
    return folder


COMMANDS = {
    "analyze": lambda run, out: ["analyze", str(run)],
    "json": lambda run, out: ["analyze", str(run), "--json"],
    "report": lambda run, out: ["report", str(run), "-o", str(out / "r.html")],
    "check": lambda run, out: ["check", str(run), "--max-bubble", "0.9"],
    "baseline": lambda run, out: ["baseline", str(run), "-o", str(out / "b.json")],
    "diff": lambda run, out: ["diff", str(run), str(run)],
    "diff_markdown": lambda run, out: ["diff", str(run), str(run), "--markdown", "-"],
    "check_step": lambda run, out: ["check", str(run), "--max-step-ms", "1000"],
    "whatif": lambda run, out: ["whatif", str(run), "--replays", "4"],
    "export": lambda run, out: ["export", str(run), "-o", str(out / "m.json")],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_command_on_a_nearly_empty_run_answers_or_refuses_in_one_line(tmp_path, shape):
    run_dir = generated_shape(tmp_path, shape)
    for name, args in COMMANDS.items():
        result = CliRunner().invoke(main, [*args(run_dir, tmp_path), "--no-cache", "--no-progress"])
        assert "Traceback" not in result.output and "internal error" not in result.output, (name, result.output)
        assert result.exit_code in (0, 1, 2), (name, result.exit_code, result.output[-800:])
        if result.exit_code == 2:
            one_error_line(result)
        if name == "json" and result.exit_code == 0:
            jsonschema.validate(json.loads(result.output), SCHEMA)


@pytest.mark.parametrize(
    "shape, message",
    [
        ("no_events", "no events were read from rank0.json.gz"),
        ("metadata_only", "no events were read from rank0.json.gz"),
        ("steps_no_compute", "no work recorded"),
        ("actions_outside_steps", "every pipeline action lies outside the profiled steps"),
    ],
)
def test_a_run_with_nothing_to_measure_is_one_line_for_every_command(tmp_path, shape, message):
    run_dir = generated_shape(tmp_path, shape)
    for name in ("analyze", "report", "check", "baseline"):
        assert message in one_error_line(
            CliRunner().invoke(main, [*COMMANDS[name](run_dir, tmp_path), "--no-cache", "--no-progress"])
        ), name
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "b.json").exists()


def test_compute_without_messages_is_still_measured(tmp_path):
    doc = json.loads(cli("analyze", str(generated_shape(tmp_path, "compute_no_messages")), "--json").output)
    assert doc["pipeline"] is True and doc["summary"]["n_messages"] == 0
    assert 0 < doc["summary"]["bubble_ratio"] < 1


# ---------------------------------------------------------------- ratios


def test_a_share_outside_zero_and_one_is_refused_not_printed():
    from tracekit.analyze.shares import ShareError, share, shares
    from tracekit.errors import TracekitError

    assert share(0, 0, "x") == 0.0 and share(3, 4, "x") == 0.75
    for part, whole in ((5, 4), (-1, 4), (1, 0)):
        with pytest.raises(ShareError, match="not a share between 0 and 1") as err:
            share(part, whole, "rank 3 step 2: bubble ratio")
        assert isinstance(err.value, TracekitError) and "rank 3 step 2" in str(err.value)
    with pytest.raises(ShareError, match="rank 1"):
        shares([1, 5], [4, 4], lambda i: f"rank {i}")


@pytest.mark.parametrize("sample", ["1f1b_slow_stage2", "interleaved1f1b", "zbv"])
def test_every_ratio_is_a_share_with_and_without_attribution(sample):
    for flags in ([], ["--no-attribution"]):
        doc = json.loads(cli("analyze", str(SAMPLES / sample), "--json", *flags).output)
        jsonschema.validate(doc, SCHEMA)  # ratios and cost shares are bounded by [0, 1] there
        assert all(0 <= f["cost_share"] <= 1 for f in doc["findings"])


def test_imbalance_cost_without_attribution_stays_a_share():
    """generated in memory: sample_traces/interleaved1f1b (8 stages on 4 ranks) with stage 5's
    compute stretched 4x. The cost without attribution was the slow stage's excess times
    (stages - 1) over the summed compute: 170% of the device time here."""
    from tracekit import load
    from tracekit.analyze import analyze
    from tracekit.analyze.diagnosis import diagnose

    run = load(SAMPLES / "interleaved1f1b")
    slow = run.actions["stage"] == 5
    spans = run.actions.loc[slow, "end_ns"] - run.actions.loc[slow, "start_ns"]
    run.actions.loc[slow, "end_ns"] = run.actions.loc[slow, "start_ns"] + 4 * spans
    imbalance = next(f for f in diagnose(analyze(run, attribution=False)) if f.cause == "imbalance")
    assert imbalance.figures["stage"] == 5
    assert 0.5 < imbalance.cost_share < 1


def test_export_and_report_of_an_incomplete_run_say_so_at_the_top(tmp_path):
    run = generated_missing_rank2(tmp_path)
    merged, page = tmp_path / "merged.json", tmp_path / "page.html"
    exported = cli("export", str(run), "-o", str(merged))
    assert exported.exit_code == 0, exported.output
    assert "rank 2 of 4 has no trace" in exported.stderr
    assert json.loads(merged.read_text())["otherData"]["warnings"][0].startswith("INCOMPLETE RUN: rank 2 of 4")
    reported = cli("report", str(run), "-o", str(page))
    assert reported.exit_code == 0, reported.output
    html = page.read_text()
    assert html.index('id="incomplete"') < html.index('class="facts"')  # above the verdict and the facts
