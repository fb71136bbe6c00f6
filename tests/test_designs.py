"""PipeDream-2BW (no flush) and TeraPipe (token slices): the committed captures, how tracekit
reads them, and tiny live captures of each.

Independent figures are computed here from the raw Kineto events (labels and the emulated
sleeps' ops), never from tracekit's tables.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tracekit.analyze.replay import idle_per_rank, replay
from tracekit.analyze.schedules import graph_from_orders
from tracekit.analyze.slices import equalised_durations
from tracekit.analyze.theory import flush_free_bubble, sliced_bubble
from tracekit.cli import main
from tracekit.render.console import render as render_console
from tracekit.render.json import to_document

from conftest import SAMPLES, capture_of

TWO_BW = SAMPLES / "pipedream_2bw"
TERAPIPE = SAMPLES / "terapipe"
LABEL = re.compile(r"^PP:(\d+)([FB])(\d+)$")
EMU = ("TracekitEmuCompute", "TracekitEmuWeightGrad", "TracekitEmuComputeBackward", "TracekitEmuWeightGradBackward")


def _raw(run_dir: Path, rank: int) -> dict:
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as fh:
        return json.load(fh)


def raw_actions(run_dir: Path, p: int = 4) -> list[dict]:
    """Every PP: label of every rank with its step, its ProfilerStep and the span of the
    emulated sleeps inside it (absolute ns), read straight off the trace files."""
    out = []
    for rank in range(p):
        trace = _raw(run_dir, rank)
        base = int(trace["baseTimeNanoseconds"])
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]

        def ns(us: float, base: int = base) -> int:
            return base + int(round(us * 1000))

        steps = [
            (int(e["name"].split("#")[1]), ns(e["ts"]), ns(e["ts"] + e["dur"]))
            for e in events
            if e["name"].startswith("ProfilerStep#")
        ]
        sleeps = sorted(
            (ns(e["ts"]), ns(e["ts"] + e["dur"]))
            for e in events
            if e["name"] in EMU or e["name"].split(": ")[-1] in EMU
        )
        starts = np.array([s for s, _ in sleeps])
        for e in events:
            match = LABEL.match(e["name"])
            if not match:
                continue
            lo, hi = ns(e["ts"]), ns(e["ts"] + e["dur"])
            inside = [
                sleeps[i] for i in range(np.searchsorted(starts, lo), np.searchsorted(starts, hi)) if sleeps[i][1] <= hi
            ]
            step = next(s for s, a, b in steps if a <= lo <= b)
            out.append(
                {
                    "rank": rank,
                    "stage": int(match.group(1)),
                    "kind": match.group(2),
                    "mb": int(match.group(3)),
                    "step": step,
                    "label_start": lo,
                    "start": min(s for s, _ in inside),
                    "end": max(e_ for _, e_ in inside),
                }
            )
    return sorted(out, key=lambda a: (a["rank"], a["label_start"]))


def raw_step_start(run_dir: Path, rank: int, step: int) -> int:
    trace = _raw(run_dir, rank)
    mark = next(e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == f"ProfilerStep#{step}")
    return int(trace["baseTimeNanoseconds"]) + int(round(mark["ts"] * 1000))


def _need(run_dir: Path) -> None:
    if not (run_dir / "capture.json").is_file():
        pytest.skip(f"{run_dir} is not in this checkout")


# --------------------------------------------------------------------------------------
# the committed captures
# --------------------------------------------------------------------------------------
def test_2bw_sample_is_a_flush_free_pipeline_with_running_microbatch_ids():
    _need(TWO_BW)
    meta = capture_of(TWO_BW)
    assert meta["schedule"] == "PipeDream2BW" and (meta["p"], meta["v"], meta["m"]) == (4, 1, 8)
    assert meta["command"] == (
        "tracekit capture -o sample_traces/pipedream_2bw --schedule PipeDream2BW -p 4 -m 8 --steps 3"
    )
    assert meta["design"]["weight_versions"] == 2 and meta["design"]["weight_update_every_microbatches"] == 8
    assert meta["profiler"]["schedule"] == {"wait": 0, "warmup": 1, "active": 3}
    losses = meta["losses_per_step"]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    acts = raw_actions(TWO_BW)
    for rank in range(4):
        mine = [a for a in acts if a["rank"] == rank]
        assert {a["step"] for a in mine} == {1, 2, 3}
        for step in (1, 2, 3):
            backwards = [a["mb"] for a in mine if a["step"] == step and a["kind"] == "B"]
            # one weight update every 8 backwards, ids counting on: step k holds B 8(k-1)..8k-1
            assert backwards == list(range(8 * (step - 1), 8 * step))
            forwards = [a["mb"] for a in mine if a["step"] == step and a["kind"] == "F"]
            ahead = 4 - rank - 1  # forwards in flight over each update
            assert forwards == list(range(0 if step == 1 else 8 * (step - 1) + ahead, 8 * step + ahead))


def test_terapipe_sample_runs_forwards_in_order_and_backwards_last_slice_first():
    _need(TERAPIPE)
    meta = capture_of(TERAPIPE)
    assert meta["schedule"] == "TeraPipe" and (meta["p"], meta["m"]) == (4, 8)
    design = meta["design"]
    assert design["attention_share"] == 0.5 and design["a"] == 0.5 and design["b"] == 1.0
    assert design["slice_factor"] == pytest.approx([0.5 + (i + 0.5) / 8 for i in range(8)])
    assert all(np.isfinite(meta["losses_per_step"]))
    acts = raw_actions(TERAPIPE)
    for rank, step in {(a["rank"], a["step"]) for a in acts}:
        order = [(a["kind"], a["mb"]) for a in acts if a["rank"] == rank and a["step"] == step]
        assert order == [("F", i) for i in range(8)] + [("B", i) for i in reversed(range(8))]
    # the sleeps follow the cost model: slice 7's forward sleeps ~2.56x slice 0's
    fwd = {i: np.median([a["end"] - a["start"] for a in acts if a["kind"] == "F" and a["mb"] == i]) for i in range(8)}
    assert 2.0 <= fwd[7] / fwd[0] <= 2.8


# --------------------------------------------------------------------------------------
# reading them
# --------------------------------------------------------------------------------------
def test_2bw_is_recognised_as_one_continuous_pipeline(loaded_runs):
    _need(TWO_BW)
    run, analysis = loaded_runs(TWO_BW)
    sched = run.schedule
    assert sched.name == "PipeDream-2BW (no flush)" and sched.flush_free
    assert (sched.p, sched.v, sched.m) == (4, 1, 8)
    assert any("no flush" in e and "in flight over the weight update" in e for e in sched.evidence)
    assert not any("overlap" in w for w in run.warnings)
    # per-rank windows tile each rank's timeline; the first starts at the pipeline's first
    # compute, or where the rank's recording began if later
    bubbles = analysis.bubbles.sort_values(["rank", "step"])
    acts = raw_actions(TWO_BW)
    first_compute = min(a["start"] for a in acts)
    for rank, rows in bubbles.groupby("rank"):
        starts, ends = rows["window_start_ns"].to_numpy(), rows["window_end_ns"].to_numpy()
        assert (starts[1:] == ends[:-1]).all()
        expected = max(first_compute, raw_step_start(TWO_BW, rank, 1))
        assert abs(starts[0] - expected) < 200_000  # tracekit's compute span vs the sleeps: <0.2 ms
    theory = analysis.theory
    assert theory.bubble_ratio == pytest.approx(3 / 51)
    doc = to_document(analysis)
    assert doc["schedule"]["flush_free"] is True and doc["slices"] is None
    assert "no flush: a step is one rank's stretch between two of its weight updates" in render_console(doc)


def test_2bw_schedule_idle_is_the_fill_only(loaded_runs):
    """The fill, computed from the raw events: rank r waits for its first input, then, after
    its warm-up forwards, for its first gradient. tracekit's schedule idle (warmup + drain +
    gaps) is that in the first step and ~0 afterwards."""
    _need(TWO_BW)
    _, analysis = loaded_runs(TWO_BW)
    acts = raw_actions(TWO_BW)
    first_compute = min(a["start"] for a in acts)
    table = analysis.attribution.table.merge(analysis.bubbles, on=["rank", "step"], suffixes=("", "_b"))
    t_f = np.median([a["end"] - a["start"] for a in acts if a["kind"] == "F"])
    t_b = np.median([a["end"] - a["start"] for a in acts if a["kind"] == "B"])
    for rank in range(4):
        mine = [a for a in acts if a["rank"] == rank]
        warm_last = next(a for a in mine if a["kind"] == "F" and a["mb"] == 4 - rank - 1)
        first_b = next(a for a in mine if a["kind"] == "B" and a["mb"] == 0)
        window_start = max(first_compute, raw_step_start(TWO_BW, rank, 1))
        fill = (mine[0]["start"] - window_start) + (first_b["start"] - warm_last["end"])
        row = table[(table["rank"] == rank) & (table["step"] == 1)].iloc[0]
        schedule_idle = row["warmup_ns"] + row["drain_ns"] + row["schedule_gaps_ns"]
        # the measured fill holds overhead and latency too; the ideal one is r*t_f + (p-1-r)*t_b
        assert abs(row["warmup_ns"] - fill) <= 0.1 * fill + 3e6, (rank, row["warmup_ns"], fill)
        ideal_fill = rank * t_f + (4 - 1 - rank) * t_b
        assert row["warmup_ns"] == pytest.approx(ideal_fill, rel=0.05), (rank, row["warmup_ns"], ideal_fill)
        assert row["drain_ns"] == 0
        assert schedule_idle <= row["idle_ns"]
        for step in (2, 3):
            later = table[(table["rank"] == rank) & (table["step"] == step)].iloc[0]
            assert later["warmup_ns"] + later["drain_ns"] + later["schedule_gaps_ns"] <= 0.04 * later["window_ns"]


def test_terapipe_is_recognised_with_its_slice_skew(loaded_runs):
    _need(TERAPIPE)
    run, analysis = loaded_runs(TERAPIPE)
    assert run.schedule.name == "TeraPipe (token slices)" and not run.schedule.flush_free
    evidence = " ".join(run.schedule.evidence)
    assert "backwards last microbatch first" in evidence and "grows with its index" in evidence
    slices = analysis.slices
    assert slices.microbatches == list(range(8)) and slices.dearest == 7
    assert 1.8 <= slices.growth <= 2.8
    assert 0.05 <= slices.skew_idle_share <= 0.4
    assert analysis.theory.schedule == "TeraPipe (token slices)"
    # the balanced replay keeps each slice's cost, so it lands on the sliced theory, above GPipe's 3/11
    assert analysis.balanced_replay_ratio == pytest.approx(analysis.theory.bubble_ratio, abs=0.02)
    assert analysis.theory.bubble_ratio > 3 / 11 + 0.03
    doc = to_document(analysis)
    assert doc["slices"]["growth"] == pytest.approx(slices.growth, abs=1e-6)
    line = next(ln for ln in render_console(doc).splitlines() if ln.strip().startswith("slices:"))
    assert re.search(r"later slices cost up to \d\.\dx the first .*skew accounts for \d+\.\d% of idle", line)


def test_terapipe_per_slice_costs_match_the_raw_events(loaded_runs):
    _need(TERAPIPE)
    _, analysis = loaded_runs(TERAPIPE)
    acts = raw_actions(TERAPIPE)
    for i in range(8):
        for kind, reported in (("F", analysis.slices.forward_ns[i]), ("B", analysis.slices.backward_ns[i])):
            own = np.median([a["end"] - a["start"] for a in acts if a["kind"] == kind and a["mb"] == i])
            assert reported == pytest.approx(own, rel=0.05), (kind, i)


# --------------------------------------------------------------------------------------
# the closed forms against dependency-driven replays
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (3, 6)])
def test_sliced_theory_equals_a_replay_with_growing_slice_costs(p, m):
    orders = {r: [("F", r, i) for i in range(m)] + [("B", r, i) for i in reversed(range(m))] for r in range(p)}
    graph = graph_from_orders(orders, {"F": 1, "B": 2})
    cost_f = [100 + 30 * i for i in range(m)]
    graph.dur = np.array(
        [cost_f[mb] * (1 if k == "F" else 2) for k, mb in zip(graph.kind, graph.microbatch)], dtype=np.int64
    )
    result = replay(graph)
    idle = idle_per_rank(graph, result)
    window = result.makespan(graph.t0)
    theory = sliced_bubble("TeraPipe", p, cost_f, [2 * c for c in cost_f])
    assert sum(idle.values()) / (p * window) == pytest.approx(theory.bubble_ratio, abs=1e-9)
    # slices at their mean cost: GPipe's bubble
    flat = equalised_durations(graph, graph.dur)
    flat_idle = idle_per_rank(graph, replay(graph, dur=flat), flat)
    assert all(v == (p - 1) * (np.mean(cost_f) * 3) for v in flat_idle.values())


def test_flush_free_theory():
    assert flush_free_bubble("PipeDream-2BW", 4, 8, 3, fill_recorded=True).bubble_ratio == pytest.approx(3 / 51)
    assert flush_free_bubble("PipeDream-2BW", 4, 8, 3, fill_recorded=False).bubble_ratio == 0.0


# --------------------------------------------------------------------------------------
# options and tiny live captures
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (["--schedule", "PipeDream2BW", "-p", "4", "-m", "2"], "needs --microbatches >= -p/--pipeline-ranks"),
        (["--schedule", "1F1B", "--attention-share", "0.3"], "use it with --schedule TeraPipe"),
        (["--schedule", "TeraPipe", "--attention-share", "1.5"], "must be within [0, 1]"),
        (["--schedule", "TeraPipe", "--profiler", "nsys"], "runs torch's schedules only"),
        (["--schedule", "PipeDream2BW", "-v", "2"], "one stage per rank"),
    ],
)
def test_bad_design_options_are_one_line_errors(tmp_path, args, words):
    result = CliRunner().invoke(main, ["capture", "-o", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and words in lines[0], result.output
    assert not (tmp_path / "x").exists()


def _live(tmp_path: Path, schedule: str) -> Path:
    pytest.importorskip("torch", reason="capture needs torch: pip install 'tracekit[capture]'")
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["capture", "-o", str(out), "--schedule", schedule, "-p", "2", "-m", "2", "--steps", "2", "--layers", "4"]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return out


def test_live_capture_pipedream_2bw(tmp_path):
    out = _live(tmp_path, "PipeDream2BW")
    meta = json.loads((out / "capture.json").read_text())
    assert meta["schedule_class"] == "tracekit.capture.designs.PipeDream2BWLoop"
    assert len(meta["losses_per_step"]) == 3 and all(np.isfinite(meta["losses_per_step"]))
    for rank in range(2):
        names = {e["name"] for e in _raw(out, rank)["traceEvents"] if e.get("ph") == "X"}
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#1", "ProfilerStep#2"}
        assert {f"PP:{rank}F0", f"PP:{rank}B0", f"PP:{rank}B3"} <= names and "gloo:recv" in names

    from tracekit import load
    from tracekit.analyze import analyze

    run = load(out)
    assert run.schedule.name == "PipeDream-2BW (no flush)" and run.schedule.m == 2
    analysis = analyze(run)
    assert not any("overlap" in w for w in run.warnings)
    table = analysis.attribution.table
    assert (
        table[[c for c in table.columns if c.endswith("_ns") and c != "idle_ns"]].sum(axis=1) == table["idle_ns"]
    ).all()


def test_live_capture_terapipe(tmp_path):
    out = _live(tmp_path, "TeraPipe")
    meta = json.loads((out / "capture.json").read_text())
    assert meta["design"]["slice_factor"] == pytest.approx([0.75, 1.25])
    assert all(np.isfinite(meta["losses_per_step"]))
    acts = raw_actions(out, p=2)
    for rank in range(2):
        for step in (2, 3):
            order = [(a["kind"], a["mb"]) for a in acts if a["rank"] == rank and a["step"] == step]
            assert order == [("F", 0), ("F", 1), ("B", 1), ("B", 0)]

    from tracekit import load
    from tracekit.analyze import analyze

    run = load(out)
    assert run.schedule.name == "TeraPipe (token slices)"
    analysis = analyze(run)
    assert analysis.slices.dearest == 1 and analysis.slices.growth > 1.2


def test_whatif_refuses_a_flush_free_run_in_one_line():
    _need(TWO_BW)
    result = CliRunner().invoke(main, ["whatif", str(TWO_BW)])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "has no flush" in lines[0], result.output
