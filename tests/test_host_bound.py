"""Issue #29: a host-bound rank is blamed for its neighbours' P2P waits, on GENERATED GPU
pipelines (tests/gpu_tracegen.py, not real traces) whose P2P ops go out as Megatron's
unbatched isend/irecv: one NCCL stream per peer pair (``Scenario.peer_streams``).

Rank 1's host launches every kernel 300 us late. Its neighbours' receives from it spin on
their stream with rank 1 until its sends come, and their sends to it queue behind those
receives. tracekit took the queue for the neighbour posting late ("The latency is rank 2's,
not the link's: sends are posted 3.1 ms after the producing action ends") and charged it to
comm (68.8 ms of idle, where every transfer of the run adds up to 1 ms); the wait is rank
1's host.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

from gpu_tracegen import NCCL_KERNEL, Scenario, generate
from tracekit.cli import main

HOST_BOUND = 1
MEGATRON = Scenario("megatron_unbatched", labelled=False, peer_streams=True)
MEGATRON_HOST_BOUND = Scenario(
    "megatron_unbatched_host_bound", labelled=False, peer_streams=True, rank_launch_ns={HOST_BOUND: 300_000}
)
BUBBLE_TOLERANCE = 0.01
PAIR_TOLERANCE_NS = 1_000


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    out = tmp_path_factory.mktemp("host_bound")
    done = {}

    def get(sc: Scenario):
        if sc.name not in done:
            folder, truth = generate(sc, out)
            result = CliRunner().invoke(main, ["analyze", str(folder), "--json", "--no-cache", "--no-progress"])
            assert result.exit_code == 0, result.output
            done[sc.name] = (folder, json.loads(result.output), truth)
        return done[sc.name]

    return get


def test_a_ranks_sends_and_receives_with_one_peer_share_a_stream(analysed):
    """Read back with plain gzip/json: one NCCL stream per peer, both directions on it, and
    sends that start as a receive from their own receiver ends on that stream."""
    folder, _, _ = analysed(MEGATRON_HOST_BOUND)
    queued_sends = 0
    for rank in range(MEGATRON_HOST_BOUND.p):
        events = json.loads(gzip.decompress((folder / f"rank{rank}.json.gz").read_bytes()))["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel" and e["name"] == NCCL_KERNEL]
        directions = defaultdict(set)
        peers = defaultdict(set)
        for k in kernels:
            directions[k["tid"]].add(k["args"]["Collective name"])
            peers[k["tid"]].add(k["args"].get("Dst Rank", k["args"].get("Src Rank")))  # "Rank" is its own
        assert all(len(p) == 1 for p in peers.values()), peers
        neighbours = {r for r in (rank - 1, rank + 1) if 0 <= r < MEGATRON_HOST_BOUND.p}
        assert {p for ps in peers.values() for p in ps} == neighbours
        assert all(d == {"send", "recv"} for d in directions.values()), directions
        for stream in directions:
            on_stream = sorted((k for k in kernels if k["tid"] == stream), key=lambda k: k["ts"])
            queued_sends += sum(
                a["args"]["Collective name"] == "recv"
                and b["args"]["Collective name"] == "send"
                and abs(a["ts"] + a["dur"] - b["ts"]) < 0.01
                for a, b in zip(on_stream, on_stream[1:])
            )
    assert queued_sends > 0


@pytest.mark.parametrize("sc", [MEGATRON, MEGATRON_HOST_BOUND], ids=lambda sc: sc.name)
def test_the_device_timeline_and_the_kernel_pairs_are_the_truth(analysed, sc):
    _, doc, truth = analysed(sc)
    got = {row["rank"]: row["bubble_ratio"] for row in doc["ranks"]}
    for row in truth["ranks"]:
        assert abs(got[row["rank"]] - row["bubble_ratio"]) <= BUBBLE_TOLERANCE, (row["rank"], got, row)
    mine, expected = defaultdict(list), defaultdict(list)
    for row in doc["device"]["p2p_pairs"]:
        mine[(row["src_rank"], row["dst_rank"], row["step"])].append(row)
    for row in truth["p2p_pairs"]:
        expected[(row["src_rank"], row["dst_rank"], row["step"])].append(row)
    assert sorted(mine) == sorted(expected)
    for key, rows in expected.items():
        for want, have in zip(rows, mine[key]):
            for field in ("wait_ns", "transfer_ns"):
                assert abs(want[field] - have[field]) <= PAIR_TOLERANCE_NS, (key, field, want, have)


def test_a_host_bound_rank_is_blamed_for_its_neighbours_p2p_waits(analysed):
    _, doc, truth = analysed(MEGATRON_HOST_BOUND)
    first = doc["findings"][0]
    assert first["cause"] == "launch_bound", first["headline"]
    bound = first["figures"]["ranks"][0]
    assert bound["rank"] == HOST_BOUND
    assert bound["peers_spinning"] == [0, 2] and bound["peers_spun_ns"] > 0
    assert "The P2P kernels of ranks 0, 2 spun" in first["headline"]
    # no neighbour is said to post its sends late: the comm finding, if any, names no rank
    comm = [f for f in doc["findings"] if f["cause"] == "comm"]
    assert not any("The latency is rank" in f["advice"] for f in comm), [f["advice"] for f in comm]
    # every rank waits for rank 1's host: overhead, and comm no more than the run's transfers
    all_transfers = sum(pair["transfer_ns"] for pair in truth["p2p_pairs"])
    for row in doc["ranks"]:
        causes = row["causes"]
        assert causes["overhead_ns"] == max(causes.values()), (row["rank"], causes)
        assert causes["comm_ns"] <= all_transfers, (row["rank"], causes["comm_ns"], all_transfers)


def test_a_clean_run_says_no_rank_posts_its_sends_late(analysed):
    """Sends queue behind receives in a run without a fault too (a neighbour's receive spins
    while that neighbour computes): that is no rank's late posting."""
    _, doc, _ = analysed(MEGATRON)
    assert doc["warnings"] == []
    advice = [f["advice"] for f in doc["findings"] if f["cause"] == "comm"]
    assert not any("The latency is rank" in a for a in advice), advice
