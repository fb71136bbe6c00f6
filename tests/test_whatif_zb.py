"""Zero-bubble and DualPipeV what-if targets: torch's orders and tracekit's agree action for
action, ideal costs give the closed forms, and the 1F1B sample's costs predict the samples
captured with those schedules (same model, same global batch)."""

from __future__ import annotations

import json
import sys
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
from generated_costs import constant_cost_model
from tracekit import LoadOptions, load
from tracekit.analyze.replay import replay
from tracekit.analyze.schedules import (
    GENERATORS,
    ZERO_BUBBLE,
    dualpipev,
    flatten,
    graph_from_orders,
    orders_for,
    torch_orders,
)
from tracekit.analyze.theory import theoretical_bubble
from tracekit.analyze.costs import CostModel
from tracekit.analyze.whatif import predict, what_if
from tracekit.cli import main
from tracekit.errors import TracekitError

# (p, v, m) per schedule: even and odd p, m below, at and above the fill, rounds that split
# unevenly (p=4, m=10: two rounds of 5), v up to 4.
CONFIGS = {
    "ZB-H1": [(p, 1, m) for p in (2, 3, 4, 8) for m in (1, 3, 4, 8, 10, 16)],
    "InterleavedZeroBubble": [(p, v, m) for p in (2, 3, 4, 8) for v in (2, 3, 4) for m in (2, 4, 8, 10, 12, 16)],
    "ZBVZeroBubble": [(p, 2, m) for p in (2, 3, 4, 8) for m in (1, 3, 5, 8, 9, 16, 24)],
    "DualPipeV": [(p, 2, m) for p in (2, 3, 4, 5, 8) for m in (2 * p - 1, 2 * p, 2 * p + 1, 3 * p, 24)],
}


def _orders_or_refusal(make, *args):
    try:
        return {r: list(o) for r, o in make(*args).items()}
    except ValueError:
        return "refused"


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_torch_and_tracekit_orders_agree_action_for_action(schedule):
    pytest.importorskip("torch.distributed.pipelining")
    for p, v, m in CONFIGS[schedule]:
        ours = _orders_or_refusal(GENERATORS[schedule], p, v, m)
        theirs = _orders_or_refusal(torch_orders, schedule, p, v, m)
        assert ours == theirs, (schedule, p, v, m)
    # the check sees something: DualPipeV's fused pairs and refusals are in the comparison
    assert any(isinstance(e[0], tuple) for e in torch_orders("DualPipeV", 4, 2, 8)[0])
    assert _orders_or_refusal(torch_orders, "DualPipeV", 4, 2, 7) == "refused"


def test_looped_bfs_order_is_torchs():
    """LoopedBFS targets (what-if) come from tracekit's generator: the same order as torch's
    ScheduleLoopedBFS, action for action."""
    pytest.importorskip("torch.distributed.pipelining")
    for p, v, m in [(p, v, m) for p in (2, 3, 4, 8) for v in (1, 2, 3) for m in (1, 4, 8, 9)]:
        assert _orders_or_refusal(GENERATORS["LoopedBFS"], p, v, m) == _orders_or_refusal(
            torch_orders, "LoopedBFS", p, v, m
        ), (p, v, m)


def test_a_looped_bfs_run_is_a_target_of_its_own_what_if():
    """Every schedule tracekit reads is a target: the real LoopedBFS capture's what-if lists
    LoopedBFS (not in the default grid of other runs) and replays its measured configuration
    as the model of the measured run does; a 1F1B run takes ``-s LoopedBFS``."""
    looped = CliRunner().invoke(main, ["whatif", str(SAMPLES / "looped_bfs"), "--json", "--no-progress"])
    assert looped.exit_code == 0, looped.output
    doc = json.loads(looped.stdout)
    rows = {(r["schedule"], r["v"], r["m"]): r for r in doc["predictions"]}
    assert ("LoopedBFS", 2, 8) in rows and ("LoopedBFS", 2, 16) in rows
    own = rows[("LoopedBFS", 2, 8)]
    assert abs(own["bubble_ratio"] - doc["model_of_measured"]["bubble_ratio"]) < 0.01
    plain = CliRunner().invoke(main, ["whatif", str(SAMPLES / "1f1b"), "--json", "--no-progress"])
    assert not any(r["schedule"] == "LoopedBFS" for r in json.loads(plain.stdout)["predictions"])
    asked = CliRunner().invoke(main, ["whatif", str(SAMPLES / "1f1b"), "-s", "LoopedBFS", "--no-progress"])
    assert asked.exit_code == 0 and "LoopedBFS v=2 m=8" in asked.output, asked.output


def test_without_torch_the_generator_gives_the_order(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed: import torch fails
    orders, source = orders_for("ZBVZeroBubble", 4, 2, 8)
    assert source == "tracekit's generator"
    assert orders == {r: list(o) for r, o in GENERATORS["ZBVZeroBubble"](4, 2, 8).items()}


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_every_order_runs_each_microbatch_once_and_cannot_deadlock(schedule):
    for p, v, m in CONFIGS[schedule]:
        orders = _orders_or_refusal(GENERATORS[schedule], p, v, m)
        if orders == "refused":
            continue
        flat, _ = flatten(orders)
        done = [(k, s, i) for r in flat for k, s, i in flat[r]]
        assert len(done) == len(set(done)), (schedule, p, v, m)
        for s in range(p * v):
            for i in range(m):
                assert ("F", s, i) in done
                assert (("B", s, i) in done) != (("I", s, i) in done and ("W", s, i) in done)
        graph_from_orders(orders, {"F": 1, "B": 2, "I": 1, "W": 1})  # raises on a dependency cycle


def test_a_fused_pair_sends_its_forward_output_after_its_backward():
    """torch posts a fused OVERLAP_F_B label's sends after both halves: the next rank's
    forward waits for the backward too."""
    orders = dualpipev(4, 8)
    flat, fused = flatten(orders)
    graph = graph_from_orders(orders, {"F": 10, "B": 20, "I": 10, "W": 10})
    second = fused[graph.action_id]
    first = np.zeros(len(second), dtype=bool)
    first[graph.prev[second]] = True
    assert first.sum() > 0
    assert not first[graph.edge_src].any()  # no message leaves a first half
    result = replay(graph)
    for s, d in zip(graph.edge_src, graph.edge_dst):
        if second[s] and graph.kind[d] == "F":
            assert result.start[d] >= result.end[s]  # waited for the backward half


def _ideal_model(p: int, v: int, t_f: int, t_i: int, t_w: int) -> CostModel:
    """A generated cost model (unit-test fixture, not a trace): constant compute per
    microbatch (per-rank figures: v chunks' worth), no overhead, free messages; stage 0's
    I and W as the others' so that every stage is balanced."""
    model = constant_cost_model(p, {"F": v * t_f, "B": v * (t_i + t_w), "I": v * t_i, "W": v * t_w})
    model.work[(0, "I0")], model.work[(0, "W0")] = model.work[(0, "I")], model.work[(0, "W")]
    return model


@pytest.mark.parametrize(
    "schedule,p,v,m,costs",
    [
        ("ZB-H1", 2, 1, 4, (1000, 1000, 1000)),
        ("ZB-H1", 4, 1, 8, (1000, 1000, 1000)),
        ("ZB-H1", 4, 1, 8, (1000, 1200, 800)),
        ("ZB-H1", 8, 1, 16, (2000, 1000, 500)),
        ("InterleavedZeroBubble", 4, 2, 8, (1000, 1000, 1000)),
        ("InterleavedZeroBubble", 4, 2, 16, (1000, 1200, 800)),
        ("InterleavedZeroBubble", 4, 3, 12, (1000, 1000, 500)),
        ("InterleavedZeroBubble", 8, 2, 16, (1000, 1000, 1000)),
        # DualPipeV's closed form holds at t_f = t_I = t_W (the README's F, B, W in a 2p-stage DualPipe)
        ("DualPipeV", 4, 2, 8, (1000, 1000, 1000)),
        ("DualPipeV", 3, 2, 12, (1000, 1000, 1000)),
        ("DualPipeV", 8, 2, 16, (1000, 1000, 1000)),
    ],
)
def test_ideal_costs_give_the_closed_form_exactly(schedule, p, v, m, costs):
    t_f, t_i, t_w = costs
    got = predict(_ideal_model(p, v, t_f, t_i, t_w), schedule, v, m, keep="microbatch", samples=4)
    theory = theoretical_bubble(schedule, p, v, m, t_f, t_i + t_w, t_w)
    assert got.bubble_sd == 0 and got.step_sd == 0
    assert got.bubble_ratio == pytest.approx(theory.bubble_ratio, abs=1e-12)
    assert theory.note == "" or schedule == "DualPipeV"


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_torch_s_zbv_order_idles_p_minus_1_forwards_where_the_paper_s_zb_v_idles_none(p, m):
    """No closed form for torch's ZBV order in general; at t_f = t_I = t_W it idles exactly
    (p-1)·t_f per device (the paper's ZB-V, with its own order, reaches ~0). The theory
    column quotes the paper's bound and says so."""
    t = 1000
    got = predict(_ideal_model(p, 2, t, t, t), "ZBVZeroBubble", 2, m, keep="microbatch", samples=4)
    work = 2 * m * 3 * t
    assert got.bubble_ratio == pytest.approx(float(Fraction((p - 1) * t, (p - 1) * t + work)), abs=1e-12)
    theory = theoretical_bubble("ZBVZeroBubble", p, 2, m)
    assert theory.bubble_ratio == 0 and "(p-1)t_f" in theory.note


@pytest.fixture(scope="module")
def samples():
    return {
        name: load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
        for name in ("1f1b", "zbv", "interleaved_zb", "dualpipev")
    }


def test_the_1f1b_capture_predicts_the_zero_bubble_captures(samples):
    """From sample_traces/1f1b's costs (whole backwards: I and W each half of B's work ops
    plus all of its fixed part, tracekit.analyze.costs._split_costs), the three zero-bubble
    captures of the same model and global batch (4 ranks, v=2, m=8). Figures at seed 0, 32
    replays (predicted vs measured bubble, step):
      ZBVZeroBubble          12.8% vs  9.8% (+3.0 pt), 394.0 vs 374.3 ms (+5.3%)
      InterleavedZeroBubble  13.7% vs 15.8% (-2.2 pt), 397.9 vs 408.5 ms (-2.6%)
      DualPipeV              16.0% vs 15.9% (+0.1 pt), 398.3 vs 394.5 ms (+1.0%)
    With I and W taken as halves of B (before the fixed part), the interleaved step was
    -6.3%: a split backward computes ~5% more than a whole one (I + W per chunk 14.3 ms
    against a whole B of 13.6 ms whose fixed part is 0.9 ms). ZBV was +0.7% then: two
    errors cancelling, its replay's own (the ZBV capture replayed on its own costs: +2.6
    points, +3.0%) and halves of B's (-4%); now I + W is +2% (each pays the whole fixed
    part, the captures show ~0.7 of it), and the two add up: ZBV's bound is the issue's 5%
    plus its replay's own 3%, not a compute error. Replayed from its own costs the
    interleaved target lands within 0.5 points and 0.5% (next test)."""
    measured = {
        name: what_if(samples[name], [("1F1B", 1, 8)], samples=4) for name in ("zbv", "interleaved_zb", "dualpipev")
    }
    result = what_if(samples["1f1b"], [("ZBVZeroBubble", 2, 8), ("InterleavedZeroBubble", 2, 8), ("DualPipeV", 2, 8)])
    assert not result.skipped
    assert any(a.startswith("I and W not measured") for a in result.assumptions)
    for prediction, name, step_tolerance in zip(
        result.predictions,
        ("zbv", "interleaved_zb", "dualpipev"),
        # the 5%; for ZBV plus its replay's own error of its capture, +3.0% (docstring)
        (0.08, 0.05, 0.05),
    ):
        want = measured[name]
        assert abs(prediction.bubble_ratio - want.measured_bubble) < 0.03, name
        assert abs(prediction.step_ns / want.measured_step_ns - 1) < step_tolerance, name
    zbv, interleaved, dual = result.predictions
    assert zbv.bubble_ratio < interleaved.bubble_ratio  # as measured: 9.8% < 15.8%


def test_a_split_run_s_own_i_and_w_predict_its_own_schedule(samples):
    """The interleaved zero-bubble capture's measured I and W (stage 0's I empty) replayed
    in torch's order of the same schedule: within the model's own error of the capture."""
    run = samples["interleaved_zb"]
    result = what_if(run, [("InterleavedZeroBubble", 2, 8)])
    assert result.model.split_backward
    assert float(np.median(result.model.work[(0, "I0")])) < 1e6 < float(np.median(result.model.work[(0, "W0")]))
    (got,) = result.predictions
    assert abs(got.bubble_ratio - result.measured_bubble) < 0.02
    assert abs(got.step_ns / result.measured_step_ns - 1) < 0.03


def test_impossible_zero_bubble_targets_are_refused_with_the_reason(samples):
    run = samples["1f1b"]
    with pytest.raises(TracekitError, match="m >= 2p = 8"):
        what_if(run, [("DualPipeV", 2, 6)])
    with pytest.raises(TracekitError, match="exactly 2 stages per rank"):
        what_if(run, [("ZBVZeroBubble", 3, 8)])
    with pytest.raises(TracekitError, match="changing the number of ranks is out of scope"):
        what_if(run, [("ZBVZeroBubble", 2, 8)], p=8)


def test_cli_zero_bubble_targets_in_json_and_p_refused_in_one_line():
    runner = CliRunner()
    args = ["whatif", str(SAMPLES / "1f1b"), "--no-cache", "--no-progress", "--replays", "4"]
    done = runner.invoke(main, [*args, "-s", "ZBVZeroBubble", "-s", "ZB-H1", "-m", "8", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    import jsonschema

    jsonschema.validate(doc, json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text()))
    assert [(p["schedule"], p["v"]) for p in doc["predictions"]] == [("ZBVZeroBubble", 2), ("ZB-H1", 1)]
    assert all(p["orders"] for p in doc["predictions"])
    assert doc["measured"]["split_backward"] is False
    assert any("half of B" in a for a in doc["assumptions"])
    refused = runner.invoke(main, [*args, "-p", "8"])
    assert refused.exit_code == 2
    assert refused.output.strip().count("\n") == 0 and "out of scope" in refused.output
    # by default only on request (importing torch's schedules takes seconds), and said so
    text = runner.invoke(main, args).output
    assert "ZBVZeroBubble v=2 m=8" not in text and "-s ZBVZeroBubble" in text and "-s DualPipeV" in text
