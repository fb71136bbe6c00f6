"""Issue #29: comm blame per link on GENERATED GPU pipelines (tests/gpu_tracegen.py, not real
traces), checked against what the simulation knows.

Each link's share of the comm blame must be its share of what the simulation says the link
costs (``gpu_tracegen.link_costs``: the idle its transfers add, freed alone and alone); every
link that carries messages is listed, past the links blame replays too; at p=8 v=4 m=32 links that are alike are blamed alike
(it was one or two links at ~4-8x the median, decided by the jitter of a few kernels, and
the wrap links blamed for nothing), and one slow link is blamed first, for most of the idle
it adds.
"""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from gpu_tracegen import Scenario, generate, link_costs
from tracekit.analyze import attribution
from tracekit.cli import main

# Every link 50 us a message: comm is most of the idle, and alike on every link.
ALIKE_NS = 50_000
INTERLEAVED_8 = {"schedule": "Interleaved1F1B", "p": 8, "v": 4, "m": 32, "transfer_ns": ALIKE_NS}


def _blamed(folder) -> dict[tuple[int, int], int]:
    result = CliRunner().invoke(main, ["analyze", str(folder), "--json", "--no-cache", "--no-progress"])
    assert result.exit_code == 0, result.output
    links = json.loads(result.output)["blame"]["links"]
    return {(row["src_rank"], row["dst_rank"]): row["comm_ns"] for row in links}


def _idle_ns(truth: dict) -> int:
    return sum(row["idle_ns"] for row in truth["ranks"])


@pytest.mark.parametrize(
    "shape",
    [
        {"schedule": "Interleaved1F1B", "p": 4, "v": 2, "m": 8},
        {"schedule": "1F1B", "p": 8, "m": 16},
    ],
    ids=["interleaved_p4", "1f1b_p8"],
)
def test_each_links_share_of_the_blame_is_its_share_of_what_it_costs(tmp_path, shape):
    """A link's weight is what freeing it alone saves plus what it alone costs, as the
    simulation measures them by running again: the replay must find the same shares."""
    sc = Scenario("link_shares", transfer_ns=ALIKE_NS, **shape)
    costs = link_costs(sc)
    folder, _ = generate(sc, tmp_path)
    blamed = _blamed(folder)
    assert sorted(blamed) == sorted(costs), "every link that carries messages is blamed for some comm"
    weight = {link: cost["freed_ns"] + cost["alone_ns"] for link, cost in costs.items()}
    total_weight, total_blame = sum(weight.values()), sum(blamed.values())
    off = {
        link: (round(weight[link] / total_weight, 3), round(blamed[link] / total_blame, 3))
        for link in costs
        if abs(weight[link] / total_weight - blamed[link] / total_blame) > 0.01
    }
    assert not off, f"link: (simulated share, blamed share): {off}"


def test_links_past_the_replayed_ones_are_blamed_too(tmp_path, monkeypatch):
    """Blame replays MAX_BLAME_REPLAYS links (32: an interleaved pipeline of p > 16 has more);
    the rest of a pipeline's links share by latency at the rate its replayed ones show, so
    none drops off the list (p=20 v=2 m=40 listed 32 of its 40 links)."""
    monkeypatch.setattr(attribution, "MAX_BLAME_REPLAYS", 3)
    sc = Scenario("few_blame_replays", schedule="Interleaved1F1B", p=4, v=2, m=8, transfer_ns=ALIKE_NS)
    folder, truth = generate(sc, tmp_path)
    blamed = _blamed(folder)
    assert set(blamed) == {(p["src_rank"], p["dst_rank"]) for p in truth["p2p_pairs"]}
    assert all(ns > 0 for ns in blamed.values()), blamed


@pytest.fixture(scope="module")
def interleaved_8(tmp_path_factory):
    """Interleaved1F1B p=8 v=4 m=32, every link alike, and the same run with link 3->4 ten
    times slower (same seed: the same kernels)."""
    out = tmp_path_factory.mktemp("link_blame")
    alike = generate(Scenario("alike_links", **INTERLEAVED_8), out)
    slow = generate(Scenario("slow_link_3_4", link_transfer_ns={(3, 4): 10 * ALIKE_NS}, **INTERLEAVED_8), out)
    return alike, slow


def test_links_that_are_alike_are_blamed_alike_at_p8_v4_m32(interleaved_8):
    (folder, truth), _ = interleaved_8
    blamed = _blamed(folder)
    links = {(p["src_rank"], p["dst_rank"]) for p in truth["p2p_pairs"]}
    assert len(links) == 16 and set(blamed) == links, f"links blamed: {sorted(blamed)}"
    median = statistics.median(blamed.values())
    worst = max(blamed, key=blamed.get)
    assert blamed[worst] <= 2 * median, f"link {worst}: {blamed[worst]} ns, median {median} ns"


def test_a_slow_link_is_blamed_first_for_most_of_the_idle_it_adds(interleaved_8):
    (_, alike_truth), (folder, slow_truth) = interleaved_8
    blamed = _blamed(folder)
    first, second = sorted(blamed, key=blamed.get, reverse=True)[:2]
    assert first == (3, 4)
    assert blamed[first] > 5 * blamed[second], blamed
    added = _idle_ns(slow_truth) - _idle_ns(alike_truth)  # what the slow link adds, by construction
    assert 0.5 * added <= blamed[first] <= added, f"blamed {blamed[first]} ns of the {added} ns it adds"
