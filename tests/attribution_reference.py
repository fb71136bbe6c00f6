"""``attribute_step`` as it was before its per-rank work became matrix rows (tracekit
1b5124f, kept as it was but for the link blame's weights, restated here for issue #29):
``tests/test_attribution_fast.py`` holds the new one equal to it on every sample step and
on generated schedules with faults and replicas. Rank by rank: the schedule's phases from a
loop over the rank's holes, ``apportion`` per rank, the stage and link blame per rank,
Shapley values per rank, and one ``idle_per_rank`` per replay.

Only the functions the fast version rewrote stand here, as they were in 1b5124f
(``attribute_step``, ``shapley``, ``apportion`` and ``_apportioned``, ``_positions_by_rank``,
``_schedule_idle``, ``_gains``, ``_link_latency``), with the link blame's replays and
weights (``_link_scenarios``, ``_link_gains``: each link freed alone, and alone with the
other links of its pipeline free, issue #29) written out link by link; what it left
unchanged (the constants, the dataclasses, ``_scenario``, ``_makespan``, ``_linked_groups``,
``_stages_by_excess``, ``_excess_work``) is imported from ``tracekit.analyze.attribution``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.attribution import (
    ATTRIBUTION_COLUMNS,
    CAUSES,
    MAX_BLAME_REPLAYS,
    Coalition,
    StepAttribution,
    _excess_work,
    _Gains,
    _linked_groups,
    _makespan,
    _scenario,
    _stages_by_excess,
)
from tracekit.analyze.replay import Replay, Scenario, StepGraph, critical_path, idle_per_rank, replay_many


def apportion(total: int, weights: Sequence[float] | np.ndarray) -> list[int]:
    """Split integer ``total`` in proportion to non-negative ``weights``; the parts are
    integers that sum to ``total`` exactly (largest remainder). All-zero weights put
    everything on the last part."""
    return [int(x) for x in _apportioned(total, weights)]


def _apportioned(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """:func:`apportion`, as an int64 array."""
    w = np.clip(np.asarray(weights, dtype=float), 0.0, None)
    floors = np.zeros(len(w), dtype=np.int64)
    if total <= 0:
        return floors
    if w.sum() <= 0:
        floors[-1] = total
        return floors
    exact = w / w.sum() * total
    floors = np.asarray(np.floor(exact), dtype=np.int64)
    remainder = int(total - floors.sum())
    order = np.argsort(-(exact - floors), kind="stable")
    floors[order[:remainder]] += 1
    return floors


def shapley(
    values: dict[Coalition, dict[int, int]], players: tuple[str, ...], ranks: Sequence[int]
) -> dict[int, dict[str, float]]:
    """Exact Shapley values per rank from the value of every coalition of present causes."""
    from math import factorial

    n = len(players)
    out: dict[int, dict[str, float]] = {int(r): {} for r in ranks}
    for player in players:
        others = [q for q in players if q != player]
        for r in ranks:
            total = 0.0
            for size in range(n):
                weight = factorial(size) * factorial(n - size - 1) / factorial(n)
                for coalition in combinations(others, size):
                    with_p = values[frozenset(coalition) | {player}][r]
                    without = values[frozenset(coalition)][r]
                    total += weight * (with_p - without)
            out[int(r)][player] = total
    return out


def attribute_step(graph: StepGraph, measured_idle: dict[int, int], measured_makespan: int) -> StepAttribution:
    """Attribute one step's idle per rank (``measured_idle`` from the bubble table)."""
    ranks = [int(r) for r in graph.ranks]
    balanced = graph.balanced_durations()
    coalitions = [frozenset(c) for size in range(len(CAUSES) + 1) for c in combinations(CAUSES, size)]
    scenarios = [_scenario(graph, balanced, present) for present in coalitions]
    by_excess = _stages_by_excess(graph, balanced)
    stage_scenarios = [
        Scenario(dur=np.where(graph.stage == s, balanced, graph.dur)) for s in by_excess[:MAX_BLAME_REPLAYS]
    ]
    link_latency = _link_latency(graph)
    by_latency = sorted(link_latency, key=lambda link: -link_latency[link])
    link_scenarios = _link_scenarios(graph, by_latency[:MAX_BLAME_REPLAYS], link_latency)
    # Every replay of the step at once (replay_many walks the graph a single time).
    replayed = replay_many(graph, scenarios + stage_scenarios + link_scenarios)
    results: dict[Coalition, Replay] = dict(zip(coalitions, replayed))
    values = {
        present: idle_per_rank(graph, results[present], scenario.dur)
        for present, scenario in zip(coalitions, scenarios)
    }
    full, none = frozenset(CAUSES), Coalition()
    signed = shapley(values, CAUSES, ranks)
    ideal = results[none]
    stage_results = replayed[len(scenarios) : len(scenarios) + len(stage_scenarios)]
    stage_gain = _gains(graph, values[full], by_excess, stage_scenarios, stage_results)
    link_results = replayed[len(scenarios) + len(stage_scenarios) :]
    link_gain = _link_gains(graph, values[full], by_latency[:MAX_BLAME_REPLAYS], link_scenarios, link_results)
    rows, stage_rows = [], []
    link_rows: list[tuple[int, int, int, int]] = []
    ideal_windows = graph.window_ns(ideal)
    # Per rank work below must not scan every action or every link of the step: with
    # thousands of ranks that is quadratic. Each rank's actions, and the blame weights as
    # (stage or replayed link) x rank matrices, are laid out once.
    by_rank = _positions_by_rank(graph.rank)
    stages = stage_gain.keys
    stage_weights = np.maximum(stage_gain.gain, 0).astype(float)
    stage_fallback = np.array([_excess_work(graph, balanced, s) for s in stages], dtype=float)
    links = sorted(link_latency)  # every link of the step; link_gain holds the replayed ones
    position = {link: k for k, link in enumerate(links)}
    replayed_links = np.array([position[link] for link in link_gain.keys], dtype=np.int64)
    link_weights = np.maximum(link_gain.gain, 0).astype(float)
    link_fallback = np.array([link_latency[link] for link in links], dtype=float)
    # A rank none of the replayed links helps shares its comm among the links of its own
    # pipeline replica by latency, not among every link of the job (with thousands of ranks
    # that was a row per rank and link, and blamed links the rank never used).
    group = _linked_groups(links)
    link_group = np.array([group[src] for src, _ in links], dtype=np.int64)
    group_links = {g: np.flatnonzero(link_group == g) for g in np.unique(link_group).tolist()}
    no_links = np.zeros(0, dtype=np.int64)
    for column, r in enumerate(ranks):
        on_rank = by_rank[r]
        window_start = graph.origin(int(on_rank[0]))
        warmup, drain, gaps = _schedule_idle(graph, ideal, on_rank, window_start, window_start + ideal_windows[r])
        residual = measured_idle[r] - values[full][r]
        raw = [warmup, drain, gaps, signed[r]["imbalance"], signed[r]["comm"], signed[r]["overhead"] + residual]
        parts = apportion(int(measured_idle[r]), raw)
        rows.append((r, graph.step, int(measured_idle[r]), *parts))
        imbalance_ns, comm_ns = parts[3], parts[4]
        if imbalance_ns:
            weights = stage_weights[:, column]
            shares = _apportioned(imbalance_ns, weights if weights.sum() > 0 else stage_fallback)
            stage_rows += [(r, stages[k], int(shares[k])) for k in np.flatnonzero(shares).tolist()]
        if comm_ns:
            # Shares over the links that can get any (a link of weight 0 gets none), not
            # over every link of the job.
            weights = link_weights[:, column]
            candidates = replayed_links
            if weights.sum() > 0:  # the replica's links not replayed: by latency, at its replayed links' rate
                pipeline = group.get(r, -1)
                unreplayed = np.array(
                    [k for k in group_links.get(pipeline, no_links).tolist() if k not in replayed_links.tolist()],
                    dtype=np.int64,
                )
                mine = link_group[replayed_links] == pipeline
                replica_latency = link_fallback[replayed_links[mine]].sum()
                rate = weights[mine].sum() / replica_latency if replica_latency > 0 else 0.0
                candidates = np.concatenate((replayed_links, unreplayed))
                weights = np.concatenate((weights, rate * link_fallback[unreplayed]))
            else:
                candidates = group_links.get(group.get(r, -1), no_links)
                weights = link_fallback[candidates]
            if weights.sum() <= 0:  # no latency anywhere near: the rule of apportion, all links
                candidates, weights = np.arange(len(links)), np.zeros(len(links))
            shares = _apportioned(comm_ns, weights)
            link_rows += [(r, *links[candidates[k]], int(shares[k])) for k in np.flatnonzero(shares).tolist()]
    table = pd.DataFrame(rows, columns=ATTRIBUTION_COLUMNS)
    link_blame = pd.DataFrame(link_rows, columns=["rank", "src_rank", "dst_rank", "comm_ns"])
    full_result = results[full]
    return StepAttribution(
        step=graph.step,
        table=table,
        signed_shapley=signed,
        stage_blame=pd.DataFrame(stage_rows, columns=["rank", "stage", "imbalance_ns"]),
        link_blame=link_blame,
        critical_path=critical_path(graph, full_result),
        replay_makespan_ns=_makespan(graph, full_result),
        measured_makespan_ns=measured_makespan,
        ideal_makespan_ns=_makespan(graph, ideal),
        ideal_idle_ns=dict(values[none]),
        notes=list(graph.notes),
    )


def _positions_by_rank(rank: np.ndarray) -> dict[int, np.ndarray]:
    """Each rank's action positions, ascending (as ``np.flatnonzero(rank == r)``)."""
    order = np.argsort(rank, kind="stable")
    values, first = np.unique(rank[order], return_index=True)
    return {int(v): part for v, part in zip(values, np.split(order, first[1:]))}


def _schedule_idle(
    graph: StepGraph, ideal: Replay, on_rank: np.ndarray, window_start: int, window_end: int
) -> tuple[int, int, int]:
    """Split a rank's idle (its actions at positions ``on_rank``) in the all-causes-removed replay, over its window
    [window_start, window_end], by pipeline phase: warmup is idle before its first backward
    (the pipeline filling), drain is idle after its last forward (emptying), schedule gaps
    are idle in between (steady-state holes of interleaved and zero-bubble schedules).
    In a flush-free pipeline a step after the pipeline's first starts in steady state, so
    its schedule idle is ~0; the pipeline's first step (where recorded) holds the fill."""
    order = on_rank[np.argsort(ideal.start[on_rank], kind="stable")]
    starts, ends = ideal.start[order], ideal.end[order]
    kinds = graph.kind[order]
    backward = np.isin(kinds, ("B", "I"))
    forward = np.isin(kinds, ("F",))
    first_bwd = int(starts[backward].min()) if backward.any() else window_end
    last_fwd = int(ends[forward].max()) if forward.any() else window_start
    drain_from = max(last_fwd, first_bwd)
    holes_lo = np.concatenate(([window_start], ends))
    holes_hi = np.concatenate((starts, [window_end]))
    warmup = drain = gaps = 0
    for lo, hi in zip(holes_lo, holes_hi):
        lo, hi = int(lo), int(hi)
        if hi <= lo:
            continue
        in_warmup = max(0, min(hi, first_bwd) - lo)
        in_drain = max(0, hi - max(lo, drain_from))
        warmup += in_warmup
        drain += in_drain
        gaps += (hi - lo) - in_warmup - in_drain
    return warmup, drain, gaps


def _gains(
    graph: StepGraph, full_idle: dict[int, int], keys: list[Any], scenarios: list[Scenario], results: list[Replay]
) -> _Gains:
    """The gains of ``keys`` (rows in sorted key order): those with a scenario and its
    result (the first ones, in order) as replayed; the rest, not replayed, gain 0."""
    ranks = sorted(full_idle)
    ordered = sorted(keys)
    row = {key: k for k, key in enumerate(ordered)}
    gain = np.zeros((len(ordered), len(ranks)), dtype=np.int64)
    full = np.array([full_idle[r] for r in ranks], dtype=np.int64)
    for key, scenario, result in zip(keys, scenarios, results):
        idle = idle_per_rank(graph, result, scenario.dur)
        gain[row[key]] = full - np.array([idle[r] for r in ranks], dtype=np.int64)
    return _Gains(ordered, gain)


def _link_scenarios(
    graph: StepGraph, replayed: list[tuple[int, int]], link_latency: dict[tuple[int, int], int]
) -> list[Scenario]:
    """Three replays per replayed link, in turn: the link free; every other link of its
    pipeline free; every link of its pipeline free (the baseline of the second)."""
    group = _linked_groups(list(link_latency))
    links = graph.edge_links()

    def free(which) -> Scenario:
        mask = np.array([which(link) for link in links], dtype=bool)
        return Scenario(lat=np.where(mask, 0, graph.edge_lat), xfer=np.where(mask, 0, graph.edge_xfer))

    out = []
    for link in replayed:
        pipeline = group[link[0]]
        out.append(free(lambda e, link=link: e == link))
        out.append(free(lambda e, link=link, pipeline=pipeline: group[e[0]] == pipeline and e != link))
        out.append(free(lambda e, pipeline=pipeline: group[e[0]] == pipeline))
    return out


def _link_gains(
    graph: StepGraph, full_idle: dict[int, int], keys: list[Any], scenarios: list[Scenario], results: list[Replay]
) -> _Gains:
    """Per link (rows in sorted order; those not replayed gain 0) and rank: how much freeing
    it alone shortens the rank's idle, plus how much it alone (the other links of its
    pipeline free) lengthens it over its pipeline all free."""
    ranks = sorted(full_idle)
    ordered = sorted(keys)
    gain = np.zeros((len(ordered), len(ranks)), dtype=np.int64)
    for k, key in enumerate(keys):
        freed, alone, base = (idle_per_rank(graph, results[3 * k + j], scenarios[3 * k + j].dur) for j in range(3))
        gain[ordered.index(key)] = [full_idle[r] - freed[r] + alone[r] - base[r] for r in ranks]
    return _Gains(ordered, gain)


def _link_latency(graph: StepGraph) -> dict[tuple[int, int], int]:
    """Total measured latency of each link (src rank, dst rank) in the step."""
    total: dict[tuple[int, int], int] = {}
    for link, lat, xfer in zip(graph.edge_links(), graph.edge_lat, graph.edge_xfer):
        total[link] = total.get(link, 0) + int(lat) + int(xfer)
    return total
