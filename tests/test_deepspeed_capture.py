"""DeepSpeed's PipelineEngine capture (sample_traces/deepspeed_1f1b) and ``--framework deepspeed``.

The sample is a real capture (see sample_traces/README.md); DeepSpeed leaves no labels in a
CPU trace, so the truth is what its engine executed, logged into capture.json["engine"]
(per rank and profiled step: instruction, buffer, microbatch, wall-clock span).

The figures tracekit should reproduce are computed here from the raw JSON with plain json
and numpy, without tracekit. What counts as compute (written down once, used throughout):

* only main-thread (``tid == pid``) ``cpu_op`` events;
* forward layer ops: ``TracekitEmuWeightGrad``, ``aten::linear``, ``TracekitEmuCompute``,
  ``aten::relu`` (the emulated layers' work: the weight view, the real matmul, the sleep,
  the activation) and ``aten::mse_loss`` (the last stage's loss), but not DeepSpeed's own
  per-instruction work (input clones, label loads, loss scaling: engine host time);
  backward: every ``autograd::engine::evaluate_function: ...`` (each autograd node, the
  ``TracekitEmuComputeBackward`` / ``TracekitEmuWeightGradBackward`` sleeps among them);
* a run is a maximal sequence of layer ops of one direction with no ``c10d::`` op between
  them; its compute span runs from its first op's start to its last op's end (the tiny gaps
  between a stage's layers are part of the action, as in tracekit's action spans);
* a step's window is the first run start to the last run end over all ranks (runs belong
  to the ``ProfilerStep#N`` of their rank that holds their start); a rank's bubble is
  1 - sum(busy) / sum(window) over the profiled steps.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, SAMPLES

SAMPLE = SAMPLES / "deepspeed_1f1b"
P, M, LAYERS_PER_STAGE = 4, 8, 4
PROFILED_STEPS = (2, 3, 4)
FORWARD_OPS = {"TracekitEmuWeightGrad", "aten::linear", "TracekitEmuCompute", "aten::relu", "aten::mse_loss"}
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


# --------------------------------------------------------------------------------------
# reading the raw traces (no tracekit)
# --------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _capture(run_dir: Path = SAMPLE) -> dict:
    return json.loads((run_dir / "capture.json").read_text())


@lru_cache(maxsize=None)
def _trace(run_dir: Path, rank: int) -> dict:
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as fh:
        return json.load(fh)


def _main_ops(run_dir: Path, rank: int) -> list[dict]:
    """Main-thread complete events with absolute ns times (``start``, ``end``), by start."""
    trace = _trace(run_dir, rank)
    base = int(trace["baseTimeNanoseconds"])
    ops = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("tid") == e.get("pid"):
            start = base + round(e["ts"] * 1000)
            ops.append({**e, "start": start, "end": start + round(e["dur"] * 1000)})
    return sorted(ops, key=lambda e: e["start"])


def _direction(op: dict) -> str | None:
    if op.get("cat") != "cpu_op":
        return None
    if op["name"] in FORWARD_OPS:
        return "F"
    if op["name"].startswith(BACKWARD_PREFIX):
        return "B"
    return None


def compute_runs(run_dir: Path, rank: int) -> list[dict]:
    """The rank's forward and backward runs: ``{step, kind, start, end, sleeps}``, in order."""
    ops = _main_ops(run_dir, rank)
    steps = [(int(o["name"].split("#")[1]), o["start"], o["end"]) for o in ops if o["name"].startswith("ProfilerStep#")]
    runs: list[dict] = []
    current: dict | None = None
    for op in ops:
        if op["name"].startswith("c10d::"):
            current = None
            continue
        kind = _direction(op)
        if kind is None:
            continue
        if current is None or current["kind"] != kind:
            step = next((n for n, lo, hi in steps if lo <= op["start"] < hi), None)
            current = {"step": step, "kind": kind, "start": op["start"], "end": op["end"], "sleeps": {}}
            runs.append(current)
        current["end"] = max(current["end"], op["end"])
        if "TracekitEmu" in op["name"] and op["name"] != "TracekitEmuWeightGrad":
            name = op["name"].removeprefix(BACKWARD_PREFIX)
            current["sleeps"][name] = current["sleeps"].get(name, 0) + 1
    return runs


def independent_bubbles(run_dir: Path, ranks: int) -> dict[int, float]:
    """Per rank, 1 - busy / window over the profiled steps, from the raw events alone."""
    runs = {r: [x for x in compute_runs(run_dir, r) if x["step"] is not None] for r in range(ranks)}
    steps = sorted({x["step"] for rs in runs.values() for x in rs})
    window_ns = 0
    busy_ns = dict.fromkeys(runs, 0)
    for step in steps:
        spans = {
            r: np.array([(x["start"], x["end"]) for x in rs if x["step"] == step], dtype=np.int64)
            for r, rs in runs.items()
        }
        lo = min(int(s[:, 0].min()) for s in spans.values())
        hi = max(int(s[:, 1].max()) for s in spans.values())
        window_ns += hi - lo
        for r, s in spans.items():
            busy_ns[r] += _union_ns(s)
    return {r: 1 - busy_ns[r] / window_ns for r in runs}


def _union_ns(spans: np.ndarray) -> int:
    spans = spans[np.argsort(spans[:, 0])]
    total, cur_lo, cur_hi = 0, int(spans[0, 0]), int(spans[0, 1])
    for lo, hi in spans[1:].tolist():
        if lo > cur_hi:
            total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    return total + cur_hi - cur_lo


def _engine_steps(rank: int) -> dict[int, list[dict]]:
    engine = _capture()["engine"]
    fields = engine["instruction_fields"]
    return {int(s): [dict(zip(fields, ins)) for ins in rows] for s, rows in engine["ranks"][str(rank)]["steps"].items()}


def _p2p(op: dict) -> tuple[str, int]:
    return op["name"], int(op["args"]["Concrete Inputs"][2])


# --------------------------------------------------------------------------------------
# 1. facts of the committed sample
# --------------------------------------------------------------------------------------
def test_capture_json_says_what_ran():
    meta = _capture()
    assert meta["command"] == (
        "tracekit capture -o sample_traces/deepspeed_1f1b --schedule 1F1B --framework deepspeed -p 4 -m 8 --steps 3"
    )
    assert meta["framework"] == "deepspeed" and meta["deepspeed_version"] == "0.19.8"
    assert meta["torch_version"] == "2.13.0+cpu" and meta["backend"] == "gloo"
    assert meta["schedule"] == "1F1B"
    assert meta["schedule_class"] == "deepspeed.runtime.pipe.schedule.TrainSchedule"
    assert (meta["p"], meta["v"], meta["m"], meta["n_stages"], meta["steps"]) == (P, 1, M, P, 3)
    assert meta["stage_to_rank"] == [0, 1, 2, 3] == meta["engine"]["stage_to_rank"]
    assert meta["deepspeed"]["config"]["gradient_accumulation_steps"] == M
    assert meta["deepspeed"]["env"]["DS_ACCELERATOR"] == "cpu"
    assert meta["engine"]["partition"] == [0, 1, 2, 3, 4]  # one stage module per stage
    assert meta["compute"]["mode"] == "emulated" and meta["compute"]["layers_per_stage"] == LAYERS_PER_STAGE
    assert meta["profiler"]["schedule"] == {"wait": 1, "warmup": 1, "active": 3}
    assert meta["files"] == [f"rank{r}.json.gz" for r in range(P)]
    assert sorted(p.name for p in SAMPLE.iterdir()) == ["capture.json", *meta["files"]]
    # five training steps of the same maths as torch.distributed.pipelining's 1F1B sample
    assert len(meta["losses_per_step"]) == 5
    assert meta["losses_per_step"] == pytest.approx(_capture(SAMPLES / "1f1b")["losses_per_step"], rel=1e-5)


def test_engine_log_is_a_whole_train_schedule_per_rank_and_step():
    for rank in range(P):
        assert _capture()["engine"]["ranks"][str(rank)]["stage"] == rank
        steps = _engine_steps(rank)
        assert sorted(steps) == list(PROFILED_STEPS)
        for rows in steps.values():
            kinds = [row["instruction"] for row in rows]
            for kind, count in [
                ("ForwardPass", M),
                ("BackwardPass", M),
                ("SendActivation", M if rank < P - 1 else 0),
                ("RecvGrad", M if rank < P - 1 else 0),
                ("RecvActivation", M if rank > 0 else 0),
                ("SendGrad", M if rank > 0 else 0),
                ("LoadMicroBatch", M if rank in (0, P - 1) else 0),
            ]:
                assert kinds.count(kind) == count, (rank, kind)
                mbs = [row["microbatch"] for row in rows if row["instruction"] == kind]
                assert mbs == list(range(count)), (rank, kind)
            assert kinds[-3:] == ["ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]
            starts = [row["start_unix_ns"] for row in rows]
            assert starts == sorted(starts)


def test_traces_hold_steps_p2p_and_no_deepspeed_names():
    for rank in range(P):
        ops = _main_ops(SAMPLE, rank)
        names = {o["name"] for o in ops}
        assert {n for n in names if n.startswith("ProfilerStep#")} == {f"ProfilerStep#{s}" for s in PROFILED_STEPS}
        assert {"c10d::send", "c10d::recv_", "gloo:send", "gloo:recv", "c10d::allreduce_"} <= names
        every_name = {e.get("name", "") for e in _trace(SAMPLE, rank)["traceEvents"]}
        assert not [
            n
            for n in every_name
            if "deepspeed" in n.lower() or n.startswith("PP:") or n.startswith(("Forward ", "Backward "))
        ]
        # per step: 8 activations to the next rank, 8 gradients to the previous, none elsewhere
        p2p = [o for o in ops if o["name"] in ("c10d::send", "c10d::recv_")]
        expected = []
        if rank < P - 1:
            expected += [("c10d::send", rank + 1), ("c10d::recv_", rank + 1)]
        if rank > 0:
            expected += [("c10d::recv_", rank - 1), ("c10d::send", rank - 1)]
        assert sorted({_p2p(o) for o in p2p}) == sorted(expected)
        for key in expected:
            assert sum(_p2p(o) == key for o in p2p) == M * len(PROFILED_STEPS), (rank, key)
        assert all(o["args"]["Input Dims"][0] == [[8, 256]] for o in p2p)


def test_compute_runs_in_the_trace_are_the_engines_forward_and_backward_passes():
    """Counted from the raw JSON, and each run lies inside the engine's own instruction."""
    for rank in range(P):
        runs = compute_runs(SAMPLE, rank)
        engine = _engine_steps(rank)
        for step in PROFILED_STEPS:
            in_step = [x for x in runs if x["step"] == step]
            passes = [row for row in engine[step] if row["instruction"] in ("ForwardPass", "BackwardPass")]
            assert [x["kind"] for x in in_step] == [row["instruction"][0] for row in passes], (rank, step)
            assert sum(x["kind"] == "F" for x in in_step) == M and sum(x["kind"] == "B" for x in in_step) == M
            for run, row in zip(in_step, passes):
                assert row["start_unix_ns"] <= run["start"] and run["end"] <= row["end_unix_ns"], (rank, step, row)
                want = (
                    {"TracekitEmuCompute": LAYERS_PER_STAGE}
                    if run["kind"] == "F"
                    else {
                        "TracekitEmuComputeBackward": LAYERS_PER_STAGE,
                        "TracekitEmuWeightGradBackward": LAYERS_PER_STAGE,
                    }
                )
                assert run["sleeps"] == want, (rank, step, row)


def test_engine_holds_the_last_warmup_activation_until_the_first_gradient_arrives():
    """TrainSchedule sends an activation in the step after its forward, after that step's
    RecvGrad: the last warm-up forward's activation leaves only once gradient 0 is back."""
    for rank in range(P - 1):
        ops = _main_ops(SAMPLE, rank)
        runs = [x for x in compute_runs(SAMPLE, rank) if x["kind"] == "F"]
        sends = [o for o in ops if o["name"] == "c10d::send" and _p2p(o) == ("c10d::send", rank + 1)]
        grads = [o for o in ops if o["name"] == "gloo:recv"]
        held = P - 1 - rank  # the microbatch of the last warm-up forward
        for i, step in enumerate(PROFILED_STEPS):
            rows = _engine_steps(rank)[step]
            at = next(
                k for k, row in enumerate(rows) if row["instruction"] == "SendActivation" and row["microbatch"] == held
            )
            assert (rows[at - 1]["instruction"], rows[at - 1]["microbatch"]) == ("RecvGrad", 0)
            fwd = [x for x in runs if x["step"] == step]
            out = sends[i * M : (i + 1) * M]
            late_ms = [(s["start"] - f["end"]) / 1e6 for s, f in zip(out, fwd)]
            assert all(ms < 5 for ms in late_ms[:held]), late_ms  # warm-up sends: right away
            assert late_ms[held] > 15, late_ms  # held back
            first_grad_done = min(g["end"] for g in grads if g["start"] > fwd[held]["end"])
            assert out[held]["start"] >= first_grad_done


# --------------------------------------------------------------------------------------
# 2. the independent bubble, and what tracekit reads
# --------------------------------------------------------------------------------------
def test_independent_bubble_is_a_1f1b_bubble():
    bubbles = independent_bubbles(SAMPLE, P)
    theory = (P - 1) / (M + P - 1)
    for rank, bubble in bubbles.items():
        assert theory <= bubble <= theory + 0.12, (rank, bubble)


def test_independent_bubble_agrees_with_tracekit_on_the_torch_1f1b_sample(loaded_runs):
    """The helper measures what tracekit measures where tracekit reads the run well today."""
    _, analysis = loaded_runs(SAMPLES / "1f1b")
    ours = independent_bubbles(SAMPLES / "1f1b", P)
    for rank, row in _tracekit_ranks(analysis).items():
        assert row == pytest.approx(ours[rank], abs=0.01), rank


def _tracekit_ranks(analysis) -> dict[int, float]:
    from tracekit.render.json import to_document

    return {r["rank"]: r["bubble_ratio"] for r in to_document(analysis)["ranks"]}


def test_tracekit_finds_deepspeeds_1f1b(loaded_runs):
    run, _ = loaded_runs(SAMPLE)
    assert run.schedule.name == "1F1B"
    assert (run.schedule.p, run.schedule.v, run.schedule.m) == (P, 1, M)


def test_tracekit_finds_every_action_with_its_microbatch(loaded_runs):
    run, _ = loaded_runs(SAMPLE)
    actions = run.actions
    for rank in range(P):
        for step in PROFILED_STEPS:
            got = actions[(actions["rank"] == rank) & (actions["step"] == step)].sort_values("order")
            want = [
                (row["instruction"][0], row["microbatch"])
                for row in _engine_steps(rank)[step]
                if row["instruction"] in ("ForwardPass", "BackwardPass")
            ]
            assert list(zip(got["kind"], got["microbatch"])) == want, (rank, step)
            assert (got["stage"] == rank).all()


# The last stage's forward is the ops whose autograd nodes a backward ran: DeepSpeed's
# LoadMicroBatch and forward preamble before the first layer (up to 2.2 ms) and the loss
# scaling after it are engine host time, not the stage's compute (before tracekit trimmed
# them, rank 3 read 31.3% here against 32.5%).
def test_tracekit_bubble_per_rank_is_within_a_point_of_the_independent_one(loaded_runs):
    _, analysis = loaded_runs(SAMPLE)
    ours = independent_bubbles(SAMPLE, P)
    theirs = _tracekit_ranks(analysis)
    assert sorted(theirs) == list(range(P))
    for rank in range(P):
        assert theirs[rank] == pytest.approx(ours[rank], abs=0.01), (rank, theirs[rank], ours[rank])


# --------------------------------------------------------------------------------------
# 3. --framework deepspeed itself
# --------------------------------------------------------------------------------------
def test_without_deepspeed_the_command_says_how_to_install_it(tmp_path):
    out = tmp_path / "run"
    code = (
        "import sys\n"
        "sys.modules['deepspeed'] = None  # hidden: importing it raises ImportError\n"
        "from tracekit.cli import run\n"
        f"sys.argv = ['tracekit', 'capture', '--framework', 'deepspeed', '-o', {str(out)!r}]\n"
        "run()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), lines
    assert "pip install 'tracekit[deepspeed]'" in lines[0]
    assert not out.exists()


def _one_line_refusal(tmp_path, *args: str) -> str:
    from click.testing import CliRunner

    from tracekit.cli import main

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["capture", "--framework", "deepspeed", "-o", str(out), *args])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("tracekit: error:"), result.output
    assert not out.exists()
    return lines[0]


def test_injected_link_latency_is_refused_before_anything_starts(tmp_path):
    # the delay patches torch.distributed.isend, which DeepSpeed's blocking P2P never calls
    assert "--p2p-delay-ms is not available with --framework deepspeed" in _one_line_refusal(
        tmp_path, "--p2p-delay-ms", "5"
    )


def test_nsys_profiler_is_refused(tmp_path):
    pytest.importorskip("deepspeed", reason="the refusal comes after the check that deepspeed is installed")
    assert "drop --profiler nsys" in _one_line_refusal(tmp_path, "--profiler", "nsys")


def test_live_deepspeed_capture(tmp_path):
    pytest.importorskip("deepspeed", reason="needs DeepSpeed: pip install 'tracekit[deepspeed]' (DS_BUILD_OPS=0)")
    from click.testing import CliRunner

    from tracekit.cli import main

    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        ["capture", "--framework", "deepspeed", "-o", str(out), "-p", "2", "-m", "2", "--steps", "1", "--layers", "4"],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    meta = json.loads((out / "capture.json").read_text())
    assert (meta["framework"], meta["p"], meta["m"], meta["steps"]) == ("deepspeed", 2, 2, 1)
    assert sorted(p.name for p in out.iterdir()) == ["capture.json", "rank0.json.gz", "rank1.json.gz"]
    fields = meta["engine"]["instruction_fields"]
    for rank in range(2):
        rows = [dict(zip(fields, row)) for row in meta["engine"]["ranks"][str(rank)]["steps"]["2"]]
        runs = [x for x in compute_runs(out, rank) if x["step"] == 2]
        passes = [row for row in rows if row["instruction"] in ("ForwardPass", "BackwardPass")]
        # rank 0: F0 F1 B0 B1, rank 1: F0 B0 F1 B1
        assert [x["kind"] for x in runs] == [row["instruction"][0] for row in passes]
        assert sorted(x["kind"] for x in runs) == ["B", "B", "F", "F"]
        for run, row in zip(runs, passes):
            assert row["start_unix_ns"] <= run["start"] and run["end"] <= row["end_unix_ns"]
            assert run["sleeps"].get("TracekitEmuCompute" if run["kind"] == "F" else "TracekitEmuComputeBackward") == 2
    # the same maths as torch.distributed.pipelining: `tracekit capture -p 2 -m 2 --steps 1
    # --layers 4` (torch 2.13.0+cpu) reports this first loss too
    assert len(meta["losses_per_step"]) == 3 and meta["losses_per_step"][0] == pytest.approx(2.7607765, rel=1e-6)
