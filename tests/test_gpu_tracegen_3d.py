"""The GENERATED 3-D parallel jobs of tests/gpu_tracegen.py (SCENARIOS_3D: TP, DP, both,
recomputation, no process-group metadata) are what their truth says.

The files are read back with plain gzip/json (never tracekit): these tests check the generator,
not tracekit's reading of its files.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from gpu_tracegen import (
    DP_ALLREDUCE_KERNEL,
    ORIGIN_NS,
    SCENARIOS_3D,
    TP_OVERLAP_SCENARIO,
    TP_ALLREDUCE_KERNEL,
    _union_in,
    generate,
)


def _ns(us: float) -> int:
    return round(us * 1000)


class GeneratedRank:
    """One generated rank file: its document, and its X events with times in ns on the
    simulation's clock (ts - ORIGIN_NS)."""

    def __init__(self, path: Path):
        self.doc = json.loads(gzip.decompress(path.read_bytes()))
        self.rank = self.doc["distributedInfo"]["rank"]
        self.events = []
        for ev in self.doc["traceEvents"]:
            if ev.get("ph") == "X":
                start = _ns(ev["ts"]) - ORIGIN_NS
                self.events.append({**ev, "start": start, "end": start + _ns(ev["dur"])})

    def kernels(self, name: str | None = None) -> list[dict]:
        return sorted(
            (e for e in self.events if e["cat"] == "kernel" and (name is None or e["name"] == name)),
            key=lambda e: e["start"],
        )

    def named(self, name: str) -> list[dict]:
        return [e for e in self.events if e["name"] == name]


@pytest.fixture(scope="module")
def generated_3d(tmp_path_factory):
    """name -> (files by rank, truth) of each SCENARIOS_3D run, generated once."""
    out = tmp_path_factory.mktemp("generated_3d")
    runs = {}
    for name, sc in SCENARIOS_3D.items():
        folder, truth = generate(sc, out)
        ranks = {r.rank: r for r in map(GeneratedRank, sorted(folder.glob("rank*.json.gz")))}
        runs[name] = (ranks, truth)
    return runs


def _rows(truth: dict) -> dict[int, dict]:
    return {row["rank"]: row for row in truth["ranks"]}


@pytest.mark.parametrize(("name", "world"), [("tp2_pp4", 8), ("dp2_pp4", 8), ("tp2_dp2_pp4", 16)])
def test_generated_rank_counts_and_file_names(generated_3d, name, world):
    ranks, truth = generated_3d[name]
    assert sorted(ranks) == list(range(world))
    assert truth["layout"]["world_size"] == world == len(truth["ranks"])
    for r, raw in ranks.items():
        assert raw.doc["distributedInfo"]["world_size"] == world
        assert raw.doc["traceName"].endswith(f"generated_{name}/rank{r}.json")
        assert len(raw.doc["deviceProperties"]) == world


@pytest.mark.parametrize("name", ["tp2_pp4", "dp2_pp4", "tp2_dp2_pp4"])
def test_generated_pg_config_follows_megatrons_order(generated_3d, name):
    """global rank = tp_rank + tp * dp_rank + tp * dp * pp_rank; each group's ranks as that says."""
    ranks, truth = generated_3d[name]
    dims = truth["layout"]["dims"]
    tp, dp, pp = dims["tp"], dims["dp"], dims["pp"]

    def rank(t, d, s):
        return t + tp * d + tp * dp * s

    expected = {
        "TENSOR_MODEL_PARALLEL_GROUP": {tuple(rank(t, d, s) for t in range(tp)) for d in range(dp) for s in range(pp)},
        "DATA_PARALLEL_GROUP": {tuple(rank(t, d, s) for d in range(dp)) for t in range(tp) for s in range(pp)},
        "PIPELINE_MODEL_PARALLEL_GROUP": {
            tuple(rank(t, d, s) for s in range(pp)) for t in range(tp) for d in range(dp)
        },
    }
    by_name: dict[str, tuple] = {}
    seen = defaultdict(set)
    for r, raw in ranks.items():
        info = raw.doc["distributedInfo"]
        assert info["pg_count"] == len(truth["layout"]["process_groups"])
        for group in info["pg_config"]:
            assert r in group["ranks"] and group["pg_size"] == len(group["ranks"])
            # a name is the job's: every member lists the same group under it
            assert by_name.setdefault(group["pg_name"], (group["pg_desc"], group["ranks"])) == (
                group["pg_desc"],
                group["ranks"],
            )
            seen[group["pg_desc"]].add(tuple(group["ranks"]))
        descs = [g["pg_desc"] for g in info["pg_config"]]
        assert descs[0] == "default_pg" and len(descs) == len(set(descs))
    for desc, groups in expected.items():
        assert seen[desc] == groups
    roles = truth["layout"]["groups"]
    assert {tuple(g) for g in roles["tp"]} == expected["TENSOR_MODEL_PARALLEL_GROUP"]
    assert {tuple(g) for g in roles["dp"]} == expected["DATA_PARALLEL_GROUP"]
    assert {tuple(g) for g in roles["pp"]} == expected["PIPELINE_MODEL_PARALLEL_GROUP"]


@pytest.mark.parametrize("name", ["tp2_pp4", "tp2_dp2_pp4"])
def test_generated_tp_and_p2p_traffic_names_its_groups(generated_3d, name):
    ranks, truth = generated_3d[name]
    groups = truth["layout"]["groups"]
    for r, raw in ranks.items():
        tp_group = next(g for g in groups["tp"] if r in g)
        dp_group = next(g for g in groups["dp"] if r in g)
        pp_group = next(g for g in groups["pp"] if r in g)
        comms = raw.named("record_param_comms")
        allreduce = [e for e in comms if e["args"]["Collective name"] == "allreduce"]
        p2p = [e for e in comms if e["args"]["Collective name"] in ("send", "recv")]
        assert allreduce and p2p
        for e in allreduce:
            group = {"TENSOR_MODEL_PARALLEL_GROUP": tp_group, "DATA_PARALLEL_GROUP": dp_group}[
                e["args"]["Process Group Description"]
            ]
            assert json.loads(e["args"]["Process Group Ranks"]) == group
            assert e["args"]["Rank"] == group.index(r)
        for e in p2p:
            assert e["args"]["Process Group Description"] == "PIPELINE_MODEL_PARALLEL_GROUP"
            assert json.loads(e["args"]["Process Group Ranks"]) == pp_group
            peer = e["args"].get("Dst Rank", e["args"].get("Src Rank"))
            assert abs(pp_group[peer] - r) == len(ranks) // len(pp_group)  # the same tp/dp rank, next stage
        # host ops: c10d::allreduce_ > record_param_comms, nccl:all_reduce beside it
        assert len(raw.named("c10d::allreduce_")) == len(allreduce) == len(raw.named("nccl:all_reduce")) // 2


@pytest.mark.parametrize("name", ["tp2_pp4", "tp2_dp2_pp4"])
def test_generated_tp_kernel_time_from_the_files_equals_the_truth(generated_3d, name):
    ranks, truth = generated_3d[name]
    rows = _rows(truth)
    for r, raw in ranks.items():
        tp = raw.kernels(TP_ALLREDUCE_KERNEL)
        assert len(tp) == rows[r]["tp_allreduce_count"] > 0
        assert abs(sum(k["end"] - k["start"] for k in tp) - rows[r]["tp_allreduce_ns"]) <= 1
        assert {k["tid"] for k in tp} == {13}  # the TP group's NCCL stream, not the P2P streams


@pytest.mark.parametrize("name", ["tp2_pp4", "tp2_dp2_pp4"])
def test_generated_tp_peers_kernels_end_together(generated_3d, name):
    ranks, truth = generated_3d[name]
    for group in truth["layout"]["groups"]["tp"]:
        ends = [[k["end"] for k in ranks[r].kernels(TP_ALLREDUCE_KERNEL)] for r in group]
        assert all(e == ends[0] for e in ends)


def test_generated_tp_and_p2p_kernels_of_a_rank_overlap_in_time(tmp_path):
    """With --overlap-p2p-communication (interleaved) a receive posted for a later action waits
    on its stream while the current action's TP all-reduce runs (with batch_p2p_sync the host
    waits for both in turn; a send always waits for the all-reduce whose result it carries)."""
    folder, _ = generate(TP_OVERLAP_SCENARIO, tmp_path)
    ranks = {r.rank: r for r in map(GeneratedRank, sorted(folder.glob("rank*.json.gz")))}
    overlap = 0
    for raw in ranks.values():
        tp = [(k["start"], k["end"]) for k in raw.kernels(TP_ALLREDUCE_KERNEL)]
        p2p = [k for k in raw.kernels() if k["name"].startswith("ncclDevKernel_SendRecv")]
        for k in p2p:
            overlap += sum(max(0, min(e, k["end"]) - max(s, k["start"])) for s, e in tp)
    assert overlap > 0


def test_generated_contention_slows_the_transfers_a_tp_allreduce_overlaps(tmp_path):
    """CONTENDED_SCENARIO: the transfers that took the link's time x the factor are those a TP
    all-reduce kernel (from the files) of either end overlaps, but for the few the module doc
    says the simulation's order of resolving decides otherwise (5% of them at most); the
    truth's medians are those of the truth's transfers classed by the files' kernels."""
    from gpu_tracegen import CONTENDED_SCENARIO

    sc = CONTENDED_SCENARIO
    folder, truth = generate(sc, tmp_path)
    ranks = {r.rank: r for r in map(GeneratedRank, sorted(folder.glob("rank*.json.gz")))}
    tp = {r: [(k["start"], k["end"]) for k in raw.kernels(TP_ALLREDUCE_KERNEL)] for r, raw in ranks.items()}
    slow = round(sc.transfer_ns * sc.tp_p2p_contention)
    during, alone = [], []
    for pair in truth["p2p_pairs"]:
        # both SendRecv kernels end together; the later start begins the transfer
        end, begin = pair["recv_end_ns"], max(pair["send_start_ns"], pair["recv_start_ns"])
        assert end - begin == pair["transfer_ns"] == pair["message_transfer_ns"]
        assert pair["transfer_ns"] in (sc.transfer_ns, slow)
        hit = any(s < end and e > begin for r in (pair["src_rank"], pair["dst_rank"]) for s, e in tp[r])
        (during if hit else alone).append(pair["transfer_ns"])
    links = truth["shared_links"]
    assert (len(during), len(alone)) == (links["n_transfers_overlapped"], links["n_transfers_alone"])
    assert sorted(during)[len(during) // 2] == links["median_transfer_overlapped_ns"] == slow
    assert sorted(alone)[len(alone) // 2] == links["median_transfer_alone_ns"] == sc.transfer_ns
    off_rule = sum(t != slow for t in during) + sum(t == slow for t in alone)
    assert off_rule <= 0.05 * len(truth["p2p_pairs"])
    assert links["n_transfers_slowed"] == sum(t == slow for t in during + alone) > 100


def test_generated_contention_factor_one_is_the_plain_model(tmp_path):
    """tp_p2p_contention=1.0 (the default) leaves every transfer at its link's time."""
    from dataclasses import replace

    from gpu_tracegen import CONTENDED_SCENARIO

    _, truth = generate(replace(CONTENDED_SCENARIO, name="uncontended", tp_p2p_contention=1.0), tmp_path)
    assert {p["transfer_ns"] for p in truth["p2p_pairs"]} == {CONTENDED_SCENARIO.transfer_ns}
    assert truth["shared_links"]["n_transfers_slowed"] == 0


@pytest.mark.parametrize("name", list(SCENARIOS_3D))
def test_generated_busy_under_both_definitions_equals_the_truth(generated_3d, name):
    """Busy from the raw kernels in the truth's window: compute (+ optimizer), and with TP comm."""
    ranks, truth = generated_3d[name]
    comm = (TP_ALLREDUCE_KERNEL, DP_ALLREDUCE_KERNEL)
    for row in truth["per_step"]:
        raw = ranks[row["rank"]]
        lo, hi = row["window_start_ns"], row["window_end_ns"]
        kernels = raw.kernels()
        compute = [(k["start"], k["end"]) for k in kernels if k["tid"] == 7 and k["name"] not in comm]
        tp = [(k["start"], k["end"]) for k in kernels if k["name"] == TP_ALLREDUCE_KERNEL]
        assert _union_in(compute, lo, hi) == row["busy_ns"]
        assert _union_in(compute + tp, lo, hi) == row["busy_with_tp_ns"]
        assert row["bubble_ratio_with_tp"] <= row["bubble_ratio"]


@pytest.mark.parametrize("name", ["dp2_pp4", "tp2_dp2_pp4"])
def test_generated_grad_buckets_from_the_files_equal_the_truth(generated_3d, name):
    ranks, truth = generated_3d[name]
    rows = _rows(truth)
    steps = len(truth["steps"])
    for r, raw in ranks.items():
        dp = raw.kernels(DP_ALLREDUCE_KERNEL)
        row = rows[r]
        assert len(dp) == row["dp_grad_count"] == 2 * steps  # dp_buckets per stage, once a step
        assert abs(sum(k["end"] - k["start"] for k in dp) - row["dp_grad_ns"]) <= 1
        assert row["dp_grad_overlapped_ns"] + row["dp_grad_exposed_ns"] == row["dp_grad_ns"]
        assert row["step_end_ns"] >= row["dp_grad_exposed_ns"]
        # launched from the grad accumulator's hook on the autograd thread, then waited on
        hooks = raw.named("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
        assert len(hooks) == len(dp)
        launches = {e["args"]["correlation"]: e for e in raw.events if e["cat"] == "cuda_runtime"}
        optimizer = sorted(k["start"] for k in raw.kernels() if k["name"].startswith("void at::native::(anonymous"))
        for k in dp:
            launch = launches[k["args"]["correlation"]]
            assert any(h["start"] <= launch["start"] and launch["end"] <= h["end"] for h in hooks)
            assert any(start >= k["end"] for start in optimizer)
    # the first stage ends the pipeline: its last bucket is exposed at step end
    first_stage = [row for row in truth["ranks"] if row["pp_rank"] == 0]
    assert all(row["dp_grad_exposed_ns"] > 0 for row in first_stage)


@pytest.mark.parametrize("name", ["dp2_pp4", "tp2_dp2_pp4"])
def test_generated_slow_replica_is_slower_on_every_stage(generated_3d, name):
    ranks, truth = generated_3d[name]
    assert truth["slow_replica"] == 1
    rows = truth["ranks"]
    for stage in range(truth["layout"]["dims"]["pp"]):
        busy = {
            d: sum(r["action_busy_ns"] for r in rows if r["pp_rank"] == stage and r["dp_rank"] == d) for d in (0, 1)
        }
        assert 1.07 < busy[1] / busy[0] < 1.13


def test_generated_recompute_reruns_the_forward_inside_the_backward(generated_3d):
    ranks, truth = generated_3d["recompute_pp4"]
    sc = SCENARIOS_3D["recompute_pp4"]
    rows = _rows(truth)
    for r, raw in ranks.items():
        forwards = raw.named("CheckpointFunction")
        backwards = raw.named("autograd::engine::evaluate_function: CheckpointFunctionBackward")
        assert len(forwards) == len(backwards) == sc.m * sc.steps
        linears = raw.named("aten::linear")
        # the forward under no_grad: no sequence numbers; the re-run one has them
        inside_forward = [e for e in linears if any(f["start"] <= e["start"] < f["end"] for f in forwards)]
        inside_backward = [e for e in linears if any(b["start"] <= e["start"] < b["end"] for b in backwards)]
        assert len(inside_forward) == len(inside_backward) == len(linears) // 2
        assert all("Sequence number" not in e["args"] for e in inside_forward)
        assert all("Sequence number" in e["args"] for e in inside_backward)
        for b in backwards:  # first the forward's ops, then the backward's nodes
            nested = sorted(
                (e for e in raw.events if e["tid"] == b["tid"] and b["start"] < e["start"] and e["end"] < b["end"]),
                key=lambda e: e["start"],
            )
            names = [e["name"] for e in nested if e["cat"] == "cpu_op"]
            first_node = next(i for i, n in enumerate(names) if n.startswith("autograd::engine::evaluate_function"))
            assert "aten::linear" in names[:first_node] and "aten::linear" not in names[first_node:]
        # recompute time: the kernels the re-run forward ops launched
        launches = {e["args"]["correlation"]: e for e in raw.events if e["cat"] == "cuda_runtime"}
        rerun_ops = [
            e
            for e in raw.events
            if e["name"] in ("aten::linear", "aten::gelu")
            and any(b["start"] <= e["start"] < b["end"] for b in backwards)
        ]
        rerun = [
            (k["start"], k["end"])
            for k in raw.kernels()
            if any(e["start"] <= launches[k["args"]["correlation"]]["start"] < e["end"] for e in rerun_ops)
        ]
        total = sum(
            _union_in(rerun, row["window_start_ns"], row["window_end_ns"])
            for row in truth["per_step"]
            if row["rank"] == r
        )
        assert total == rows[r]["recompute_ns"]
        assert 0.2 < rows[r]["recompute_share"] < 0.3
    assert all(0.2 < s["recompute_share"] < 0.3 for s in truth["stages"])


def test_generated_run_without_metadata_has_the_same_traffic_and_no_groups(generated_3d):
    ranks, truth = generated_3d["tp2_dp2_pp4_nometa"]
    _, with_meta = generated_3d["tp2_dp2_pp4"]
    assert truth["per_step"] == with_meta["per_step"] and truth["p2p_pairs"] == with_meta["p2p_pairs"]
    for raw in ranks.values():
        assert "pg_config" not in raw.doc["distributedInfo"]
        assert not any(key.startswith("Process Group") for e in raw.events for key in e.get("args", {}))


def test_generated_3d_runs_write_the_same_bytes(tmp_path):
    sc = SCENARIOS_3D["tp2_dp2_pp4"]
    first, _ = generate(sc, tmp_path / "a")
    second, _ = generate(sc, tmp_path / "b")
    for path in sorted(first.iterdir()):
        assert path.read_bytes() == (second / path.name).read_bytes()
