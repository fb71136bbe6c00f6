"""The committed 3-D captures (`tracekit capture --tensor-parallel / --data-parallel /
--recompute`): what the traces and capture.json hold, read from the raw files, not through
tracekit's analysis. Plus the option checks (no torch needed) and the layout arithmetic.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.capture.config import CaptureConfig
from tracekit.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
MAX_FOLDER_BYTES = 4_000_000
PROFILED_STEPS = (2, 3, 4)


@cache
def _trace(folder: str, rank: int) -> dict:
    with gzip.open(SAMPLES / folder / f"rank{rank}.json.gz", "rt") as fh:
        return json.load(fh)


@cache
def _capture(folder: str) -> dict:
    return json.loads((SAMPLES / folder / "capture.json").read_text())


def _main_thread(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == e["pid"]]


def _inside(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])


def _enclosing(event: dict, candidates: list[dict]) -> list[str]:
    return [c["name"] for c in candidates if c is not event and _inside(event, c)]


def _groups_by_desc(trace: dict) -> dict[str, list[int]]:
    return {g["pg_desc"]: g["ranks"] for g in trace["distributedInfo"]["pg_config"]}


def _measured(folder: str, rank: int) -> dict[int, dict[str, dict[str, int]]]:
    per_step = _capture(folder)["layout"]["measured"][str(rank)]["per_step"]
    return {s["profiler_step"]: s for s in per_step}


def _check_files(folder: str, world: int) -> None:
    files = sorted(p.name for p in (SAMPLES / folder).iterdir())
    assert files == ["capture.json"] + [f"rank{r}.json.gz" for r in range(world)]
    assert sum((SAMPLES / folder / f).stat().st_size for f in files) < MAX_FOLDER_BYTES
    cap = _capture(folder)
    assert cap["command"].startswith(f"tracekit capture -o sample_traces/{folder} ")
    assert cap["torch_version"].startswith("2.13") and cap["python_version"]
    assert cap["files"] == [f"rank{r}.json.gz" for r in range(world)]
    assert cap["world_size"] == cap["layout"]["world_size"] == world
    for rank in range(world):
        assert _trace(folder, rank)["distributedInfo"]["rank"] == rank
        assert _trace(folder, rank)["distributedInfo"]["world_size"] == world
        assert [s["name"] for s in _steps(_main_thread(_trace(folder, rank)))] == [
            f"ProfilerStep#{n}" for n in PROFILED_STEPS
        ]


# --------------------------------------------------------------------------------------
# the layout arithmetic and the options (no torch)
# --------------------------------------------------------------------------------------
def test_megatron_rank_order_tp_dp_pp():
    cfg = CaptureConfig(ranks=2, tensor_parallel=2, data_parallel=2).validate()
    assert cfg.world_size == 8
    assert [cfg.coords(r) for r in range(8)] == [
        (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)
    ]  # fmt: skip
    by_role: dict[str, list[list[int]]] = {}
    for group in cfg.process_groups():
        by_role.setdefault(group["role"], []).append(group["ranks"])
    assert by_role["TP"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert by_role["DP"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert by_role["PP"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    descs = {g["role"]: g["desc"] for g in cfg.process_groups()}
    assert descs == {
        "TP": "TENSOR_MODEL_PARALLEL_GROUP",
        "DP": "DATA_PARALLEL_GROUP",
        "PP": "PIPELINE_MODEL_PARALLEL_GROUP",
    }


def test_command_line_names_the_new_options():
    cfg = CaptureConfig(ranks=2, data_parallel=2, slow_replica=1, slow_factor=1.1, recompute=True).validate()
    line = cfg.command_line("out")
    assert "--data-parallel 2" in line and "--slow-replica 1 --slow-factor 1.1" in line and "--recompute" in line


@pytest.mark.parametrize(
    "args, words",
    [
        (["--tensor-parallel", "0"], "must be at least 1"),
        (["-p", "4", "--tensor-parallel", "4", "--data-parallel", "8"], "too many for one machine"),
        (["--data-parallel", "2", "--slow-replica", "2"], "is not a replica"),
        (["--data-parallel", "2", "--slow-replica", "1", "--slow-stage", "1"], "share --slow-factor"),
        (["--tensor-parallel", "2", "--layers", "12"], "even number of layers per stage"),
        (["--tensor-parallel", "2", "--framework", "megatron"], "run torch.distributed.pipelining"),
        (["--recompute", "--schedule", "ZBVZeroBubble"], "need a schedule with a full backward"),
        (["--data-parallel", "2", "--profiler", "nsys"], "drop --profiler nsys"),
    ],
)
def test_bad_3d_options_are_one_line_errors(tmp_path, args, words):
    result = CliRunner().invoke(main, ["capture", "-o", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), result.output
    assert words in lines[0]
    assert not (tmp_path / "x").exists()


def test_help_says_p_is_pipeline_stages():
    text = " ".join(CliRunner().invoke(main, ["capture", "--help"]).output.split())
    assert "Pipeline stages (ranks per pipeline). The processes started are p x --tensor-parallel x" in text


# --------------------------------------------------------------------------------------
# tp2_pp2: 2 stages x TP 2
# --------------------------------------------------------------------------------------
TP = "tp2_pp2"


def test_tp2_pp2_files_and_layout():
    _check_files(TP, 4)
    cap = _capture(TP)
    layout = cap["layout"]
    assert (layout["tp"], layout["dp"], layout["pp"], layout["order"]) == (2, 1, 2, "tp-dp-pp")
    assert cap["p"] == 2 and cap["stage_to_rank"] == [0, 2]
    assert {(g["role"], tuple(g["ranks"])) for g in layout["groups"] if len(g["ranks"]) > 1} == {
        ("TP", (0, 1)),
        ("TP", (2, 3)),
        ("PP", (0, 2)),
        ("PP", (1, 3)),
    }
    assert "--tensor-parallel 2" in cap["command"] and " -p 2 " in cap["command"]


@pytest.mark.parametrize("rank", range(4))
def test_tp2_pp2_pg_config_has_megatrons_groups(rank):
    trace = _trace(TP, rank)
    groups = _groups_by_desc(trace)
    assert groups["TENSOR_MODEL_PARALLEL_GROUP"] == [rank - rank % 2, rank - rank % 2 + 1]
    assert groups["PIPELINE_MODEL_PARALLEL_GROUP"] == [rank % 2, rank % 2 + 2]  # the same TP rank
    assert groups["DATA_PARALLEL_GROUP"] == [rank]
    # torch 2.13's gloo backend records no record_param_comms (NCCL does): the group of a
    # collective is known from pg_config and the layout, not from its own event
    assert not any(e.get("name") == "record_param_comms" for e in trace["traceEvents"])


@pytest.mark.parametrize("rank", range(4))
def test_tp2_pp2_all_reduces_sit_inside_forward_and_backward(rank):
    """Every TP all-reduce on the main thread is inside Megatron's _ReduceFromModelParallelRegion
    (forward) or the autograd engine's _CopyToModelParallelRegionBackward (backward): 4 layer
    pairs x 8 microbatches each way per step, except stage 0's first pair, whose input needs
    no grad (no backward all-reduce)."""
    events = _main_thread(_trace(TP, rank))
    regions = [
        e for e in events if e["name"] in ("_ReduceFromModelParallelRegion", "_CopyToModelParallelRegionBackward")
    ]
    stage = rank // 2
    for step in _steps(events):
        in_step = [e for e in events if e["name"] == "c10d::allreduce_" and _inside(e, step)]
        kinds = [set(_enclosing(e, regions)) for e in in_step]
        forward = sum(k == {"_ReduceFromModelParallelRegion"} for k in kinds)
        backward = sum(k == {"_CopyToModelParallelRegionBackward"} for k in kinds)
        assert (forward, backward) == (32, 24 if stage == 0 else 32), step["name"]
        assert forward + backward == len(in_step)
        measured = _measured(TP, rank)[int(step["name"].split("#")[1])]
        assert measured["calls"] == {"tp_all_reduce_backward": backward, "tp_all_reduce_forward": forward}


@pytest.mark.parametrize("rank", range(4))
def test_tp2_pp2_measured_all_reduce_time_matches_the_regions(rank):
    """capture.json's wall time in the TP all-reduces (perf_counter_ns around each call) is the
    time inside the Functions that hold them, less their clone: within 10% per step."""
    events = _main_thread(_trace(TP, rank))
    for step in _steps(events):
        measured = _measured(TP, rank)[int(step["name"].split("#")[1])]["ns"]
        fwd_us = sum(e["dur"] for e in events if e["name"] == "_ReduceFromModelParallelRegion" and _inside(e, step))
        bwd_us = sum(
            e["dur"]
            for e in events
            if e["name"] == "autograd::engine::evaluate_function: _CopyToModelParallelRegionBackward"
            and _inside(e, step)
        )
        assert measured["tp_all_reduce_forward"] / 1e3 == pytest.approx(fwd_us, rel=0.10)
        assert measured["tp_all_reduce_backward"] / 1e3 == pytest.approx(bwd_us, rel=0.10)
        assert measured["tp_all_reduce_forward"] <= fwd_us * 1e3


@pytest.mark.parametrize("rank", range(4))
def test_tp2_pp2_p2p_stays_within_the_pp_group(rank):
    """8 sends and 8 receives a step between the two stages of one TP rank; the peer in
    Concrete Inputs is the PP group's rank (0 or 1), not the global one."""
    events = _main_thread(_trace(TP, rank))
    stage = rank // 2
    peer_group_rank = str(1 - stage)
    for step in _steps(events):
        sends = [e for e in events if e["name"] == "c10d::send" and _inside(e, step)]
        recvs = [e for e in events if e["name"] == "c10d::recv_" and _inside(e, step)]
        assert len(sends) == len(recvs) == 8
        assert {e["args"]["Concrete Inputs"][2] for e in sends + recvs} == {peer_group_rank}


# --------------------------------------------------------------------------------------
# dp2_pp2: 2 stages x 2 replicas, replica 1 on a 10% slower "host"
# --------------------------------------------------------------------------------------
DP = "dp2_pp2"
LAYER_GRAD_NUMEL = [[256 * 256 + 256]]  # one bucket: a layer's weight and bias, flat
EMU_BACKWARD = "TracekitEmuComputeBackward"


def _dp_all_reduces(events: list[dict], step: dict) -> list[dict]:
    return [
        e
        for e in events
        if e["name"] == "c10d::allreduce_" and _inside(e, step) and e["args"]["Input Dims"][0] == LAYER_GRAD_NUMEL
    ]


def test_dp2_pp2_files_and_layout():
    _check_files(DP, 4)
    cap = _capture(DP)
    layout = cap["layout"]
    assert (layout["tp"], layout["dp"], layout["pp"], layout["slow_replica"]) == (1, 2, 2, 1)
    assert layout["slow_replica_factor"] == pytest.approx(1.1)
    assert cap["stage_to_rank"] == [0, 2]
    assert {(g["role"], tuple(g["ranks"])) for g in layout["groups"] if len(g["ranks"]) > 1} == {
        ("DP", (0, 1)),
        ("DP", (2, 3)),
        ("PP", (0, 2)),
        ("PP", (1, 3)),
    }
    assert [layout["ranks"][str(r)]["dp_rank"] for r in range(4)] == [0, 1, 0, 1]
    words = cap["command"].split()
    for flag, value in (("--data-parallel", "2"), ("--slow-replica", "1"), ("--slow-factor", "1.1"), ("-p", "2")):
        assert words[words.index(flag) + 1] == value


@pytest.mark.parametrize("rank", range(4))
def test_dp2_pp2_pg_config_has_megatrons_groups(rank):
    groups = _groups_by_desc(_trace(DP, rank))
    assert groups["DATA_PARALLEL_GROUP"] == [rank - rank % 2, rank - rank % 2 + 1]
    assert groups["PIPELINE_MODEL_PARALLEL_GROUP"] == [rank % 2, rank % 2 + 2]  # one replica's stages
    assert groups["TENSOR_MODEL_PARALLEL_GROUP"] == [rank]


@pytest.mark.parametrize("rank", range(4))
def test_dp2_pp2_gradient_all_reduce_overlaps_the_last_backward(rank):
    """8 bucket all-reduces a step (one per layer), each posted from AccumulateGrad inside the
    last microbatch's backward (after 7 microbatches x 8 layers of input-grad sleeps), the
    transfers on gloo's threads all done before Optimizer.step, which waits for them."""
    trace = _trace(DP, rank)
    events = _main_thread(trace)
    everything = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    for step in _steps(events):
        posts = _dp_all_reduces(events, step)
        assert len(posts) == 8
        for post in posts:
            assert "torch::autograd::AccumulateGrad" in _enclosing(post, events)
        backwards = sorted((e for e in events if e["name"] == EMU_BACKWARD and _inside(e, step)), key=lambda e: e["ts"])
        assert len(backwards) == 64
        before_first = sum(e["ts"] < posts[0]["ts"] for e in backwards)
        assert before_first >= 7 * 8 + 1
        optimizer = next(e for e in events if e["name"].startswith("Optimizer.step") and _inside(e, step))
        transfers = [e for e in everything if e["name"] == "gloo:all_reduce" and _inside(e, step)]
        assert len(transfers) == 8 and all(e["tid"] != e["pid"] for e in transfers)
        assert max(e["ts"] + e["dur"] for e in transfers) <= optimizer["ts"]
        assert all(e["ts"] < optimizer["ts"] for e in posts)
        measured = _measured(DP, rank)[int(step["name"].split("#")[1])]
        assert measured["calls"] == {"dp_all_reduce_launch": 8, "dp_all_reduce_wait": 8}


@pytest.mark.parametrize("rank", range(4))
def test_dp2_pp2_measured_reduction_span_matches_the_trace(rank):
    """capture.json's buckets (perf_counter: first launch to last wait's end) span what the
    trace shows from the first post to Optimizer.step, within 1 ms (the main thread averages
    the gradients in between); the last transfer on gloo's threads ends inside that span."""
    trace = _trace(DP, rank)
    events = _main_thread(trace)
    everything = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    buckets = _capture(DP)["layout"]["measured"][str(rank)]["dp_buckets"]
    for step in _steps(events):
        n = int(step["name"].split("#")[1])
        mine = [b for b in buckets if b["step"] == n]
        assert sorted(b["bucket"] for b in mine) == list(range(8))
        measured_ms = (max(b["wait_end_ns"] for b in mine) - min(b["launch_ns"] for b in mine)) / 1e6
        posts = _dp_all_reduces(events, step)
        optimizer = next(e for e in events if e["name"].startswith("Optimizer.step") and _inside(e, step))
        traced_ms = (optimizer["ts"] - posts[0]["ts"]) / 1e3
        assert measured_ms == pytest.approx(traced_ms, abs=1.0)
        transfers = [e for e in everything if e["name"] == "gloo:all_reduce" and _inside(e, step)]
        assert (max(e["ts"] + e["dur"] for e in transfers) - posts[0]["ts"]) / 1e3 <= measured_ms


def test_dp2_pp2_slow_replica_is_slower_and_the_fast_one_waits():
    """Replica 1's emulated sleeps are x1.1: its compute ops take longer on both stages, and
    replica 0 waits at the gradient all-reduce for it (capture.json's wait time)."""
    for stage in (0, 1):
        fast, slow = 2 * stage, 2 * stage + 1
        compute = {
            r: sum(e["dur"] for e in _main_thread(_trace(DP, r)) if e["name"].startswith("TracekitEmu"))
            for r in (fast, slow)
        }
        assert 1.04 < compute[slow] / compute[fast] < 1.25
        for n in PROFILED_STEPS:
            waits = {r: _measured(DP, r)[n]["ns"]["dp_all_reduce_wait"] for r in (fast, slow)}
            assert waits[fast] > 3 * waits[slow]


# --------------------------------------------------------------------------------------
# pp4_recompute: 1F1B on 4 stages, each stage's layers under torch.utils.checkpoint
# --------------------------------------------------------------------------------------
RC = "pp4_recompute"
FORWARD_OPS = ("aten::linear", "TracekitEmuCompute", "aten::relu", "TracekitEmuWeightGrad")


def _recompute_hosts(events: list[dict], step: dict) -> list[dict]:
    """The outermost backward ops holding re-run forward ops (the recomputation)."""
    backward = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function") and _inside(e, step)]
    emu = [e for e in events if e["name"] == "TracekitEmuCompute" and _inside(e, step)]
    hosts = [b for b in backward if any(_inside(e, b) for e in emu)]
    return [h for h in hosts if not any(h is not o and _inside(h, o) for o in hosts)]


def test_pp4_recompute_files_and_layout():
    _check_files(RC, 4)
    cap = _capture(RC)
    layout = cap["layout"]
    assert (layout["tp"], layout["dp"], layout["pp"], layout["groups"]) == (1, 1, 4, [])
    assert "use_reentrant=False" in layout["recompute_how"]
    assert cap["stage_to_rank"] == [0, 1, 2, 3] and cap["command"].endswith(" --recompute")
    assert _trace(RC, 0)["distributedInfo"]["pg_count"] == 1  # the default group only


@pytest.mark.parametrize("rank", range(4))
def test_pp4_recompute_backward_reruns_the_forward(rank):
    """Every microbatch's backward starts by re-running its stage's forward: the forward ops
    (matmuls, emulated forward sleeps) inside the first backward op. 4 layers x 8 microbatches
    run twice a step, except the last stage's last layer: its output is saved by nothing, so
    checkpoint's early stop leaves its forward sleep out of the re-run (3 x 8)."""
    events = _main_thread(_trace(RC, rank))
    for step in _steps(events):
        hosts = _recompute_hosts(events, step)
        assert len(hosts) == 8  # one per microbatch
        first_backward = "AddmmBackward0" if rank == 3 else "ReluBackward0"
        assert {h["name"] for h in hosts} == {f"autograd::engine::evaluate_function: {first_backward}"}
        emu = [e for e in events if e["name"] == "TracekitEmuCompute" and _inside(e, step)]
        rerun = [e for e in emu if any(_inside(e, h) for h in hosts)]
        assert (len(emu), len(rerun)) == ((56, 24) if rank == 3 else (64, 32))


@pytest.mark.parametrize("rank", range(4))
def test_pp4_recompute_measured_time_matches_the_rerun_ops(rank):
    """capture.json's recompute wall time is the span of the re-run forward ops inside their
    backward op (within 5% per step) and no longer than those backward ops."""
    events = _main_thread(_trace(RC, rank))
    forward = [e for e in events if e["name"] in FORWARD_OPS]
    for step in _steps(events):
        hosts = _recompute_hosts(events, step)
        span_us = 0.0
        for host in hosts:
            inner = [e for e in forward if _inside(e, host)]
            span_us += max(e["ts"] + e["dur"] for e in inner) - min(e["ts"] for e in inner)
        measured = _measured(RC, rank)[int(step["name"].split("#")[1])]
        assert measured["calls"] == {"recompute": 8}
        assert measured["ns"]["recompute"] / 1e3 == pytest.approx(span_us, rel=0.05)
        assert measured["ns"]["recompute"] / 1e3 <= sum(h["dur"] for h in hosts)
