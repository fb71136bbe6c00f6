"""replay / replay_many walk the graph by levels, all scenarios at once; they must give
exactly what the recurrence in tracekit.analyze.replay's module doc gives, action by action,
on graphs with rendezvous transfers, release times, per-rank origins and tied arrivals."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.analyze.replay import Scenario, StepGraph, replay, replay_many
from tracekit.analyze.schedules import graph_from_orders, interleaved_1f1b, one_f_one_b


def _recurrence(graph: StepGraph, dur, ovh, lat, xfer):
    """The replay written as its definition: one action after another, one edge at a time."""
    n = len(graph.action_id)
    start, end, binding = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    into: list[list[int]] = [[] for _ in range(n)]
    for e, d in enumerate(graph.edge_dst):
        into[int(d)].append(e)
    for i in range(n):
        free = ready = graph.origin(i) if graph.prev[i] < 0 else int(end[graph.prev[i]])
        if graph.release is not None:
            ready = max(ready, int(graph.release[i]))
        bind = -1
        for e in into[i]:
            arrival = int(end[graph.edge_src[e]]) + int(lat[e])
            if xfer[e]:
                arrival = max(arrival, free) + int(xfer[e])
            if arrival > ready:
                ready, bind = arrival, e
        start[i] = ready + ovh[i]
        end[i] = start[i] + dur[i]
        binding[i] = bind
    return start, end, binding


def _generated_graph(orders, seed: int, rendezvous: bool, per_rank: bool) -> StepGraph:
    """A generated schedule's graph with random (often tied) durations, latencies,
    transfers, overheads, release times and rank origins."""
    graph = graph_from_orders(orders, {"F": 10, "B": 20}, latency_ns=3)
    rng = np.random.default_rng(seed)
    n, e = len(graph.dur), len(graph.edge_src)
    graph.dur = rng.integers(0, 4, n) * 5  # coarse: arrivals tie often
    graph.ovh = rng.integers(0, 3, n)
    graph.edge_lat = rng.integers(0, 3, e) * 5
    if rendezvous:
        graph.edge_xfer = np.where(rng.random(e) < 0.5, rng.integers(1, 4, e) * 5, 0)
    graph.release = rng.integers(0, 40, n) if per_rank else None
    graph.rank_start = {int(r): int(rng.integers(0, 30)) for r in np.unique(graph.rank)} if per_rank else None
    return graph


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rendezvous", [False, True])
@pytest.mark.parametrize("per_rank", [False, True])
def test_the_level_walk_is_the_recurrence(seed, rendezvous, per_rank):
    orders = interleaved_1f1b(4, 2, 8) if seed % 2 else one_f_one_b(3, 5)
    graph = _generated_graph(orders, seed, rendezvous, per_rank)
    rng = np.random.default_rng(100 + seed)
    n, e = len(graph.dur), len(graph.edge_src)
    scenarios = [
        Scenario(),
        Scenario(dur=rng.integers(0, 4, n) * 5),
        Scenario(lat=np.zeros(e, np.int64), xfer=np.zeros(e, np.int64)),
        Scenario(ovh=np.zeros(n, np.int64), lat=rng.integers(0, 5, e) * 5),
    ]
    for scenario, got in zip(scenarios, replay_many(graph, scenarios)):
        dur = graph.dur if scenario.dur is None else scenario.dur
        ovh = graph.ovh if scenario.ovh is None else scenario.ovh
        lat = graph.edge_lat if scenario.lat is None else scenario.lat
        xfer = graph.edge_xfer if scenario.xfer is None else scenario.xfer
        start, end, binding = _recurrence(graph, dur, ovh, lat, xfer)
        assert np.array_equal(got.start, start)
        assert np.array_equal(got.end, end)
        assert np.array_equal(got.binding, binding)
    # and one at a time is the same as together
    alone = replay(graph, dur=scenarios[1].dur)
    together = replay_many(graph, scenarios)[1]
    assert np.array_equal(alone.end, together.end) and np.array_equal(alone.binding, together.binding)


def test_a_changed_graph_is_walked_anew():
    graph = graph_from_orders(one_f_one_b(3, 4), {"F": 10, "B": 20}, latency_ns=5)
    before = replay(graph).end.max()
    graph.t0 = 100  # origins are read at each replay
    assert replay(graph).end.max() == before + 100
    graph.t0 = 0
    graph.edge_src, graph.edge_dst = graph.edge_src[:0], graph.edge_dst[:0]  # no messages now
    graph.edge_lat, graph.edge_xfer = graph.edge_lat[:0], graph.edge_xfer[:0]
    assert replay(graph).end.max() < before


def test_an_empty_graph_replays_to_nothing():
    graph = graph_from_orders({}, {"F": 1, "B": 2})
    assert len(replay(graph).end) == 0


@pytest.mark.parametrize("cells", [None, 40, 300])
def test_several_graphs_in_one_walk_are_each_graph_replayed_alone(cells, monkeypatch):
    """replay_steps (graphs side by side, one walk) gives each graph exactly what replay_many
    gives it alone: graphs of other depths and sizes, other scenario counts (one with none),
    rendezvous and per-rank origins mixed; ``cells`` small makes it cut the graphs into
    several walks (and send a graph too big for one alone through replay_many)."""
    from tracekit.analyze import replay as replay_module

    if cells is not None:
        monkeypatch.setattr(replay_module, "_UNION_CELLS", cells)
    graphs, scenarios = [], []
    for seed in range(7):
        orders = [one_f_one_b(3, 5), interleaved_1f1b(4, 2, 8), one_f_one_b(2, 2), one_f_one_b(4, 6)][seed % 4]
        graph = _generated_graph(orders, 50 + seed, rendezvous=seed % 2 == 0, per_rank=seed % 3 == 0)
        rng = np.random.default_rng(seed)
        n, e = len(graph.dur), len(graph.edge_src)
        options = [
            Scenario(),
            Scenario(dur=rng.integers(0, 4, n) * 5),
            Scenario(lat=np.zeros(e, np.int64), xfer=np.zeros(e, np.int64), ovh=np.zeros(n, np.int64)),
            Scenario(lat=rng.integers(0, 5, e) * 5),
        ]
        graphs.append(graph)
        scenarios.append([] if seed == 5 else options[: 1 + seed % 4])
    # a graph on a clock before 0 (a rank's shifted times) beside graphs with release times
    early = _generated_graph(one_f_one_b(3, 4), 99, rendezvous=False, per_rank=False)
    early.t0 = -10_000
    graphs.insert(1, early)
    scenarios.insert(1, [Scenario(), Scenario(ovh=np.zeros(len(early.dur), np.int64))])
    walked = list(replay_module.replay_steps(zip(graphs, scenarios, graphs)))
    assert [carried for carried, _ in walked] == graphs  # each step's own, in order
    together = [replays for _, replays in walked]
    for graph, own, got in zip(graphs, scenarios, together):
        want = replay_many(graph, own) if own else []
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
            assert np.array_equal(a.binding, b.binding)
    # graphs with no scenarios at all, alone or together: no replays
    assert list(replay_module.replay_steps([(graphs[0], [], 0), (graphs[2], [], 2)])) == [(0, []), (2, [])]
