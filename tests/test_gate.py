"""tracekit check and tracekit baseline: limits, baselines, exit codes and the CI outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES, capture_of
from tracekit.analyze.compare import Measures, measure
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.gate import CheckConfig, evaluate
from tracekit.gate.baseline import read_baseline
from tracekit.gate.config import Limit

BASELINES = ROOT / "baselines"
TOLERANCE = "0.05"  # what .ci/run uses: generous to recapture noise


def cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture
def cached(monkeypatch, loaded_runs):
    """The commands read sample runs from the session's cache: loading is most of their time."""

    def load(path, *_):
        return loaded_runs(Path(path))[0]

    for name in ("check", "baseline"):
        monkeypatch.setattr(f"tracekit.commands.{name}.load_with_progress", load)


@pytest.fixture(scope="session")
def baseline_1f1b(tmp_path_factory) -> Path:
    """A baseline made from sample_traces/1f1b through the real command (no cache)."""
    path = tmp_path_factory.mktemp("baseline") / "1f1b.json"
    result = cli("baseline", SAMPLES / "1f1b", "-o", path, "--no-progress")
    assert result.exit_code == 0, result.output
    assert f"wrote {path}" in result.output
    return path


def failures(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith("FAIL")]


def test_baseline_file_holds_ratios_schedule_and_versions(baseline_1f1b, loaded_runs):
    doc = json.loads(baseline_1f1b.read_text())
    _, analysis = loaded_runs(SAMPLES / "1f1b")
    assert doc["kind"] == "tracekit-baseline" and doc["schema_version"] == "1.0"
    assert doc["tracekit_version"] and doc["analysis_schema_version"]
    assert doc["schedule"] == {"name": "1F1B", "p": 4, "v": 1, "m": 8}
    assert doc["bubble_ratio"] == pytest.approx(analysis.summary.bubble_ratio, abs=1e-6)
    assert set(doc["ranks"]) == {"0", "1", "2", "3"}
    assert set(doc["causes"]) == {"warmup", "drain", "schedule_gaps", "imbalance", "comm", "overhead"}
    # shares of the window: the causes add up to the bubble ratio
    assert sum(doc["causes"].values()) == pytest.approx(doc["bubble_ratio"], abs=1e-5)


def test_a_run_passes_against_its_own_baseline(baseline_1f1b):
    result = cli(
        "check", SAMPLES / "1f1b", "--baseline", baseline_1f1b, "--tolerance", TOLERANCE, "--no-config", "--no-progress"
    )
    assert result.exit_code == 0, result.output
    assert "passed, 11 checks" in result.output and not failures(result.output)


@pytest.mark.parametrize(
    "run, cause, blame",
    [
        ("1f1b_p2p_delay5ms", "comm", "link"),  # 5 ms before each send leaves
        ("1f1b_slow_stage2", "imbalance", "stage 2"),  # stage 2 computes twice as long
    ],
)
def test_injected_regression_fails_naming_the_ratio_and_the_cause(cached, baseline_1f1b, run, cause, blame):
    result = cli("check", SAMPLES / run, "--baseline", baseline_1f1b, "--tolerance", TOLERANCE, "--no-config")
    assert result.exit_code == 1, result.output
    lines = failures(result.output)
    assert any(line.startswith("FAIL bubble ratio") and "over the baseline" in line for line in lines), lines
    cause_line = [line for line in lines if line.startswith(f"FAIL {cause} share of the step window")]
    assert len(cause_line) == 1 and blame in cause_line[0], lines
    assert "FAILED" in result.output.splitlines()[0]


def test_tolerance_decides_what_is_a_regression(cached, baseline_1f1b):
    regressed = SAMPLES / "1f1b_p2p_delay5ms"
    loose = cli("check", regressed, "--baseline", baseline_1f1b, "--tolerance", "0.5", "--no-config")
    assert loose.exit_code == 0, loose.output
    # a per-cause tolerance lifts only that cause's check
    result = cli(
        "check",
        regressed,
        "--baseline",
        baseline_1f1b,
        "--tolerance",
        TOLERANCE,
        "--cause-tolerance",
        "comm=0.5",
        "--no-config",
    )
    assert result.exit_code == 1
    lines = failures(result.output)
    assert lines and not any("comm share" in line for line in lines)
    assert any(line.startswith("FAIL bubble ratio") for line in lines)


def test_limits_from_flags(cached, loaded_runs):
    run = SAMPLES / "1f1b"
    measures = measure(loaded_runs(run)[1])
    ratio, comm = measures.bubble_ratio, measures.cause_share["comm"]
    worst_rank = max(measures.rank_bubble, key=measures.rank_bubble.get)
    ok = cli(
        "check",
        run,
        "--max-bubble",
        f"{ratio + 0.01:.4f}",
        "--max-rank-bubble",
        "0.99",
        "--max-cause",
        f"comm={comm + 0.01:.4f}",
        "--no-config",
    )
    assert ok.exit_code == 0, ok.output
    bad = cli(
        "check",
        run,
        "--max-bubble",
        f"{ratio - 0.01:.4f}",
        "--max-rank-bubble",
        f"{measures.rank_bubble[worst_rank] - 0.001:.4f}",
        "--max-cause",
        f"comm={100 * (comm - 0.005):.2f}%",
        "--no-config",
    )
    assert bad.exit_code == 1
    lines = failures(bad.output)
    assert any(line.startswith("FAIL bubble ratio") and "(--max-bubble)" in line for line in lines)
    assert any(line.startswith(f"FAIL rank {worst_rank} bubble ratio") for line in lines)
    assert any(line.startswith("FAIL comm share of the step window") and "(--max-cause comm)" in line for line in lines)


def test_limits_from_pyproject_found_above_the_working_folder(
    cached, loaded_runs, baseline_1f1b, tmp_path, monkeypatch
):
    run = SAMPLES / "1f1b"
    ratio = measure(loaded_runs(run)[1]).bubble_ratio
    (tmp_path / "base.json").write_text(baseline_1f1b.read_text())
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'train'\n\n"
        f"[tool.tracekit.check]\nmax-bubble = {ratio - 0.01:.4f}\nbaseline = 'base.json'\ntolerance = 0.05\n\n"
        "[tool.tracekit.check.max-cause]\ncomm = 0.5\n"
    )
    work = tmp_path / "jobs" / "nightly"
    work.mkdir(parents=True)
    # a closer pyproject.toml without the table is passed over
    (tmp_path / "jobs" / "pyproject.toml").write_text("[project]\nname = 'jobs'\n[tool.tracekit.report]\nx = 1\n")
    monkeypatch.chdir(work)
    result = cli("check", run)
    assert result.exit_code == 1, result.output
    assert any("(pyproject.toml max-bubble)" in line for line in failures(result.output))
    # the baseline was found relative to the file, and its tolerance came from the file too
    assert "+ 5.0 points (tolerance from pyproject.toml tolerance)" in result.output
    # a flag wins over the file, key by key
    assert cli("check", run, "--max-bubble", "0.99").exit_code == 0
    # --no-config: nothing left to check
    skipped = cli("check", run, "--no-config")
    assert skipped.exit_code == 2 and "nothing to check" in skipped.output


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda d, b: ["--baseline", d / "missing.json"], "no such file"),
        (lambda d, b: ["--baseline", _write(d, "b.json", "{ nope")], "not JSON"),
        (lambda d, b: ["--baseline", _write(d, "b.json", '{"kind": "something-else"}')], "not a tracekit baseline"),
        (
            lambda d, b: [
                "--baseline",
                _write(d, "b.json", b.replace('"schema_version": "1.0"', '"schema_version": "2.0"')),
            ],
            "schema version 2.0",
        ),
        (
            lambda d, b: ["--baseline", _write(d, "b.json", b.replace('"bubble_ratio": 0.', '"bubble_ratio": 7'))],
            "malformed",
        ),
        (lambda d, b: ["--max-cause", "latency=0.1"], "unknown cause 'latency'"),
        (lambda d, b: ["--max-cause", "comm"], "not CAUSE=SHARE"),
        (lambda d, b: ["--max-bubble", "35"], "between 0 and 1"),
        (lambda d, b: ["--max-bubble", "lots"], "not a number"),
        (lambda d, b: [], "nothing to check"),
        (
            lambda d, b: ["--config", _write(d, "p.toml", "[tool.tracekit.check]\nmax-bubbles = 0.3\n")],
            "unknown key 'max-bubbles'",
        ),
        (lambda d, b: ["--config", _write(d, "p.toml", "[tool.tracekit.check\n")], "not valid TOML"),
        (lambda d, b: ["--config", _write(d, "p.toml", "[tool.other]\nx = 1\n")], "has no [tool.tracekit.check] table"),
    ],
)
def test_unusable_input_is_one_line_and_exit_2(tmp_path, baseline_1f1b, make_args, message):
    args = make_args(tmp_path, baseline_1f1b.read_text())
    extra = [] if "--config" in args else ["--no-config"]
    result = cli("check", SAMPLES / "1f1b", *args, *extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and message in lines[0], lines


def test_a_baseline_of_another_schedule_is_refused(cached, baseline_1f1b, tmp_path):
    doc = json.loads(baseline_1f1b.read_text())
    doc["schedule"]["m"] = 16
    other = _write(tmp_path, "m16.json", json.dumps(doc))
    result = cli("check", SAMPLES / "1f1b", "--baseline", other, "--no-config")
    assert result.exit_code == 2
    assert "schedule differs from the baseline" in result.output
    assert "1F1B p=4 v=1 m=16" in result.output and "1F1B p=4 v=1 m=8" in result.output


def test_ci_outputs_junit_markdown_json_and_step_summary(cached, baseline_1f1b, tmp_path):
    summary = _write(tmp_path, "summary.md", "earlier step\n")
    junit, markdown = tmp_path / "out" / "check.xml", tmp_path / "out" / "check.md"
    result = cli(
        "check",
        SAMPLES / "1f1b_p2p_delay5ms",
        "--baseline",
        baseline_1f1b,
        "--tolerance",
        TOLERANCE,
        "--junit",
        junit,
        "--markdown",
        markdown,
        "--json",
        "--no-config",
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["passed"] is False and doc["exit_code"] == 1
    failed = [c for c in doc["checks"] if not c["passed"]]
    assert failed and {c["id"] for c in failed} >= {"baseline.bubble_ratio", "baseline.cause.comm"}
    # the failure lines still reach the log (stderr) in --json mode
    assert all(c["line"] in result.output for c in failed)

    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(doc["checks"]) and int(suite.get("tests")) == len(cases)
    assert int(suite.get("failures")) == len(failed)
    failed_cases = {c.get("name"): c.find("failure").get("message") for c in cases if c.find("failure") is not None}
    assert failed_cases == {c["id"]: c["line"] for c in failed}

    text = markdown.read_text()
    assert text.startswith("### ❌ tracekit check failed") and "comm share of the step window" in text
    assert text.count("| **FAIL** |") == len(failed)
    appended = summary.read_text()
    assert appended.startswith("earlier step\n") and text in appended


def test_output_files_never_overwrite_the_run(tmp_path, baseline_1f1b):
    run = tmp_path / "run"
    run.mkdir()
    trace = run / "rank0.json.gz"
    trace.write_bytes((SAMPLES / "1f1b" / "rank0.json.gz").read_bytes())
    before = trace.read_bytes()
    result = cli("check", run, "--baseline", baseline_1f1b, "--junit", trace, "--no-config")
    assert result.exit_code == 2 and "input traces" in result.output
    assert trace.read_bytes() == before
    result = cli("baseline", run, "-o", trace)
    assert result.exit_code == 2 and trace.read_bytes() == before


def _measures(**overrides) -> Measures:
    values = dict(
        source="run",
        formats=["kineto"],
        schedule={"name": "1F1B", "p": 2, "v": 1, "m": 4},
        n_steps=1,
        step_ns=1e6,
        bubble_ratio=0.30,
        rank_bubble={0: 0.30, 1: 0.30},
        cause_share={"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.1, "overhead": 0.0},
    )
    values.update(overrides)
    return Measures(**values)


def test_at_the_tolerance_passes_and_just_over_fails():
    config = CheckConfig(baseline=Path("b.json"), tolerance=Limit(0.05, "--tolerance"))
    base = _measures()
    at = evaluate(_measures(bubble_ratio=0.35), config, base)
    assert at.passed
    over = evaluate(_measures(bubble_ratio=0.351), config, base)
    assert [c.id for c in over.failures] == ["baseline.bubble_ratio"]
    better = evaluate(_measures(bubble_ratio=0.20), config, base)
    assert better.passed and "refresh it" in better.checks[0].line()


def test_cause_limits_need_an_attributed_run():
    config = CheckConfig(max_cause={"comm": Limit(0.1, "--max-cause comm")})
    with pytest.raises(TracekitError, match="cause limits need"):
        evaluate(_measures(cause_share={}), config)


def test_committed_baselines_cover_the_sample_runs():
    """.ci/run checks every sample run against baselines/<run>.json."""
    runs = sorted(p for p in SAMPLES.iterdir() if (p / "capture.json").is_file() and list(p.glob("rank*")))
    assert runs
    for run in runs:
        baseline = read_baseline(BASELINES / f"{run.name}.json")
        capture = capture_of(run)
        assert baseline.cause_share, run.name
        assert baseline.schedule["p"] == capture["p"] and baseline.schedule["m"] == capture["m"], run.name


# --- step time: --max-step-ms and --step-tolerance ----------------------------------------
# sample_traces/1f1b_p2p_delay5ms steps in 576.6 ms, baselines of sample_traces/1f1b in 474.2 ms (+21.6%).


def test_step_time_is_not_compared_with_a_baseline_by_default(cached, baseline_1f1b):
    # bubbles within a loose tolerance; the 21.6% slower step alone does not fail the gate
    result = cli(
        "check",
        SAMPLES / "1f1b_p2p_delay5ms",
        "--baseline",
        baseline_1f1b,
        "--tolerance",
        "0.5",
        "--no-config",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert not any(c["id"].endswith("step_time") for c in json.loads(result.stdout)["checks"])


def test_step_tolerance_fails_a_slower_step_and_says_by_how_much(cached, baseline_1f1b):
    args = ["check", SAMPLES / "1f1b_p2p_delay5ms", "--baseline", baseline_1f1b, "--tolerance", "0.5", "--no-config"]
    tight = cli(*args, "--step-tolerance", "10%")
    assert tight.exit_code == 1, tight.output
    assert failures(tight.output) == [
        "FAIL mean step time 576.6 ms > baseline 474.2 ms + 10.0% (--step-tolerance): +102.5 ms (+21.6%) "
        "over the baseline"
    ]
    loose = cli(*args, "--step-tolerance", "0.25")
    assert loose.exit_code == 0, loose.output
    assert "ok   mean step time 576.6 ms <= baseline 474.2 ms + 25.0% (--step-tolerance)" in loose.output


def test_max_step_ms_from_the_flag_and_from_pyproject(cached, tmp_path, monkeypatch):
    run = SAMPLES / "1f1b"  # 474.2 ms a step
    over = cli("check", run, "--max-step-ms", "470", "--no-config")
    assert over.exit_code == 1 and failures(over.output) == [
        "FAIL mean step time 474.2 ms > max 470.0 ms (--max-step-ms)"
    ]
    assert cli("check", run, "--max-step-ms", "480", "--no-config").exit_code == 0
    (tmp_path / "pyproject.toml").write_text("[tool.tracekit.check]\nmax-step-ms = 470\n")
    monkeypatch.chdir(tmp_path)
    from_file = cli("check", run)
    assert from_file.exit_code == 1 and "(pyproject.toml max-step-ms)" in failures(from_file.output)[0]
    assert cli("check", run, "--max-step-ms", "480.5").exit_code == 0  # the flag wins


def test_step_tolerance_from_pyproject(cached, baseline_1f1b, tmp_path, monkeypatch):
    (tmp_path / "base.json").write_text(baseline_1f1b.read_text())
    (tmp_path / "pyproject.toml").write_text(
        "[tool.tracekit.check]\nbaseline = 'base.json'\ntolerance = 0.5\nstep-tolerance = '10%'\n"
    )
    monkeypatch.chdir(tmp_path)
    result = cli("check", SAMPLES / "1f1b_p2p_delay5ms")
    assert result.exit_code == 1
    assert [line.split(":")[0] for line in failures(result.output)] == [
        "FAIL mean step time 576.6 ms > baseline 474.2 ms + 10.0% (pyproject.toml step-tolerance)"
    ]


def test_step_time_in_junit_markdown_and_json(cached, baseline_1f1b, tmp_path):
    junit, markdown = tmp_path / "check.xml", tmp_path / "check.md"
    result = cli(
        "check",
        SAMPLES / "1f1b_p2p_delay5ms",
        "--baseline",
        baseline_1f1b,
        "--tolerance",
        "0.5",
        "--step-tolerance",
        "0.1",
        "--max-step-ms",
        "600",
        "--junit",
        junit,
        "--markdown",
        markdown,
        "--json",
        "--no-config",
    )
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    steps = {c["id"]: c for c in doc["checks"] if c["unit"] == "ns"}
    assert set(steps) == {"step_time", "baseline.step_time"}
    assert steps["baseline.step_time"]["baseline"] == 474184897 and not steps["baseline.step_time"]["passed"]
    assert steps["step_time"]["limit"] == 600_000_000 and steps["step_time"]["passed"]
    assert doc["measures"]["step_ns"] == steps["step_time"]["value"]
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["baseline.step_time"].find("failure").get("message") == steps["baseline.step_time"]["line"]
    assert cases["step_time"].find("failure") is None
    text = markdown.read_text()
    assert "| mean step time | 576.6 ms | 521.6 ms |" in text and text.count("| **FAIL** |") == 1
    assert "- **mean step time** 576.6 ms >" in text


def test_step_time_at_the_tolerance_passes_and_a_faster_step_asks_for_a_refresh():
    config = CheckConfig(baseline=Path("b.json"), step_tolerance=Limit(0.10, "--step-tolerance"))
    base = _measures(step_ns=500e6)
    assert evaluate(_measures(step_ns=550e6), config, base).passed
    over = evaluate(_measures(step_ns=550.1e6), config, base)
    assert [c.id for c in over.failures] == ["baseline.step_time"]
    faster = evaluate(_measures(step_ns=440e6), config, base)
    step = next(c for c in faster.checks if c.id == "baseline.step_time")
    assert step.passed and "-60.0 ms (-12.0%), faster than the baseline" in step.line() and "refresh it" in step.line()


def test_no_step_time_to_check_is_refused():
    with pytest.raises(TracekitError, match="no step measured"):
        evaluate(_measures(n_steps=0, step_ns=0.0), CheckConfig(max_step_ns=Limit(5e8, "--max-step-ms")))
    config = CheckConfig(baseline=Path("b.json"), step_tolerance=Limit(0.1, "--step-tolerance"))
    with pytest.raises(TracekitError, match="records no step time"):
        evaluate(_measures(), config, _measures(step_ns=0.0))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-step-ms", "0"], "not a step time"),
        (["--max-step-ms", "-5"], "not a step time"),
        (["--max-step-ms", "inf"], "not a step time"),
        (["--max-step-ms", "fast"], "not a number"),
        (["--max-bubble", "0.9", "--step-tolerance", "10"], "between 0 and 1"),
        (["--max-bubble", "0.9", "--step-tolerance", "5%"], "--step-tolerance compares the step time with a baseline"),
    ],
)
def test_unusable_step_limits_are_one_line_and_exit_2(args, message):
    result = cli("check", SAMPLES / "1f1b", *args, "--no-config")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and message in lines[0], lines


def test_max_step_ms_in_pyproject_must_be_milliseconds(tmp_path):
    config = _write(tmp_path, "p.toml", "[tool.tracekit.check]\nmax-step-ms = true\n")
    result = cli("check", SAMPLES / "1f1b", "--config", config)
    assert result.exit_code == 2 and "max-step-ms: True is not a number" in result.output


@pytest.mark.parametrize(
    "flags, named",
    [(["--tolerance", "0.05"], "--tolerance"), (["--cause-tolerance", "comm=0.02"], "--cause-tolerance")],
)
def test_a_tolerance_without_a_baseline_is_refused_not_ignored(cached, flags, named):
    # it used to do nothing, silently: the run passed on --max-bubble alone
    result = cli("check", SAMPLES / "1f1b", "--max-bubble", "0.9", *flags, "--no-config")
    assert result.exit_code == 2, result.output
    assert named in result.output and "add --baseline FILE" in result.output
    assert len(result.output.strip().splitlines()) == 1
