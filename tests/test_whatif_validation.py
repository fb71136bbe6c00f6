"""What-if against real re-captures (benchmarks/whatif_validation.py) on its small cases: the
noise floor (two captures of one config), one m change, and the table's handling of targets
tracekit cannot generate and captures that are absent."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT, SAMPLES

sys.path.insert(0, str(ROOT / "benchmarks"))
import whatif_validation as wv  # noqa: E402

# The goal on 4-rank emulated pairs: 3 points of bubble, 5% of step time. The noise
# floor measured +1.5 points and +2.7% (sample_traces/README.md, validation section): below
# the goal, so the goal can be told apart from capture noise at all.
GOAL_POINTS, GOAL_STEP = 3.0, 0.05


@pytest.fixture(scope="module")
def runs():
    return wv.Runs()


def _pair(name: str) -> wv.Pair:
    return next(p for p in wv.PAIRS if p.name == name and p.source == "validation/1f1b_repeat")


def test_the_validation_captures_are_there():
    # committed with the benchmark: nothing here may skip for want of them
    for name in ("1f1b_repeat", "1f1b_m16", "1f1b_m16_global_batch"):
        assert list((SAMPLES / "validation" / name).glob("rank*.json.gz")), name


def test_noise_floor_two_captures_of_one_config(runs):
    (floor,) = wv.noise_floor(runs)
    # Two captures of 1F1B p=4 m=8 a day apart on the shared 2-core machine (each the best
    # of several attempts): +1.5 points, +2.7%. A re-capture on a busier machine that moves
    # more than the goal makes every comparison in the table meaningless: this fails then.
    assert abs(floor["points"]) < GOAL_POINTS
    assert abs(floor["step_error"]) < GOAL_STEP


def test_one_m_change_predicted_from_the_same_session_capture(runs):
    # 1F1B m=8 -> m=16, microbatch kept (the step does twice the work), captured in one
    # session: -1.1 points, -2.9% (32 replays), within the goal. (From sample_traces/1f1b,
    # captured a day earlier with lighter overhead and latency tails, the same target misses:
    # -3.6 points; the table shows both.)
    row = wv.evaluate(_pair("1F1B m 8 -> 16, microbatch kept"), runs, replays=8)
    assert row.points is not None and row.step_error is not None
    assert abs(row.points) < GOAL_POINTS, row
    assert abs(row.step_error) < GOAL_STEP, row
    assert row.status == "ok"


def test_a_target_tracekit_cannot_generate_is_a_row_not_a_failure(runs):
    # tracekit's own refusal (check_target) is the reason shown
    pair = wv.Pair("x", "1f1b", "NoSuchSchedule", 1, 8, wv.GB, "1f1b")
    row = wv.evaluate(pair, runs)
    assert row.status == "not generated" and "NoSuchSchedule" in row.reason
    assert row.points is None
    assert "not generated" in wv.table([row])


def test_a_target_tracekit_refuses_is_a_row_with_its_reason(runs):
    # Interleaved1F1B needs m to be a multiple of p: tracekit's own one-line reason is shown
    row = wv.evaluate(wv.Pair("x", "1f1b", "Interleaved1F1B", 2, 6, wv.GB, "1f1b"), runs)
    assert row.status == "not generated" and "multiple of p=4" in row.reason


def test_an_absent_capture_is_a_row_not_a_failure(runs):
    row = wv.evaluate(wv.Pair("x", "no_such_capture", "1F1B", 1, 8, wv.GB, "1f1b"), runs)
    assert row.status == "not captured" and "no_such_capture" in row.reason


def test_compute_stretch_reads_the_emulated_cost_from_capture_json(runs):
    capture = {"compute": {"mode": "emulated", "layers_per_stage": 4, "per_layer_ms": {}}}
    assert wv.compute_stretch(runs.run("1f1b"), capture) is None  # no costs: nothing to divide by
    capture["compute"]["per_layer_ms"] = {"forward": 3.0, "backward_full": 6.0}
    stretch = wv.compute_stretch(runs.run("1f1b"), capture)
    # F = 4 layers x 3 ms: the sleeps overshoot and the matmuls add, never undershoot
    assert stretch is not None and 1.0 < stretch["F_median"] <= stretch["F_worst"] < 1.5
    assert 1.0 < stretch["B_median"] < 1.5


def test_the_interleaved_miss_is_the_gaps_between_actions(runs):
    # From 1F1B's costs, Interleaved1F1B v=2 comes out 3.6 points low (32 replays); with the
    # interleaved capture's own host overheads and latencies in place of 1F1B's (its compute
    # still 1F1B's) it lands on the measured 23.6% (-0.0 points): torch's runtime schedule
    # spends more host time per action, which 1F1B's samples cannot know.
    pair = next(p for p in wv.PAIRS if p.name == "1F1B -> Interleaved1F1B v=2")
    row = wv.evaluate(pair, runs, replays=8)
    assert row.points is not None and row.gaps_bubble is not None and row.measured_bubble is not None
    assert row.points < -2.0
    assert abs(row.gaps_bubble - row.measured_bubble) < 0.01


def test_deepspeed_sends_held_back_behind_a_receive_are_not_link_latency(runs):
    # DeepSpeed posts a forward's activation behind the next RecvGrad: the last warm-up send
    # leaves 27-87 ms after its forward. Pooled as link latency it landed on other messages
    # in the replay: the model of the measured run came out at 44.5% against 32.8% measured.
    # Counted from the send's post, the model is within 1 point (32.4%, 16 replays: 32.4%).
    from tracekit.analyze.costs import held_back_ns
    from tracekit.analyze.whatif import as_measured

    run = runs.run("deepspeed_1f1b")
    held = held_back_ns(run)
    assert len(held) == 54 and max(held.values()) > 80_000_000  # rank 0's last warm-up send
    measured = runs.measured("deepspeed_1f1b")
    own = as_measured(runs.model("deepspeed_1f1b"), samples=8)
    assert abs(own.bubble_ratio - measured.bubble) < 0.015
    assert runs.model("deepspeed_1f1b").held_back == 54
    # torch's schedules post right after the producer, and --p2p-delay-ms's late sends are
    # posted by another thread: link latency as the receiver sees it, kept as measured
    for name in ("1f1b", "1f1b_p2p_delay5ms", "interleaved1f1b", "dualpipev"):
        assert held_back_ns(runs.run(name)) == {}, name


def test_the_quiet_set_meets_the_goal_on_18_of_its_20_4_rank_pairs(runs):
    # sample_traces/validation/quiet/: every config captured back to back on an idle machine
    # (sample_traces/README.md). Issue #32's goal: 17 of 19 four-rank pairs within 3 points
    # and 5%; with 32 replays the benchmark gives 19 of 20 (the miss: 1F1B -> ZBVZeroBubble,
    # +4.1 points, benchmarks/README.md says why); 16 replays here give the same 19. At least
    # 18: without each action's fixed part (tracekit.reconstruct.fixed_part) it is 17, the two
    # m 8 -> 16 global-batch pairs missing by 7-8% of step time.
    pairs = wv.pairs_of(wv.SETS["quiet"])
    assert all(runs.exists(name) for p in pairs for name in (p.source, p.measured))
    rows = [wv.evaluate(p, runs, replays=16) for p in pairs]
    judged = [r for r in rows if r.status in ("ok", "miss")]
    assert len(judged) == 20
    ok = [r.pair.name for r in judged if r.status == "ok"]
    assert len(ok) >= 18, [(r.pair.name, r.points, r.step_error) for r in judged if r.status == "miss"]
    # and its noise floor is well below the goal
    (floor,) = wv.noise_floor(runs, wv.SETS["quiet"])
    assert abs(floor["points"]) < 1.0 and abs(floor["step_error"]) < 0.02
