"""What-if predictions: exact against the closed forms on ideal costs, close to the project's
real runs of the other schedules, honest about the model's own error."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from generated_costs import constant_cost_model
from tracekit.analyze.theory import theoretical_bubble
from tracekit.analyze.costs import CostModel
from tracekit.analyze.memory import ActivationSize
from tracekit.analyze.report_whatif import ReportWhatIf
from tracekit.analyze.whatif import Prediction, Search, WhatIf, predict, what_if
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit import LoadOptions, load


def _ideal_model(p: int, t_f: int = 1000, t_b: int = 2000) -> CostModel:
    """A generated cost model (unit-test fixture, not a trace): constant compute per
    microbatch, no overhead, free messages."""
    return constant_cost_model(p, {"F": t_f, "B": t_b})


@pytest.mark.parametrize(
    "schedule,p,v,m",
    [
        ("GPipe", 2, 1, 4),
        ("GPipe", 4, 1, 8),
        ("1F1B", 4, 1, 8),
        ("1F1B", 8, 1, 16),
        ("Interleaved1F1B", 4, 2, 8),
        ("Interleaved1F1B", 2, 4, 8),
    ],
)
def test_ideal_costs_give_the_closed_form_exactly(schedule, p, v, m):
    model = _ideal_model(p, t_f=v * 1000, t_b=v * 2000)  # divisible by v: integer chunk times
    got = predict(model, schedule, v, m, keep="microbatch", samples=4)
    want = Fraction(p - 1, v * m + p - 1)
    assert got.bubble_sd == 0 and got.step_sd == 0
    assert abs(got.bubble_ratio - float(want)) < 1e-12
    assert got.theory == pytest.approx(theoretical_bubble(schedule, p, v, m).bubble_ratio)
    # the step is one microbatch's F and B on every stage plus m-1 more on one stage
    assert got.step_ns == (m * v + p - 1) * 3000


@pytest.fixture(scope="module")
def samples():
    return {
        name: load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
        for name in (
            "1f1b",
            "gpipe",
            "interleaved1f1b",
            "looped_bfs",
            "zbv",
            "interleaved_zb",
            "dualpipev",
            "1f1b_slow_stage2",
        )
    }


def _overlap_share(run) -> float:
    """The share of the run's step windows in which consecutive steps overlap (ZBV: a rank
    starts the next step before others finish): the replay runs each step alone and counts
    that stretch as idle, which the measured figure no longer does (bubbles.rank_windows)."""
    from tracekit.analyze.bubbles import step_windows

    windows = step_windows(run.actions[run.actions["step"] >= 0])
    total = int((windows["window_end_ns"] - windows["window_start_ns"]).sum())
    overlap = (windows["window_end_ns"].to_numpy()[:-1] - windows["window_start_ns"].to_numpy()[1:]).clip(min=0)
    return float(overlap.sum()) / total if total else 0.0


def test_model_of_each_measured_run_is_within_two_points(samples):
    for name, run in samples.items():
        result = what_if(run, [("1F1B", 1, run.schedule.m)], samples=16)
        slack = 0.02 + _overlap_share(run)  # zbv: 2.9 points, its steps overlap by 3.8% of their windows
        assert abs(result.as_measured.bubble_ratio - result.measured_bubble) < slack, name
        assert abs(result.as_measured.step_ns / result.measured_step_ns - 1) < 0.01 + slack, name


def test_every_schedule_s_capture_predicts_the_1f1b_capture(samples):
    """Each sample run (same model and global batch, another schedule, fused or split
    backwards included) replayed as 1F1B lands within 2.5 points of the measured 1F1B run."""
    measured = what_if(samples["1f1b"], [("1F1B", 1, 8)], samples=4).measured_bubble
    for name in ("gpipe", "interleaved1f1b", "looped_bfs", "zbv", "interleaved_zb", "dualpipev"):
        predicted = what_if(samples[name], [("1F1B", 1, 8)]).predictions[0].bubble_ratio
        assert abs(predicted - measured) < 0.025, (name, predicted, measured)


def test_predictions_from_1f1b_match_the_runs_captured_with_those_schedules(samples):
    """The 1F1B sample's costs predict the GPipe and Interleaved1F1B samples (same model,
    same global batch, captured separately with those schedules)."""
    measured = {
        name: what_if(samples[name], [("1F1B", 1, 8)], samples=4).measured_bubble
        for name in ("gpipe", "interleaved1f1b")
    }
    result = what_if(samples["1f1b"], [("GPipe", 1, 8), ("1F1B", 1, 8), ("Interleaved1F1B", 2, 8)])
    by_schedule = {p.schedule: p for p in result.predictions}
    assert abs(by_schedule["GPipe"].bubble_ratio - measured["gpipe"]) < 0.03
    assert abs(by_schedule["Interleaved1F1B"].bubble_ratio - measured["interleaved1f1b"]) < 0.06
    assert by_schedule["Interleaved1F1B"].step_ns < by_schedule["1F1B"].step_ns
    # the replay sees what the closed form cannot (overheads, latencies, spread): above it
    for p in by_schedule.values():
        assert p.bubble_ratio > p.theory


def test_more_microbatches_shrink_the_bubble_and_the_slow_stage_still_dominates(samples):
    run = samples["1f1b_slow_stage2"]
    result = what_if(run, [("1F1B", 1, 8), ("1F1B", 1, 16), ("1F1B", 1, 32)])
    bubbles = [p.bubble_ratio for p in result.predictions]
    assert bubbles[0] > bubbles[1] > bubbles[2]
    # imbalance is not a fill/drain bubble: it stays far above the closed form
    assert bubbles[2] - result.predictions[2].theory > 0.2


def test_keep_microbatch_makes_the_step_longer_and_seed_makes_it_repeatable(samples):
    run = samples["1f1b"]
    same_batch = what_if(run, [("1F1B", 1, 16)], keep="global-batch", seed=3).predictions[0]
    same_size = what_if(run, [("1F1B", 1, 16)], keep="microbatch", seed=3).predictions[0]
    assert same_size.step_ns > 1.7 * same_batch.step_ns
    again = what_if(run, [("1F1B", 1, 16)], keep="global-batch", seed=3).predictions[0]
    assert again.to_dict() == same_batch.to_dict()


def test_impossible_targets_are_refused_or_skipped_with_the_reason(samples):
    run = samples["1f1b"]
    with pytest.raises(TracekitError, match="multiple of p=4"):
        what_if(run, [("Interleaved1F1B", 2, 6)])
    result = what_if(run, [("GPipe", 2, 8), ("1F1B", 1, 8)])
    assert len(result.predictions) == 1 and "one chunk per rank" in result.skipped[0]


def test_cli_json_and_console():
    runner = CliRunner()
    done = runner.invoke(
        main,
        [
            "whatif",
            str(SAMPLES / "1f1b"),
            "-s",
            "Interleaved1F1B",
            "-v",
            "2",
            "-m",
            "8",
            "--json",
            "--no-cache",
            "--no-progress",
        ],
    )
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    import jsonschema

    from conftest import ROOT

    jsonschema.validate(doc, json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text()))
    assert doc["measured"]["schedule"] == "1F1B" and len(doc["predictions"]) == 1
    assert doc["predictions"][0]["schedule"] == "Interleaved1F1B" and doc["predictions"][0]["v"] == 2
    assert 0 < doc["model_of_measured"]["bubble_ratio"] < 1
    text = runner.invoke(main, ["whatif", str(SAMPLES / "1f1b"), "--no-cache", "--no-progress"]).output
    assert "model of the measured run" in text and "fastest step" in text and "Interleaved1F1B v=2 m=16" in text


def test_cli_on_a_run_without_pipeline_is_one_line_and_exit_2(tmp_path):
    from conftest import shared_or_skip

    trace = shared_or_skip("kineto-gpu", "hta_trace_filter_sampled_rank-0.json.gz")
    done = CliRunner().invoke(main, ["whatif", str(trace), "--no-cache", "--no-progress"])
    assert done.exit_code == 2
    assert done.output.strip().count("\n") == 0
    assert "no pipeline actions found" in done.output


def test_balanced_split_of_the_slow_stage_run_predicts_the_balanced_capture(samples):
    """Stage 2 of `1f1b_slow_stage2` computes twice as long. Re-split evenly, the run should
    look like the balanced `1f1b` capture (same schedule) with 1.25x the compute per rank."""
    slow = what_if(samples["1f1b_slow_stage2"], [("1F1B", 1, 8)], balanced=True)
    plain, balanced = slow.predictions
    assert balanced.label == "1F1B v=1 m=8 ideal balance" and balanced.ideal_balance and not plain.ideal_balance
    reference = what_if(samples["1f1b"], [("1F1B", 1, 8)])
    assert abs(balanced.bubble_ratio - reference.measured_bubble) < 0.02
    assert balanced.step_ns == pytest.approx(1.25 * reference.measured_step_ns, rel=0.04)
    assert plain.bubble_ratio - balanced.bubble_ratio > 0.1


def _prediction(label: str, step_ms: float, m: int, **kw) -> Prediction:
    return Prediction(label, "1F1B", 4, 1, m, 0.2, 0.0, step_ms * 1e6, 0.0, None, "generated order", **kw)


def test_the_figures_the_renderers_show_are_the_results():
    """Change against the measured step, time per microbatch, the fastest row (an ideal
    balance is a bound, never it), the over-budget mark and the report's best rows are
    computed by the what-if, not by the console or the page."""
    rows = [_prediction("a", 90, 8), _prediction("b", 150, 16), _prediction("bound", 50, 8, ideal_balance=True)]
    model = constant_cost_model(4, {"F": 1_000_000, "B": 2_000_000})  # m=8
    result = WhatIf("run", model, 0.3, 100e6, rows[0], rows, [], "global-batch", 4, ["how"])
    assert rows[0].against(100e6) == pytest.approx(-0.1) and rows[1].microbatch_ns == pytest.approx(150e6 / 16)
    assert result.fastest is rows[0]
    assert result.fastest_where(lambda label: label != "a") is rows[1]  # a framework that cannot run "a"
    assert result.fastest_where(lambda label: False) is None
    assert result.measured_microbatch_ns == pytest.approx(12.5e6)
    assert result.microbatch_against(rows[1]) == pytest.approx(150 / 16 / 12.5 - 1)
    result.keep = "microbatch"
    assert result.fastest is rows[1]  # 9.4 ms a microbatch against 11.25
    search = Search(100, ActivationSize(10, "test"), "step time", None, [], 0)
    over, unknown = _prediction("x", 1, 8, activation_bytes=101), _prediction("y", 1, 8)
    assert search.over_budget(over) and not search.fits(over)
    assert not search.over_budget(unknown) and not search.fits(unknown)  # an unknown size is neither
    report = ReportWhatIf(result)
    assert report.best == [rows[1]] and report.rows == rows
    assert ReportWhatIf(None, "why").best == [] and ReportWhatIf(None, "why").rows == []
