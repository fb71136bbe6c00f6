"""Issue #12's acceptance tests on GENERATED GPU pipelines (tests/gpu_tracegen.py, not real traces).

Each scenario injects one thing (a host that runs a step ahead, a slow stage, a slow link, a
launch-bound rank, an interleaved v=2 schedule, an unlabelled native 1F1B, clocks that
disagree) and the generator knows the truth by construction. ``tracekit analyze --json``
must measure the device timeline within 0.01 of it per rank, name the injected cause with
the right blame, pair the SendRecv kernels with their wait and transfer, and still show the
host-side figure where it differs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
from click.testing import CliRunner

from gpu_tracegen import (
    BASE_TIME_NS,
    FUSED_SCENARIOS,
    ORIGIN_NS,
    PLAIN_SCENARIOS,
    ROCM_FUSED_SCENARIOS,
    ROCM_PLAIN_SCENARIOS,
    SCENARIOS,
    generate,
    schedule_order,
)
from tracekit.cli import main

# fused_*: torch's native Schedule1F1B with batch_isend_irecv (one fused SendRecv kernel per group);
# rocm_*: the same jobs with ROCm's names (RCCL's one generic kernel for every op, issue #29)
ROCM_SCENARIOS = ROCM_PLAIN_SCENARIOS + ROCM_FUSED_SCENARIOS
ACCEPTANCE = PLAIN_SCENARIOS + FUSED_SCENARIOS + ROCM_SCENARIOS
BUBBLE_TOLERANCE = 0.01
PAIR_TOLERANCE_NS = 1_000
OTHER_CAUSES = ("schedule_gaps_ns", "imbalance_ns", "comm_ns", "overhead_ns")


def _analyze(folder, *extra: str) -> dict:
    result = CliRunner().invoke(main, ["analyze", str(folder), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_generated")
    runs, docs = {}, {}

    def get(name: str, *extra: str):
        if name not in runs:
            runs[name] = generate(_scenario(name), out)
        folder, truth = runs[name]
        if (name, extra) not in docs:
            docs[(name, extra)] = _analyze(folder, *extra)
        return docs[(name, extra)], truth

    return get


def _scenario(name: str):
    """A named scenario, or ``<rocm scenario>@cuda``: the same job with CUDA's names."""
    base, _, platform = name.partition("@")
    return replace(SCENARIOS[base], name=f"{base}_on_cuda", rocm=False) if platform == "cuda" else SCENARIOS[base]


def _by_rank(rows: list[dict]) -> dict[int, dict]:
    return {row["rank"]: row for row in rows}


@pytest.mark.parametrize("name", ACCEPTANCE)
def test_the_device_timeline_is_measured(analysed, name):
    doc, _ = analysed(name)
    assert doc["timeline"] == "device", f"{name}: analysed on the {doc['timeline']} timeline"


@pytest.mark.parametrize("name", ACCEPTANCE)
def test_bubble_per_rank_is_within_a_hundredth_of_the_truth(analysed, name):
    doc, truth = analysed(name)
    got = _by_rank(doc["ranks"])
    wrong = [
        f"rank {row['rank']}: expected {row['bubble_ratio']:.4f}, got {got[row['rank']]['bubble_ratio']:.4f}"
        for row in truth["ranks"]
        if abs(got[row["rank"]]["bubble_ratio"] - row["bubble_ratio"]) > BUBBLE_TOLERANCE
    ]
    assert not wrong, f"{name}: " + "; ".join(wrong)


def _dominant(causes: dict) -> str:
    return max(causes, key=causes.get)


@pytest.mark.parametrize(
    "name, schedule, v", [("unlabelled_1f1b", "1F1B", 1), ("unlabelled_interleaved", "Interleaved1F1B", 2)]
)
def test_an_unlabelled_run_has_every_action_with_its_stage_and_microbatch(tmp_path, name, schedule, v):
    from tracekit import load

    sc = SCENARIOS[name]
    folder, _ = generate(sc, tmp_path)
    run = load(folder)
    assert (run.schedule.name, run.schedule.p, run.schedule.v, run.schedule.m) == (schedule, sc.p, v, sc.m)
    assert run.actions_from == "segmentation"
    for (rank, step), got in run.actions.sort_values("start_ns").groupby(["rank", "step"]):
        found = [(int(a.stage), a.kind, int(a.microbatch)) for a in got.itertuples()]
        assert found == schedule_order(sc, int(rank)), f"{name}: rank {rank} step {step}"


def test_a_slow_stage_is_imbalance_blamed_on_that_stage(analysed):
    doc, truth = analysed("slow_stage")
    slow = truth["injected"]["stage"]
    assert doc["blame"]["stages"][0]["stage"] == slow
    for row in doc["ranks"]:
        if row["rank"] != slow:  # the others wait for it
            assert _dominant(row["causes"]) == "imbalance_ns", (row["rank"], row["causes"])


@pytest.mark.parametrize("name", ["slow_link", "fused_slow_link", "rocm_slow_link"])
def test_a_slow_link_is_comm_blamed_on_that_link(analysed, name):
    """With fused kernels the reverse link's messages that share a kernel with the slow link's
    take as long (the kernel ends with its slower direction); the blame must still name the
    slow link alone."""
    doc, truth = analysed(name)
    src, dst = truth["injected"]["link"]
    top = doc["blame"]["links"][0]
    assert (top["src_rank"], top["dst_rank"]) == (src, dst)
    receiver = _by_rank(doc["ranks"])[dst]
    assert _dominant(receiver["causes"]) == "comm_ns", receiver["causes"]


def test_a_launch_bound_rank_is_overhead_and_said_so(analysed):
    doc, truth = analysed("launch_bound")
    rank = truth["injected"]["rank"]
    assert _dominant(_by_rank(doc["ranks"])[rank]["causes"]) == "overhead_ns"
    texts = [json.dumps(finding) for finding in doc["findings"]]
    assert any(f"rank {rank}" in text and "launch-bound" in text for text in texts), texts
    expected = _by_rank(truth["ranks"])[rank]
    got = _by_rank(doc["device"]["ranks"])[rank]["launch_wait_ns"]
    assert abs(got - expected["host_wait_ns"]) <= BUBBLE_TOLERANCE * expected["window_ns"], (
        f"launch wait of rank {rank}: expected {expected['host_wait_ns']} ns, got {got} ns"
    )


@pytest.mark.parametrize(
    "name", ["host_ahead", "interleaved", "unlabelled_1f1b", "unlabelled_interleaved", "clock_offset", "fused_1f1b"]
)
def test_a_plain_schedule_idles_in_fill_and_drain(analysed, name):
    doc, _ = analysed(name)
    for row in doc["ranks"]:
        causes = row["causes"]
        fill_drain = causes["warmup_ns"] + causes["drain_ns"]
        assert all(fill_drain > causes[other] for other in OTHER_CAUSES), (name, row["rank"], causes)


@pytest.mark.parametrize("name", ACCEPTANCE)
def test_p2p_kernel_pairs_have_the_true_wait_and_transfer(analysed, name):
    doc, truth = analysed(name)
    got, expected = defaultdict(list), defaultdict(list)
    for row in doc["device"]["p2p_pairs"]:
        got[(row["src_rank"], row["dst_rank"], row["step"])].append(row)
    for row in truth["p2p_pairs"]:  # in send order within each link and step
        expected[(row["src_rank"], row["dst_rank"], row["step"])].append(row)
    assert sorted(got) == sorted(expected)
    wrong = []
    for key, rows in expected.items():
        assert len(got[key]) == len(rows), f"{name} link/step {key}: {len(got[key])} pairs, expected {len(rows)}"
        for n, (want, have) in enumerate(zip(rows, got[key])):
            # a fused kernel moves several messages and ends with its slowest: each message's
            # transfer is its own direction's (the truth's message_transfer_ns), within 5%
            transfer = want["message_transfer_ns"]
            off = (
                [f"wait_ns {want['wait_ns']} vs {have['wait_ns']}"]
                if abs(want["wait_ns"] - have["wait_ns"]) > PAIR_TOLERANCE_NS
                else []
            )
            if abs(transfer - have["transfer_ns"]) > max(PAIR_TOLERANCE_NS, 0.05 * transfer):
                off.append(f"transfer_ns {transfer} vs {have['transfer_ns']}")
            if want["waiting_rank"] is not None and have["waiting_rank"] != want["waiting_rank"]:
                off.append(f"waiting rank {want['waiting_rank']} vs {have['waiting_rank']}")
            if off:
                wrong.append(f"{key} message {n}: " + ", ".join(off))
    assert not wrong, f"{name}: {len(wrong)} pairs off (expected vs got): " + "; ".join(wrong[:5])


@pytest.mark.parametrize("name", ROCM_SCENARIOS)
def test_on_rocm_every_message_has_its_kernels_on_both_sides(analysed, name):
    """Issue #29: RCCL launches one generic kernel for every op (hipExtLaunchKernel); a send or
    receive's kernel is the one its host call launched, as on CUDA: no message keeps the host's
    times, and the schedule is the generated one."""
    doc, truth = analysed(name)
    sc = SCENARIOS[name]
    assert not [w for w in doc["warnings"] if "kernel on both sides" in w], doc["warnings"]
    assert len(doc["device"]["p2p_pairs"]) == doc["summary"]["n_messages"] == len(truth["p2p_pairs"])
    schedule = doc["schedule"]
    assert (schedule["name"], schedule["p"], schedule["v"], schedule["m"]) == (sc.schedule, sc.p, sc.v, sc.m)


@pytest.mark.parametrize("name", ROCM_SCENARIOS)
def test_a_rocm_run_reads_as_the_same_run_with_cuda_names(analysed, name):
    """The simulation does not depend on the names: the job written with CUDA's names (NCCL's
    SendRecv kernel, cudaLaunchKernel) gives the same analysis, figure for figure, save where
    the files are."""
    rocm, _ = analysed(name)
    cuda, _ = analysed(f"{name}@cuda")
    for key in sorted(set(rocm) | set(cuda)):
        if key not in ("source", "files"):
            assert rocm.get(key) == cuda.get(key), f"{name}: {key} differs from the CUDA run's"


def test_the_host_view_differs_when_the_host_runs_ahead(analysed):
    doc, _ = analysed("host_ahead")
    host = _by_rank(doc["host_view"]["ranks"])
    for row in doc["ranks"]:
        assert abs(host[row["rank"]]["bubble_ratio"] - row["bubble_ratio"]) > 0.05, (
            f"rank {row['rank']}: host {host[row['rank']]['bubble_ratio']} vs device {row['bubble_ratio']}"
        )
    host_doc, _ = analysed("host_ahead", "--timeline", "host")
    assert host_doc["timeline"] == "host"
    assert {r["rank"]: r["bubble_ratio"] for r in host_doc["ranks"]} == {
        rank: row["bubble_ratio"] for rank, row in host.items()
    }


@pytest.mark.parametrize(
    "name", ["host_ahead", "slow_stage", "launch_bound", "interleaved", "unlabelled_1f1b", "clock_offset", "fused_1f1b"]
)
def test_comm_is_no_more_than_the_run_spent_in_transfer(analysed, name):
    """Waiting for a producer that is late is not comm; only the transfer is (issue #12).
    A link's time propagates down the pipeline (a rank waits for a chain of messages), so a
    rank's comm can exceed what its own messages spent in transfer, but never what all the
    run's messages did: freeing every link shortens no rank's idle by more than that."""
    doc, truth = analysed(name)
    all_transfers = sum(pair["transfer_ns"] for pair in truth["p2p_pairs"])
    windows = {row["rank"]: row["window_ns"] for row in truth["ranks"]}
    wrong = [
        f"rank {row['rank']}: comm {row['causes']['comm_ns']} ns, all transfers {all_transfers} ns"
        for row in doc["ranks"]
        if row["causes"]["comm_ns"] > all_transfers + BUBBLE_TOLERANCE * windows[row["rank"]]
    ]
    assert not wrong, f"{name}: " + "; ".join(wrong)


@pytest.mark.parametrize("name", FUSED_SCENARIOS + ROCM_FUSED_SCENARIOS)
def test_a_fused_kernel_gives_one_pair_per_message(analysed, name):
    """batch_isend_irecv launches one kernel for a send and a receive: each of the two messages
    it moves is its own row, with its own ranks, and both rows carry that kernel's times."""
    doc, truth = analysed(name)

    def key(row: dict, origin_ns: int) -> tuple:
        return (
            row["step"],
            row["src_rank"],
            row["dst_rank"],
            row["send_start_ns"] - origin_ns,
            row["recv_start_ns"] - origin_ns,
        )

    # tracekit reports absolute ns; the truth is on the simulation's clock (no offsets here)
    got = sorted(key(row, BASE_TIME_NS + ORIGIN_NS) for row in doc["device"]["p2p_pairs"])
    assert got == sorted(key(row, 0) for row in truth["p2p_pairs"])
    sharing = defaultdict(list)  # one rank's kernel (rank, start) -> the messages it moved
    for row in doc["device"]["p2p_pairs"]:
        sharing[(row["src_rank"], row["send_start_ns"])].append(row)
        sharing[(row["dst_rank"], row["recv_start_ns"])].append(row)
    fused = [rows for rows in sharing.values() if len(rows) == 2]
    assert fused, f"{name}: no kernel moved two messages"
    for a, b in fused:  # a send and a receive with one peer, in opposite directions
        assert (a["src_rank"], a["dst_rank"]) == (b["dst_rank"], b["src_rank"]), (a, b)


def test_a_baseline_keeps_its_timeline_and_a_check_on_the_other_one_is_refused(tmp_path):
    folder, _ = generate(SCENARIOS["slow_link"], tmp_path)
    baseline = tmp_path / "baseline.json"
    made = CliRunner().invoke(main, ["baseline", str(folder), "-o", str(baseline), "--no-cache"])
    assert made.exit_code == 0, made.output
    assert json.loads(baseline.read_text())["timeline"] == "device"
    same = CliRunner().invoke(main, ["check", str(folder), "--baseline", str(baseline), "--no-cache"])
    assert same.exit_code == 0, same.output
    other = CliRunner().invoke(
        main, ["check", str(folder), "--baseline", str(baseline), "--no-cache", "--timeline", "host"]
    )
    assert other.exit_code == 2
    assert "timeline differs from the baseline" in other.output and "--timeline device" in other.output
    # a baseline written before the device timeline has no "timeline": it was the host's
    old = json.loads(baseline.read_text())
    del old["timeline"]
    baseline.write_text(json.dumps(old))
    refused = CliRunner().invoke(main, ["check", str(folder), "--baseline", str(baseline), "--no-cache"])
    assert refused.exit_code == 2 and "measured on the host" in refused.output
