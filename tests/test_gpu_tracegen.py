"""The GENERATED GPU pipeline traces of tests/gpu_tracegen.py are what their truth says.

The written files are read back with plain gzip/json (never tracekit) and busy, idle and the
P2P kernel pairs are recomputed from the raw events; tracekit's parser must read them cleanly.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import shared_or_skip
from gpu_tracegen import (
    FUSED_SCENARIOS,
    LAUNCH_LATENCY_NS,
    ORIGIN_NS,
    PLAIN_SCENARIOS,
    RCCL_KERNEL,
    ROCM_FUSED_SCENARIOS,
    ROCM_PLAIN_SCENARIOS,
    SCENARIOS,
    Scenario,
    generate,
    truth_path,
)

MI250 = ("kineto-gpu", "hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz")


def _ns(us: float) -> int:
    return round(us * 1000)


class RawRank:
    """One rank file's events, times in ns on the reference clock (the rank's offset removed);
    ``comm_kernel``: the name of its NCCL or RCCL kernels."""

    def __init__(self, path: Path, offset_ns: int, comm_kernel: str):
        self.doc = json.loads(gzip.decompress(path.read_bytes()))
        self.comm_kernel = comm_kernel
        self.rank = self.doc["distributedInfo"]["rank"]
        self.events = self.doc["traceEvents"]
        xs = [e for e in self.events if e["ph"] == "X"]
        for e in xs:
            e["start"] = _ns(e["ts"]) - ORIGIN_NS - offset_ns
            e["end"] = e["start"] + _ns(e["dur"])
        launches = {e["args"]["correlation"]: e for e in xs if e["cat"] == "cuda_runtime"}
        self.steps = {int(e["name"].split("#")[1]): e for e in xs if e["name"].startswith("ProfilerStep#")}
        optim = [e for e in xs if e["cat"] == "user_annotation" and e["name"].startswith("Optimizer.step")]
        self.kernels = []
        for k in (e for e in xs if e["cat"] == "kernel"):
            launch = launches[k["args"]["correlation"]]
            k["launch"] = launch
            k["step"] = next(n for n, s in self.steps.items() if s["start"] <= launch["start"] < s["end"])
            k["optimizer"] = any(o["start"] <= launch["start"] < o["end"] for o in optim)
            self.kernels.append(k)

    def compute(self, step: int, with_optimizer: bool = True) -> list[dict]:
        return [
            k
            for k in self.kernels
            if k["step"] == step and k["name"] != self.comm_kernel and (with_optimizer or not k["optimizer"])
        ]


def _read(folder: Path, sc: Scenario) -> list[RawRank]:
    return [
        RawRank(folder / f"rank{r}.json.gz", sc.clock_offset_ns.get(r, 0), sc.platform.comm_kernel) for r in range(sc.p)
    ]


def _union_in(spans, lo: int, hi: int) -> int:
    total, reach = 0, lo
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_tracegen")
    made = {}

    def get(name: str):
        if name not in made:
            folder, truth = generate(SCENARIOS[name], out)
            made[name] = (folder, truth, _read(folder, SCENARIOS[name]))
        return made[name]

    return get


@pytest.mark.parametrize("name", PLAIN_SCENARIOS + FUSED_SCENARIOS + ROCM_PLAIN_SCENARIOS + ROCM_FUSED_SCENARIOS)
def test_busy_and_idle_from_the_raw_kernels_equal_the_truth(generated, name):
    folder, truth, ranks = generated(name)
    expected = {(row["rank"], row["step"]): row for row in truth["per_step"]}
    for step in truth["steps"]:
        actions = [k for raw in ranks for k in raw.compute(step, with_optimizer=False)]
        lo, hi = min(k["start"] for k in actions), max(k["end"] for k in actions)
        for raw in ranks:
            busy = _union_in([(k["start"], k["end"]) for k in raw.compute(step)], lo, hi)
            row = expected[(raw.rank, step)]
            assert (hi - lo, busy, hi - lo - busy) == (row["window_ns"], row["busy_ns"], row["idle_ns"]), (
                f"{name} rank {raw.rank} step {step}"
            )
    for row in truth["ranks"]:
        assert row["bubble_ratio"] == pytest.approx(row["idle_ns"] / row["window_ns"])


@pytest.mark.parametrize("name", PLAIN_SCENARIOS + ROCM_PLAIN_SCENARIOS)
def test_p2p_kernel_pairs_from_the_raw_kernels_equal_the_truth(generated, name):
    folder, truth, ranks = generated(name)
    sends, recvs = defaultdict(list), defaultdict(list)
    for raw in ranks:
        for k in raw.kernels:
            if k["name"] != raw.comm_kernel:
                continue
            args = k["args"]
            if args["Collective name"] == "send":
                sends[(raw.rank, args["Dst Rank"])].append(k)
            else:
                recvs[(args["Src Rank"], raw.rank)].append(k)
    # Each direction has its own stream, so the n-th send pairs with the n-th recv.
    expected = _assert_pairs_are_the_truth(name, sends, recvs, truth, by_start=True)
    assert len(expected) == sum(1 for raw in ranks for k in raw.kernels if k["name"] == raw.comm_kernel) // 2


def _fused_sides(raw: RawRank) -> list[tuple[str, int, dict]]:
    """Each host send/recv call of a rank and the fused kernel it went out in: ProcessGroupNCCL
    launches a batch's one kernel when the group ends, so a call's kernel is the first NCCL
    kernel its thread launched after the call began. (direction, peer, kernel) in call order."""
    calls = sorted(
        (e for e in raw.events if e["ph"] == "X" and e["name"] in ("c10d::send", "c10d::recv_")),
        key=lambda e: e["start"],
    )
    nccl = sorted((k for k in raw.kernels if k["name"] == raw.comm_kernel), key=lambda k: k["launch"]["start"])
    sides = []
    for call in calls:
        kernel = next(k for k in nccl if k["launch"]["start"] >= call["start"] and k["launch"]["tid"] == call["tid"])
        sides.append(
            ("send" if call["name"] == "c10d::send" else "recv", int(call["args"]["Concrete Inputs"][2]), kernel)
        )
    return sides


@pytest.mark.parametrize("name", FUSED_SCENARIOS + ROCM_FUSED_SCENARIOS)
def test_fused_kernels_from_the_raw_events_equal_the_truth(generated, name):
    folder, truth, ranks = generated(name)
    sends, recvs = defaultdict(list), defaultdict(list)
    fused = 0
    for raw in ranks:
        sides = _fused_sides(raw)
        per_kernel = defaultdict(list)
        for direction, peer, kernel in sides:
            per_kernel[id(kernel)].append((direction, peer))
            (sends[(raw.rank, peer)] if direction == "send" else recvs[(peer, raw.rank)]).append(kernel)
        # One kernel per group, each group with one peer, at most a send and a recv.
        for ops in per_kernel.values():
            assert len({peer for _, peer in ops}) == 1 and len(ops) == len({d for d, _ in ops}), ops
            fused += len(ops) == 2
        nccl = [k for k in raw.kernels if k["name"] == raw.comm_kernel]
        assert len(per_kernel) == len(nccl), f"rank {raw.rank}: a kernel no host call launched"
        assert len({k["tid"] for k in nccl}) == 1, "batch P2P runs on the process group's one NCCL stream"
        titles = {e["name"] for e in raw.events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")}
        assert titles == {"nccl:coalesced"}
    assert fused > 0, f"{name}: no kernel fused a send and a recv"
    # NCCL matches a peer's sends and recvs in call order
    _assert_pairs_are_the_truth(name, sends, recvs, truth, by_start=False)


def test_a_fused_kernel_lasts_as_long_as_its_slower_direction(generated):
    _, truth, _ = generated("fused_slow_link")
    slow = {(p["src_rank"], p["dst_rank"]) for p in truth["p2p_pairs"] if p["transfer_ns"] > 100_000}
    # gradients 2->1 that share a kernel with activations 1->2 take the slow link's time too
    assert slow == {(1, 2), (2, 1)}
    reverse = [p for p in truth["p2p_pairs"] if (p["src_rank"], p["dst_rank"]) == (2, 1)]
    assert any(p["transfer_ns"] == SCENARIOS["fused_slow_link"].transfer_ns for p in reverse), (
        "the gradients sent alone (cooldown) move at the normal speed"
    )


def test_the_slow_link_is_the_one_whose_pairs_transfer_long(generated):
    _, truth, _ = generated("slow_link")
    slow = {(p["src_rank"], p["dst_rank"]) for p in truth["p2p_pairs"] if p["transfer_ns"] > 100_000}
    assert slow == {(1, 2)}


def test_host_runs_ahead_of_the_device_by_a_step(generated):
    _, truth, ranks = generated("host_ahead")
    later_steps = truth["steps"][1:]
    for step in later_steps:
        actions = [k for raw in ranks for k in raw.compute(step, with_optimizer=False)]
        window_ns = max(k["end"] for k in actions) - min(k["start"] for k in actions)
        for raw in ranks:
            host_end = raw.steps[step]["end"]
            mine = [k for k in raw.kernels if k["step"] == step]
            assert max(k["end"] for k in mine) - host_end >= window_ns, f"rank {raw.rank} step {step}"
            assert min(k["start"] for k in mine) > host_end, (
                f"rank {raw.rank}: a kernel of step {step} ran before ProfilerStep#{step} ended"
            )


def test_with_a_host_sync_the_device_does_not_outlive_the_host_step(generated):
    _, truth, ranks = generated("slow_stage")
    for raw in ranks:
        for step in truth["steps"]:
            assert max(k["end"] for k in raw.kernels if k["step"] == step) <= raw.steps[step]["end"]


def test_the_launch_bound_rank_alone_waits_for_its_host(generated):
    _, truth, ranks = generated("launch_bound")
    waits = {row["rank"]: row["host_wait_ns"] for row in truth["ranks"]}
    assert waits[1] > 0.2 * truth["ranks"][1]["window_ns"]
    assert [waits[r] for r in (0, 2, 3)] == [0, 0, 0]
    # On the raw events: rank 1's compute kernels start right at their launch's end.
    stream = sorted(ranks[1].compute(truth["steps"][-1]), key=lambda k: k["start"])
    at_launch = [k for k in stream if k["start"] == k["launch"]["end"] + LAUNCH_LATENCY_NS]
    assert len(at_launch) > 0.6 * len(stream)


def test_injected_causes_move_the_truth_the_way_they_should(generated):
    _, slow, _ = generated("slow_stage")
    bubbles = [row["bubble_ratio"] for row in slow["ranks"]]
    assert bubbles[2] < min(bubbles[r] for r in (0, 1, 3)) - 0.2  # the slow stage is the busy one
    assert slow["injected"] == {"cause": "imbalance", "stage": 2}
    _, plain, _ = generated("unlabelled_1f1b")
    theory = (4 - 1) / (8 + 4 - 1)  # 1F1B fill/drain for p=4, m=8
    assert all(theory <= row["bubble_ratio"] < theory + 0.05 for row in plain["ranks"])
    _, interleaved, _ = generated("interleaved")
    assert max(row["bubble_ratio"] for row in interleaved["ranks"]) < theory


@pytest.mark.parametrize("name", PLAIN_SCENARIOS + FUSED_SCENARIOS + ROCM_PLAIN_SCENARIOS + ROCM_FUSED_SCENARIOS)
def test_the_events_follow_the_real_gpu_trace_schema(generated, name):
    folder, _, ranks = generated(name)
    sc = SCENARIOS[name]
    for raw in ranks:
        doc = raw.doc
        assert "host_name" not in doc
        assert doc["distributedInfo"]["backend"] == "nccl" and doc["distributedInfo"]["world_size"] == sc.p
        assert {"schemaVersion", "deviceProperties", "baseTimeNanoseconds", "traceEvents"} <= set(doc)
        flows = defaultdict(dict)
        for e in raw.events:
            if e.get("cat") == "ac2g":
                flows[e["id"]][e["ph"]] = e
        main_tid = next(iter(raw.steps.values()))["tid"]
        assert main_tid == next(iter(raw.steps.values()))["pid"]
        for k in raw.kernels:
            assert k["pid"] == raw.rank and k["tid"] == k["args"]["stream"]
            assert k["args"]["External id"] == k["launch"]["args"]["External id"]
            assert flows[k["args"]["correlation"]]["f"]["tid"] == k["tid"]
            assert flows[k["args"]["correlation"]]["s"]["tid"] == k["launch"]["tid"]
        xs = [e for e in raw.events if e["ph"] == "X"]
        forward = {e["args"]["Sequence number"] for e in xs if e["name"] == "aten::linear"}
        backward = [e for e in xs if e["name"].startswith("autograd::engine::evaluate_function: AddmmBackward0")]
        assert backward and all(e["tid"] != main_tid for e in backward)
        assert {e["args"]["Sequence number"] for e in backward} == forward
        comms = [e for e in xs if e["name"] == "record_param_comms"]
        assert comms and all(
            ("Dst Rank" if e["args"]["Collective name"] == "send" else "Src Rank") in e["args"] for e in comms
        )
        labels = [e for e in xs if e["name"].startswith("PP:")]
        assert bool(labels) == sc.labelled


@pytest.mark.parametrize("name", PLAIN_SCENARIOS + FUSED_SCENARIOS + ROCM_PLAIN_SCENARIOS + ROCM_FUSED_SCENARIOS)
def test_tracekit_reads_every_generated_file_without_warnings(generated, name):
    from tracekit.ingest import read_run

    folder, _, _ = generated(name)
    run = read_run(folder)
    assert sorted(f.rank for f in run.files) == list(range(SCENARIOS[name].p))
    assert [w for f in run.files for w in f.warnings] == []
    assert run.warnings == ()


def test_the_same_scenario_writes_the_same_bytes(tmp_path):
    sc = Scenario("twice", p=2, m=2)
    first, _ = generate(sc, tmp_path / "a")
    second, _ = generate(sc, tmp_path / "b")
    assert (first / "rank1.json.gz").read_bytes() == (second / "rank1.json.gz").read_bytes()
    assert json.loads(truth_path(first).read_text()) == json.loads(truth_path(second).read_text())


def _assert_pairs_are_the_truth(name: str, sends: dict, recvs: dict, truth: dict, by_start: bool) -> list:
    """The n-th send kernel of each link (src, dst) with the n-th recv kernel of it (in start
    order, or in the order given): both end together, and their wait and transfer, worked out
    here from the raw kernels, are the truth's pairs (returned)."""
    found = []
    for link, sent in sends.items():
        got = recvs[link]
        assert len(sent) == len(got), f"{name}: link {link} has {len(sent)} sends, {len(got)} recvs"
        if by_start:
            sent, got = sorted(sent, key=lambda k: k["start"]), sorted(got, key=lambda k: k["start"])
        for send, recv in zip(sent, got):
            assert send["end"] == recv["end"], "paired SendRecv kernels end together"
            later = max(send["start"], recv["start"])
            found.append(
                (
                    link[0],
                    link[1],
                    send["step"],
                    send["start"],
                    recv["start"],
                    later - min(send["start"], recv["start"]),
                    send["end"] - later,
                )
            )
    expected = [
        (
            p["src_rank"],
            p["dst_rank"],
            p["step"],
            p["send_start_ns"],
            p["recv_start_ns"],
            p["wait_ns"],
            p["transfer_ns"],
        )
        for p in truth["p2p_pairs"]
    ]
    assert sorted(found) == sorted(expected)
    return expected


def test_rocm_files_name_things_as_the_real_mi250_trace_does(generated):
    """The ROCm scenarios write what the real MI250 trace (ROCm 6.2, Kineto's roctracer path)
    shows: HIP calls under ``cuda_runtime`` with roctracer's ``cid`` (the same ids for the calls
    both hold) and a launch's args, kernels with roctracer's own args (plus, for RCCL's, the comm
    metadata Kineto copies from record_param_comms), the MI250's deviceProperties keys. RCCL's
    kernel is launched by hipExtLaunchKernel, Tensile's GEMM by hipExtModuleLaunchKernel, the
    rest by hipLaunchKernel."""
    real = json.loads(gzip.decompress(shared_or_skip(*MI250).read_bytes()))
    real_calls = {e["name"]: e["args"] for e in real["traceEvents"] if e.get("cat") == "cuda_runtime"}
    real_kernel_args = {k for e in real["traceEvents"] if e.get("cat") == "kernel" for k in e["args"]}
    _, _, ranks = generated("rocm_1f1b")
    for raw in ranks:
        calls = [e for e in raw.events if e.get("cat") == "cuda_runtime"]
        assert calls and all(e["name"].startswith("hip") and "cbid" not in e["args"] for e in calls)
        for e in calls:
            if e["name"] in real_calls:
                assert e["args"]["cid"] == real_calls[e["name"]]["cid"], e["name"]
                assert set(e["args"]) == set(real_calls[e["name"]]), e["name"]
        launchers = defaultdict(set)
        for k in raw.kernels:
            launch = k["launch"]
            assert launch["args"]["kernel"] == k["name"] and set(launch["args"]) == set(real_calls["hipLaunchKernel"])
            launchers[launch["name"]].add("rccl" if k["name"] == RCCL_KERNEL else k["name"][:4])
            assert k["args"]["kind"] == "Dispatch Kernel"
            if k["name"] == RCCL_KERNEL:
                assert real_kernel_args <= set(k["args"]) and k["args"]["Collective name"] in ("send", "recv")
            else:
                assert set(k["args"]) == real_kernel_args, k["args"]
        assert launchers["hipExtLaunchKernel"] == {"rccl"} and launchers["hipExtModuleLaunchKernel"] == {"Cijk"}
        assert "rccl" not in launchers["hipLaunchKernel"] and "Cijk" not in launchers["hipLaunchKernel"]
        assert set(raw.doc["deviceProperties"][0]) == set(real["deviceProperties"][0])
