"""The diagnosis names the fault each sample run was recorded with, from its own numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SAMPLES
from tracekit.analyze.diagnosis import FAULTS, HIGH_SHARE, Finding, diagnose, m_what_if
from tracekit.analyze.theory import theoretical_bubble


def sample(name: str) -> Path:
    path = SAMPLES / name
    if not list(path.glob("rank*.json.gz")):
        pytest.skip(f"{path} holds no traces (sample being recorded?)")
    return path


def findings_of(loaded_runs, name: str) -> list[Finding]:
    _, analysis = loaded_runs(sample(name))
    return diagnose(analysis)


def percents(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", text)]


def test_slow_stage_is_named_first(loaded_runs):
    findings = findings_of(loaded_runs, "1f1b_slow_stage2")
    top = findings[0]
    assert top.cause == "imbalance"
    assert top.figures["stage"] == 2 and top.headline.startswith("Stage 2 (rank 2) is")
    assert top.figures["slowdown"] > 1.4  # recorded with stage 2 at 2x its layers' time
    assert "move layers off stage 2" in top.advice.lower()
    assert top.severity == "high"


def test_p2p_delay_is_named_as_comm(loaded_runs):
    findings = findings_of(loaded_runs, "1f1b_p2p_delay5ms")
    top = findings[0]
    assert top.cause == "comm"
    assert "link" in top.headline
    # The fault delays each send by 5 ms on the sender's side: the diagnosis sees the send
    # leave late, not a slow wire.
    assert 4e6 < top.figures["median_post_delay_ns"] < 8e6
    assert "post sends" in top.advice.lower()


def test_the_comm_findings_example_is_a_message_on_the_blamed_link(loaded_runs):
    """megatron_interleaved blamed link 1->2 and quoted, as its latest late send, rank 2's
    send to rank 3: another link's message."""
    comm = next(f for f in findings_of(loaded_runs, "megatron_interleaved") if f.cause == "comm")
    worst = comm.figures["worst_late_post"]
    assert (worst["src_rank"], worst["dst_rank"]) == (comm.figures["src_rank"], comm.figures["dst_rank"])
    assert f"The latest: rank {worst['src_rank']} posts" in comm.advice
    assert f"to rank {worst['dst_rank']} " in comm.advice


def test_clean_1f1b_is_fill_drain_with_an_m_what_if(loaded_runs):
    _, analysis = loaded_runs(sample("1f1b"))
    top = diagnose(analysis)[0]
    assert top.cause == "fill_drain"
    sched = analysis.run.schedule
    assert f"m={sched.m}" in top.headline and f"p={sched.p}" in top.headline
    new_m = top.figures["what_if_m"]
    assert new_m > sched.m and f"raising m to {new_m}" in top.advice.lower()
    # the what-if figures are the closed form's, at the old and the new m
    assert top.figures["theory_bubble"] == pytest.approx((sched.p - 1) / (sched.m + sched.p - 1), abs=1e-4)
    assert top.figures["what_if_bubble"] == pytest.approx((sched.p - 1) / (new_m + sched.p - 1), abs=1e-4)
    # the closed form's m is quoted with its replay: a gain with the closed form's bubble
    # beside it, or left out as slower. On this run each action's fixed part (a smaller
    # microbatch keeps it) makes m=32 replay slower (+5%), m=16 faster (-4%)
    suggested, _, left_out = top.advice.partition("Left out, slower as replayed:")
    rows = {r["text"]: r for r in top.figures["suggestions"]}
    closed = rows[f"raising m to {new_m}"]
    if closed["helps"]:
        assert f"raising m to {new_m}: step" in suggested
        assert f"{round(100 * top.figures['what_if_bubble'])}% in closed form" in suggested
    else:
        assert f"raising m to {new_m} (step +" in left_out and closed["replay_step_change"] > 0
    assert any(r["helps"] and r["text"].startswith("raising m to") for r in rows.values())


def test_findings_are_ranked_and_sentences(loaded_runs):
    for name in ("1f1b", "1f1b_slow_stage2", "interleaved1f1b"):
        findings = findings_of(loaded_runs, name)
        causes = [f.cause for f in findings]
        assert len(causes) == len(set(causes)) and "fill_drain" in causes
        # costly faults first, then everything else by cost, then what only informs
        urgent = [f for f in findings if f.cause in FAULTS and f.cost_share >= HIGH_SHARE]
        assert findings[: len(urgent)] == sorted(urgent, key=lambda f: -f.cost_share)
        rest = [f.cost_share for f in findings[len(urgent) :] if f.severity != "info"]
        assert rest == sorted(rest, reverse=True)
        info = [i for i, f in enumerate(findings) if f.severity == "info"]
        assert info == list(range(len(findings) - len(info), len(findings)))
        for f in findings:
            assert f.headline.endswith(".") and f.advice.endswith(".")
            assert f.severity in ("high", "medium", "low", "info")
            assert 0 <= f.cost_share <= 1
            assert f.to_dict()["figures"] == f.figures


def test_m_what_if_reaches_the_target_or_the_cap(loaded_runs):
    _, analysis = loaded_runs(sample("1f1b"))
    sched = analysis.run.schedule
    new_m, ratio = m_what_if(analysis)
    assert new_m in (2 * sched.m, 4 * sched.m, 8 * sched.m)
    assert ratio == pytest.approx(theoretical_bubble(sched.name, sched.p, sched.v, new_m).bubble_ratio)
    assert ratio <= 0.10 or new_m == 8 * sched.m
    smaller = theoretical_bubble(sched.name, sched.p, sched.v, new_m // 2).bubble_ratio
    assert new_m // 2 == sched.m or smaller > 0.10


def test_no_pipeline_says_so(loaded_runs):
    from tracekit.analyze import Analysis
    from tracekit.analyze.bubbles import summarise

    run, analysis = loaded_runs(sample("1f1b"))
    plain = Analysis(
        run=type(run)(source=run.source, files=run.files, events=run.events, steps=run.steps),
        bubbles=analysis.bubbles,
        summary=summarise(analysis.bubbles),
    )
    [finding] = diagnose(plain)
    assert finding.cause == "no_pipeline" and finding.severity == "info"
    assert "No pipeline-parallel schedule" in finding.headline


def test_fill_drain_advice_quotes_the_replayed_what_if(loaded_runs):
    from tracekit.analyze.costs import cost_model
    from tracekit.analyze.whatif import predict

    _, analysis = loaded_runs(sample("1f1b"))
    top = diagnose(analysis)[0]
    assert "tracekit whatif" in top.advice and top.advice.endswith(".")
    new_m = top.figures["what_if_m"]
    # the finding's replay is tracekit whatif's (the fixed part of each action included)
    direct = predict(cost_model(analysis.run), "1F1B", 1, new_m, samples=16)
    assert top.figures["replay_what_if_bubble"] == pytest.approx(direct.bubble_ratio, abs=1e-4)
    # overheads and latencies do not shrink with the microbatch: above the closed form
    assert top.figures["replay_what_if_bubble"] > top.figures["what_if_bubble"]
    assert "replay_interleaved_v2_bubble" in top.figures


# Runs whose replays rank the closed form's suggestions differently: raising m replays slower
# on all three, and on the last two nothing helps (per-action overheads, real compute).
REPLAYED_SAMPLES = ("1f1b", "1f1b_p2p_delay5ms", "1f1b_real", "megatron_interleaved")


@pytest.mark.parametrize("name", REPLAYED_SAMPLES)
def test_advice_never_contradicts_its_own_replay(loaded_runs, name):
    [finding] = [f for f in findings_of(loaded_runs, name) if f.cause == "fill_drain"]
    rows = finding.figures["suggestions"]
    changes = [r["replay_step_change"] for r in rows]
    assert changes == sorted(changes), "ranked by the replayed step time"
    assert "--keep global-batch" in finding.advice and finding.figures["replay_keep"] == "global-batch"
    helping = [r for r in rows if r["helps"]]
    assert all(r["replay_step_change"] < 0 for r in helping)
    if not helping:
        # nothing to gain from the schedule as replayed: said so, and the finding only informs
        assert finding.severity == "info" and finding.figures["replay_none_helps"]
        assert "no change of the schedule shortens" in finding.advice
        return
    suggested, _, left_out = finding.advice.partition("Left out, slower as replayed:")
    positions = [suggested.index(f"{r['text']}: step") for r in helping]
    assert positions == sorted(positions), "quoted best first"
    for r in rows:
        if not r["helps"]:
            assert r["text"] not in suggested and r["text"] in left_out


def test_slower_suggestions_are_dropped_on_the_delayed_link_run(loaded_runs):
    [finding] = [f for f in findings_of(loaded_runs, "1f1b_p2p_delay5ms") if f.cause == "fill_drain"]
    by_text = {r["text"]: r for r in finding.figures["suggestions"]}
    # 5 ms late sends: more microbatches pay that latency more often (+42% replayed at m=32)
    assert not by_text["raising m to 32"]["helps"] and by_text["raising m to 32"]["replay_step_change"] > 0.2
    assert by_text["Interleaved1F1B with v=2 at m=8"]["helps"]
    assert finding.advice.index("Interleaved1F1B with v=2") < finding.advice.index("Left out")


def test_closed_form_advice_says_it_was_not_replayed(loaded_runs):
    """Where the run cannot be replayed (here: analysed without attribution; LoopedBFS, the
    sample this used, is now a what-if target and replays), the advice says it is the closed
    form's."""
    from tracekit.analyze import analyze

    run, replayed = loaded_runs(sample("looped_bfs"))
    [finding] = [f for f in diagnose(analyze(run, attribution=False)) if f.cause == "fill_drain"]
    assert "closed form only: not replayed" in finding.advice and "suggestions" not in finding.figures
    [finding] = [f for f in diagnose(replayed) if f.cause == "fill_drain"]
    assert "Replayed with this run's own" in finding.advice and "suggestions" in finding.figures
