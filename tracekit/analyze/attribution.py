"""Attribute every idle nanosecond of every rank and step to a cause, with blame.

What the result must be: each rank's idle in each step split into named causes, each >= 0,
that add up exactly to the measured idle, a root cause charged where it propagates. Method:

1. Build the step's measured dependency graph and replay it (fidelity: it must reproduce
   the measured step; the residual is reported and folded into overhead/other).
2. Three causes can be switched off: **imbalance** (durations -> each kind's typical
   duration; per kind and microbatch for TeraPipe, whose slices differ by design),
   **comm** (message latencies -> 0) and **overhead** (gaps with data there and the rank
   free -> 0). With all three off, what idle remains is what the schedule itself
   forces: split into **warmup** (before the rank's first action), **drain** (after its last)
   and **schedule gaps** (between).
3. Each cause's share is its exact Shapley value over the 2^3 = 8 replays, so the result
   does not depend on an order of removal. Root causes propagate through the graph: a slow
   link that delays rank 1 and then rank 2 is charged to that link on both.
4. A cause can shorten a rank's idle (the slow stage itself never waits: imbalance has a
   negative Shapley value there). Categories are reported >= 0: negative values are set to
   0 and the positive ones scaled to the measured idle (largest-remainder rounding, so the
   categories sum to the measured idle to the nanosecond). Signed values stay in the JSON.
5. Blame: within a rank's imbalance share, each stage is weighted by how much balancing
   that stage alone shortens the rank's idle; within the comm share, each link (src->dst)
   by the sum of its two extreme marginal values: how much freeing that link alone shortens
   the rank's idle (the link freed last) and how much that link alone, every other link of
   its pipeline free, lengthens it (freed first). Either one alone goes wrong where links
   are many and alike: with every link of a p=8 pipeline equally slow, freeing any one
   shortens the step by 0.2-0.9 ms of the 53 ms that freeing all does (the critical path
   moves to the next link's messages), so which link got the blame was decided by the
   jitter of a few kernels; the link alone costs ~23 ms each. The sum is what Shapley's
   average over orders weighs from its first and last positions: exact for two links and
   for links whose costs add up, and equal for links that are alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.replay import (
    Replay,
    Scenario,
    StepGraph,
    critical_path,
    replay_many,
    replay_steps,
    step_graphs,
)
from tracekit.model.groups import split_by
from tracekit.model.run import Run
from tracekit.reconstruct.schedule import TERAPIPE_NAME
from tracekit.schemas.analysis import PathStepDoc
from tracekit.vocab import CATEGORIES, IDLE_CAUSES

# The causes a replay switches off (tracekit.vocab's "removable" ones), the players of the
# Shapley values; :func:`_scenario` says how each is switched off.
CAUSES = tuple(c.key for c in IDLE_CAUSES if c.kind == "removable")
Coalition = frozenset[str]  # the causes present in one replay
# Blame replays one stage (or link) at a time: on big pipelines only the stages with the
# most excess work (links with the most latency) are replayed; the rest share by that amount.
MAX_BLAME_REPLAYS = 32
ATTRIBUTION_COLUMNS = ["rank", "step", "idle_ns", *[f"{c}_ns" for c in CATEGORIES]]


@dataclass
class StepAttribution:
    step: int
    table: pd.DataFrame  # one row per rank: idle and each category
    signed_shapley: dict[int, dict[str, float]]  # rank -> cause -> signed Shapley value (ns)
    stage_blame: pd.DataFrame  # rank, stage, imbalance_ns
    link_blame: pd.DataFrame  # rank, src_rank, dst_rank, comm_ns
    critical_path: list[PathStepDoc]
    replay_makespan_ns: int
    measured_makespan_ns: int
    ideal_makespan_ns: int  # all causes removed
    ideal_idle_ns: dict[int, int]  # rank -> idle with all causes removed
    notes: list[str] = field(default_factory=list)

    @property
    def residual_ns(self) -> int:
        return self.measured_makespan_ns - self.replay_makespan_ns


@dataclass
class Attribution:
    steps: list[StepAttribution]
    graphs: dict[int, StepGraph] = field(default_factory=dict)  # the measured step graphs

    @property
    def table(self) -> pd.DataFrame:
        return (
            pd.concat([s.table for s in self.steps], ignore_index=True)
            if self.steps
            else pd.DataFrame(columns=ATTRIBUTION_COLUMNS)
        )

    def rank_causes_ns(self, ranks: Iterable[int]) -> dict[int, dict[str, int]]:
        """Each of ``ranks``' idle by cause (key -> ns), summed over the steps: a rank with no
        row has every cause 0; empty where no step was attributed."""
        table = self.table
        if not len(table):
            return {}
        # One groupby, not a filter of the whole table per rank (quadratic in ranks).
        sums = table.groupby("rank")[[c.column for c in IDLE_CAUSES]].sum()
        found = {int(r): [int(ns) for ns in row] for r, row in zip(sums.index.tolist(), sums.to_numpy().tolist())}
        none = [0] * len(IDLE_CAUSES)
        return {rank: {c.key: ns for c, ns in zip(IDLE_CAUSES, found.get(rank, none))} for rank in ranks}

    @property
    def stage_blame(self) -> pd.DataFrame:
        frames = [s.stage_blame.assign(step=s.step) for s in self.steps if len(s.stage_blame)]
        return (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=["rank", "stage", "imbalance_ns", "step"])
        )

    @property
    def link_blame(self) -> pd.DataFrame:
        frames = [s.link_blame.assign(step=s.step) for s in self.steps if len(s.link_blame)]
        return (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=["rank", "src_rank", "dst_rank", "comm_ns", "step"])
        )


def apportion(total: int, weights: Sequence[float] | np.ndarray) -> list[int]:
    """Split integer ``total`` in proportion to non-negative ``weights``; the parts are
    integers that sum to ``total`` exactly (largest remainder). All-zero weights put
    everything on the last part."""
    return [int(x) for x in _apportioned_rows(np.array([total]), np.asarray(weights, dtype=float).reshape(1, -1))[0]]


def _apportioned_rows(totals: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`_apportioned` of each row: ``totals[i]`` over ``weights[i]`` (rows x parts),
    the same sums and roundings row by row."""
    w = np.clip(np.asarray(weights, dtype=float), 0.0, None)
    totals = np.asarray(totals, dtype=np.int64)
    out = np.zeros(w.shape, dtype=np.int64)
    if not w.size:  # no rows, or no parts to share among (a step with no links)
        return out
    sums = w.sum(axis=1)
    positive = totals > 0
    zero = positive & (sums <= 0)
    out[zero, -1] = totals[zero]
    rows = np.flatnonzero(positive & (sums > 0))
    exact = w[rows] / sums[rows][:, None] * totals[rows][:, None]
    floors = np.asarray(np.floor(exact), dtype=np.int64)
    remainder = totals[rows] - floors.sum(axis=1)
    order = np.argsort(-(exact - floors), axis=1, kind="stable")
    place = np.empty_like(order)  # each part's place in its row's order
    np.put_along_axis(place, order, np.broadcast_to(np.arange(w.shape[1]), order.shape), axis=1)
    out[rows] = floors + (place < remainder[:, None])
    return out


def shapley(
    values: dict[Coalition, dict[int, int]], players: tuple[str, ...], ranks: Sequence[int]
) -> dict[int, dict[str, float]]:
    """Exact Shapley values per rank from the value of every coalition of present causes."""
    from math import factorial

    n = len(players)
    ranks = [int(r) for r in ranks]
    # all ranks at once: the same sums in the same order as rank by rank
    table = {c: np.array([v[r] for r in ranks], dtype=np.int64) for c, v in values.items()}
    out: dict[int, dict[str, float]] = {r: {} for r in ranks}
    for player in players:
        others = [q for q in players if q != player]
        total = np.zeros(len(ranks))
        for size in range(n):
            weight = factorial(size) * factorial(n - size - 1) / factorial(n)
            for coalition in combinations(others, size):
                total += weight * (table[frozenset(coalition) | {player}] - table[frozenset(coalition)])
        for r, value in zip(ranks, total.tolist()):
            out[r][player] = value
    return out


def _scenario(graph: StepGraph, balanced: np.ndarray, present: Coalition) -> Scenario:
    dur = graph.dur if "imbalance" in present else balanced
    lat = graph.edge_lat if "comm" in present else np.zeros_like(graph.edge_lat)
    xfer = graph.edge_xfer if "comm" in present else np.zeros_like(graph.edge_xfer)
    ovh = graph.ovh if "overhead" in present else np.zeros_like(graph.ovh)
    return Scenario(dur=dur, ovh=ovh, lat=lat, xfer=xfer)


@dataclass
class _StepReplays:
    """What a step's attribution replays (every scenario at once), and how to read them back."""

    ranks: list[int]
    codes: np.ndarray  # each action's rank, as a column
    balanced: np.ndarray
    coalitions: list[Coalition]
    every: list[Scenario]  # the coalitions', then the stage and link blame replays
    by_excess: list[int]
    n_stages: int
    link_latency: dict[tuple[int, int], int]
    by_latency: list[tuple[int, int]]
    link_base: list[int]  # per replayed link: its pipeline's all-links-free replay (a position in link_groups)
    link_groups: list[int]  # the pipelines (groups of linked ranks) of the replayed links


def attribute_step(graph: StepGraph, measured_idle: dict[int, int], measured_makespan: int) -> StepAttribution:
    """Attribute one step's idle per rank (``measured_idle`` from the bubble table)."""
    plan = _step_replays(graph)
    # Every replay of the step at once (replay_many walks the graph a single time).
    return _attributed(graph, plan, replay_many(graph, plan.every), measured_idle, measured_makespan)


def _step_replays(graph: StepGraph) -> _StepReplays:
    ranks = [int(r) for r in graph.ranks]
    # Per rank work below must not loop over ranks: with thousands of them each rank's figures
    # are a row (or column) of a scenario x rank or key x rank matrix, laid out once.
    codes = np.searchsorted(graph.ranks, graph.rank)  # each action's rank, as a column
    balanced = graph.balanced_durations()
    coalitions = [frozenset(c) for size in range(len(CAUSES) + 1) for c in combinations(CAUSES, size)]
    scenarios = [_scenario(graph, balanced, present) for present in coalitions]
    by_excess = _stages_by_excess(graph, balanced)
    stage_scenarios = [
        Scenario(dur=np.where(graph.stage == s, balanced, graph.dur)) for s in by_excess[:MAX_BLAME_REPLAYS]
    ]
    link_latency = _link_latency(graph)
    by_latency = sorted(link_latency, key=lambda link: -link_latency[link])
    replayed = by_latency[:MAX_BLAME_REPLAYS]
    group = _linked_groups(list(link_latency))
    link_groups = sorted({group[src] for src, _ in replayed})
    link_base = [link_groups.index(group[src]) for src, _ in replayed]
    edge_group = _edge_groups(graph, group)
    link_scenarios = [_link_freed(graph, link) for link in replayed]
    link_scenarios += [_link_alone(graph, link, edge_group == group[link[0]]) for link in replayed]
    link_scenarios += [_links_free(graph, edge_group == g) for g in link_groups]
    return _StepReplays(
        ranks,
        codes,
        balanced,
        coalitions,
        scenarios + stage_scenarios + link_scenarios,
        by_excess,
        len(stage_scenarios),
        link_latency,
        by_latency,
        link_base,
        link_groups,
    )


def _attributed(
    graph: StepGraph, plan: _StepReplays, replayed: list[Replay], measured_idle: dict[int, int], measured_makespan: int
) -> StepAttribution:
    """The step's attribution from its replays (those of ``plan.every``, in order)."""
    ranks, codes, balanced, coalitions, every = plan.ranks, plan.codes, plan.balanced, plan.coalitions, plan.every
    by_excess, by_latency, link_latency = plan.by_excess, plan.by_latency, plan.link_latency
    idle = _idle_rows(graph, codes, len(ranks), replayed, [s.dur for s in every])
    results: dict[Coalition, Replay] = dict(zip(coalitions, replayed))
    values = {present: dict(zip(ranks, idle[k].tolist())) for k, present in enumerate(coalitions)}
    full, none = frozenset(CAUSES), Coalition()
    full_idle = idle[coalitions.index(full)]
    signed = shapley(values, CAUSES, ranks)
    ideal = results[none]
    n_coalitions, n_stages = len(coalitions), plan.n_stages
    stage_gain = _gains(by_excess, full_idle - idle[n_coalitions : n_coalitions + n_stages])
    link_gain = _gains(by_latency[:MAX_BLAME_REPLAYS], _link_gains(plan, full_idle, idle[n_coalitions + n_stages :]))
    ideal_windows = graph.window_ns(ideal)
    measured = np.array([measured_idle[r] for r in ranks], dtype=np.int64)
    window_start = np.array([graph.rank_start.get(r, graph.t0) if graph.rank_start else graph.t0 for r in ranks])
    window_end = window_start + np.array([ideal_windows[r] for r in ranks], dtype=np.int64)
    schedule_idle = _schedule_idle(graph, ideal, codes, window_start.astype(np.int64), window_end)
    raw = _cause_idle(schedule_idle, signed, ranks, measured - full_idle)
    parts = _apportioned_rows(measured, np.column_stack([raw[c] for c in CATEGORIES]).astype(float))
    rows = [(r, graph.step, idle_ns, *shares) for r, idle_ns, shares in zip(ranks, measured.tolist(), parts.tolist())]
    table = pd.DataFrame(rows, columns=ATTRIBUTION_COLUMNS)
    by_cause = dict(zip(CATEGORIES, parts.T))
    stage_blame = _stage_blame(graph, balanced, ranks, by_cause["imbalance"], stage_gain)
    link_blame = _link_blame(ranks, by_cause["comm"], link_latency, link_gain)
    full_result = results[full]
    return StepAttribution(
        step=graph.step,
        table=table,
        signed_shapley=signed,
        stage_blame=stage_blame,
        link_blame=link_blame,
        critical_path=critical_path(graph, full_result),
        replay_makespan_ns=_makespan(graph, full_result),
        measured_makespan_ns=measured_makespan,
        ideal_makespan_ns=_makespan(graph, ideal),
        ideal_idle_ns=dict(values[none]),
        notes=list(graph.notes),
    )


def _cause_idle(
    schedule_idle: dict[str, np.ndarray],
    signed: dict[int, dict[str, float]],
    ranks: list[int],
    residual_ns: np.ndarray,
) -> dict[str, np.ndarray]:
    """Each cause's idle per rank (``ranks``), before it is made >= 0 and summed to the
    measured idle: the schedule's own from the all-causes-removed replay, each removable
    cause's signed Shapley value, and the replay's residual (measured minus replayed idle)
    folded into overhead."""
    raw: dict[str, np.ndarray] = dict(schedule_idle)
    raw.update({c: np.array([signed[r][c] for r in ranks]) for c in CAUSES})
    raw["overhead"] = raw["overhead"] + residual_ns
    missing = set(CATEGORIES) - set(raw)
    if missing:  # a cause registered in tracekit.vocab without its computation here
        raise KeyError(f"no attribution computes {sorted(missing)}")
    return raw


def _stage_blame(
    graph: StepGraph, balanced: np.ndarray, ranks: list[int], imbalance_ns: np.ndarray, gain: _Gains
) -> pd.DataFrame:
    """Each rank's imbalance share over the stages, by how much balancing each alone
    shortens the rank's idle (by each stage's excess work where none does)."""
    stages = gain.keys
    weights = np.ascontiguousarray(np.maximum(gain.gain, 0).astype(float).T)  # rank x stage
    fallback = np.array([_excess_work(graph, balanced, s) for s in stages], dtype=float)
    none_helps = ~(weights.sum(axis=1) > 0)
    weights[none_helps] = fallback
    shares = _apportioned_rows(imbalance_ns, weights)
    row, column = np.nonzero(shares)
    rows = list(zip(np.array(ranks)[row].tolist(), np.array(stages)[column].tolist(), shares[row, column].tolist()))
    return pd.DataFrame(rows, columns=["rank", "stage", "imbalance_ns"])


def _link_blame(
    ranks: list[int], comm_ns: np.ndarray, link_latency: dict[tuple[int, int], int], gain: _Gains
) -> pd.DataFrame:
    """Each rank's comm share over links: the replayed links by their gains (module doc, 5),
    and the links of its pipeline replica past ``MAX_BLAME_REPLAYS`` by latency, at the gain
    per ns of latency the replayed links of that replica show for the rank (so that a
    pipeline of more links than are replayed lists every one). A rank none of them helps
    shares its comm among the links of its own pipeline replica by latency, not among every
    link of the job (with thousands of ranks that was a row per rank and link, and blamed
    links the rank never used); with no latency there either, by the rule of apportion over
    every link."""
    links = sorted(link_latency)  # every link of the step; gain holds the replayed ones
    position = {link: k for k, link in enumerate(links)}
    replayed = np.array([position[link] for link in gain.keys], dtype=np.int64)
    weights = np.ascontiguousarray(np.maximum(gain.gain, 0).astype(float).T)  # rank x replayed link
    latency = np.array([link_latency[link] for link in links], dtype=float)
    group = _linked_groups(links)
    link_group = np.array([group[src] for src, _ in links], dtype=np.int64)
    # Per rank with comm: its candidate links (positions in ``links``) and their shares.
    blamed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rank rows, candidates, shares)
    has_comm = comm_ns != 0
    helped = has_comm & (weights.sum(axis=1) > 0)
    rank_group = np.array([group.get(r, -1) for r in ranks], dtype=np.int64)
    of_group = split_by(link_group, np.arange(len(links)))
    is_replayed = np.zeros(len(links), dtype=bool)
    is_replayed[replayed] = True
    helped_rows = np.flatnonzero(helped)
    for g, rows in split_by(rank_group[helped_rows], helped_rows).items():
        unreplayed = of_group.get(g, np.zeros(0, dtype=np.int64))
        unreplayed = unreplayed[~is_replayed[unreplayed]]
        mine = link_group[replayed] == g
        replica_latency = latency[replayed[mine]].sum()
        rate = weights[rows][:, mine].sum(axis=1) / replica_latency if replica_latency > 0 else np.zeros(len(rows))
        matrix = np.hstack((weights[rows], rate[:, None] * latency[unreplayed][None, :]))
        blamed.append((rows, np.concatenate((replayed, unreplayed)), _apportioned_rows(comm_ns[rows], matrix)))
    rest = np.flatnonzero(has_comm & ~helped)
    # Replicas of one pipeline have as many links each: their ranks share one matrix of
    # (rank, its replica's links), a row each.
    by_count: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for g, rows in split_by(rank_group[rest], rest).items():
        candidates = of_group.get(g, np.zeros(0, dtype=np.int64))
        if latency[candidates].sum() <= 0:  # no latency anywhere near: the rule of apportion, all links
            candidates = np.arange(len(links))
            blamed.append((rows, candidates, _apportioned_rows(comm_ns[rows], np.zeros((len(rows), len(links))))))
        else:
            by_count.setdefault(len(candidates), []).append((rows, candidates))
    for same in by_count.values():
        rows = np.concatenate([r for r, _ in same])
        candidates = np.concatenate([np.tile(c, (len(r), 1)) for r, c in same])
        shares = _apportioned_rows(comm_ns[rows], latency[candidates])
        row, column = np.nonzero(shares)
        blamed.append((rows[row], candidates[row, column], shares[row, column]))
    rank_rows, link_at, parts = [], [], []
    for rows, candidates, shares in blamed:
        if shares.ndim == 1:  # already one entry per (rank, link) share
            rank_rows.append(rows)
            link_at.append(candidates)
            parts.append(shares)
            continue
        row, column = np.nonzero(shares)
        rank_rows.append(rows[row])
        link_at.append(candidates[column])
        parts.append(shares[row, column])
    rank_row, link, share = (
        np.concatenate(a) if a else np.zeros(0, dtype=np.int64) for a in (rank_rows, link_at, parts)
    )
    order = np.argsort(rank_row, kind="stable")  # rank by rank, each one's links in candidate order
    pairs = np.array(links, dtype=np.int64).reshape(-1, 2)[link[order]]
    blame = list(zip(np.array(ranks)[rank_row[order]].tolist(), *pairs.T.tolist(), share[order].tolist()))
    return pd.DataFrame(blame, columns=["rank", "src_rank", "dst_rank", "comm_ns"])


def _idle_rows(
    graph: StepGraph, codes: np.ndarray, n_ranks: int, results: list[Replay], durations: list[np.ndarray | None]
) -> np.ndarray:
    """:func:`~tracekit.analyze.replay.idle_per_rank` of each replay (rows) for each rank
    (columns, ranks sorted): window minus the busy time at that replay's durations."""
    order = np.argsort(codes, kind="stable")
    first = np.searchsorted(codes[order], np.arange(n_ranks))
    dur = np.stack([graph.dur if d is None else np.asarray(d, dtype=np.int64) for d in durations]).astype(np.int64)
    busy = np.add.reduceat(dur[:, order], first, axis=1)
    ends = np.stack([r.end for r in results])
    if graph.rank_start is None:
        window = (ends.max(axis=1) - graph.t0)[:, None] if ends.shape[1] else np.zeros((len(results), 1), np.int64)
    else:
        origin = np.array([graph.rank_start.get(int(r), graph.t0) for r in graph.ranks], dtype=np.int64)
        window = np.maximum.reduceat(ends[:, order], first, axis=1) - origin
    return np.asarray(window - busy, dtype=np.int64)


def _makespan(graph: StepGraph, result: Replay) -> int:
    """The replayed step's length: t0 to its last end; with per-rank windows (flush-free)
    the longest rank window, as the bubble table's ``window_ns`` is then per rank."""
    return max(graph.window_ns(result).values(), default=0)


def _linked_groups(links: list[tuple[int, int]]) -> dict[int, int]:
    """Each rank on a link -> the smallest rank it is connected to through links (its
    replica, where replicas exchange no P2P messages)."""
    parent: dict[int, int] = {}

    def root(r: int) -> int:
        while parent.setdefault(r, r) != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for src, dst in links:
        a, b = root(src), root(dst)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {r: root(r) for r in list(parent)}


def _schedule_idle(
    graph: StepGraph, ideal: Replay, codes: np.ndarray, window_start: np.ndarray, window_end: np.ndarray
) -> dict[str, np.ndarray]:
    """Split each rank's idle (``codes``: each action's rank, a column of the window arrays)
    in the all-causes-removed replay, over its window [window_start, window_end], by
    pipeline phase: warmup is idle before its first backward (the pipeline filling), drain
    is idle after its last forward (emptying), schedule gaps are idle in between
    (steady-state holes of interleaved and zero-bubble schedules).
    In a flush-free pipeline a step after the pipeline's first starts in steady state, so
    its schedule idle is ~0; the pipeline's first step (where recorded) holds the fill.
    Returns each rank's idle keyed by cause."""
    n_ranks = len(window_start)
    order = np.lexsort((ideal.start, codes))  # rank by rank, by replayed start (ties: position)
    rank, starts, ends = codes[order], ideal.start[order], ideal.end[order]
    kinds = graph.kind[order]
    backward = np.isin(kinds, ("B", "I"))
    forward = np.isin(kinds, ("F",))
    first_bwd = np.full(n_ranks, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_bwd, rank[backward], starts[backward])
    first_bwd = np.where(np.bincount(rank[backward], minlength=n_ranks) > 0, first_bwd, window_end)
    last_fwd = np.full(n_ranks, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_fwd, rank[forward], ends[forward])
    last_fwd = np.where(np.bincount(rank[forward], minlength=n_ranks) > 0, last_fwd, window_start)
    drain_from = np.maximum(last_fwd, first_bwd)
    # Each rank's holes: window start to its first start, each end to the next start, its
    # last end to the window's end.
    opens = np.ones(len(rank), dtype=bool)
    opens[1:] = rank[1:] != rank[:-1]
    closes = np.append(opens[1:], True)
    before = np.where(opens, window_start[rank], np.roll(ends, 1))
    hole_rank = np.concatenate((rank, rank[closes]))
    lo = np.concatenate((before, ends[closes]))
    hi = np.concatenate((starts, window_end[rank[closes]]))
    real = hi > lo
    hole_rank, lo, hi = hole_rank[real], lo[real], hi[real]
    in_warmup = np.maximum(0, np.minimum(hi, first_bwd[hole_rank]) - lo)
    in_drain = np.maximum(0, hi - np.maximum(lo, drain_from[hole_rank]))
    idle = {c: np.zeros(n_ranks, dtype=np.int64) for c in ("warmup", "drain", "schedule_gaps")}
    np.add.at(idle["warmup"], hole_rank, in_warmup)
    np.add.at(idle["drain"], hole_rank, in_drain)
    np.add.at(idle["schedule_gaps"], hole_rank, (hi - lo) - in_warmup - in_drain)
    return idle


def _stages_by_excess(graph: StepGraph, balanced: np.ndarray) -> list[int]:
    """The stages, most excess work first (blame replays the first MAX_BLAME_REPLAYS)."""
    return sorted((int(s) for s in np.unique(graph.stage)), key=lambda s: -_excess_work(graph, balanced, s))


def _on_link(graph: StepGraph, link: tuple[int, int]) -> np.ndarray:
    """Which edges carry the link (src rank, dst rank)."""
    return np.asarray((graph.rank[graph.edge_src] == link[0]) & (graph.rank[graph.edge_dst] == link[1]))


def _links_free(graph: StepGraph, free: np.ndarray) -> Scenario:
    """The measured step with the edges ``free`` (a mask) costing nothing."""
    return Scenario(lat=np.where(free, 0, graph.edge_lat), xfer=np.where(free, 0, graph.edge_xfer))


def _link_freed(graph: StepGraph, link: tuple[int, int]) -> Scenario:
    """The measured step with one link (src rank, dst rank) free."""
    return _links_free(graph, _on_link(graph, link))


def _link_alone(graph: StepGraph, link: tuple[int, int], pipeline: np.ndarray) -> Scenario:
    """The measured step with every other link of its pipeline (``pipeline``: its edges, a
    mask) free: what that link alone costs. Other pipelines' links keep their cost, so that a
    replica's ranks, which share the step window, are not told the link is theirs."""
    return _links_free(graph, pipeline & ~_on_link(graph, link))


def _edge_groups(graph: StepGraph, group: dict[int, int]) -> np.ndarray:
    """Each edge's pipeline: the group (:func:`_linked_groups`) of its producer's rank."""
    ranks = np.array(sorted(group), dtype=np.int64)
    roots = np.array([group[r] for r in ranks.tolist()], dtype=np.int64)
    if not len(ranks):
        return np.zeros(len(graph.edge_src), dtype=np.int64)
    return np.asarray(roots[np.searchsorted(ranks, graph.rank[graph.edge_src])])


def _link_gains(plan: _StepReplays, full_idle: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """Per replayed link (rows, by latency) and rank: how much freeing it alone shortens the
    rank's idle plus how much it alone (its pipeline's other links free) lengthens it.
    ``idle``: the link replays' idle rows (freed, alone, then each pipeline all free)."""
    n = len(plan.link_base)
    freed, alone, bases = idle[:n], idle[n : 2 * n], idle[2 * n :]
    return np.asarray((full_idle - freed) + (alone - bases[plan.link_base]), dtype=np.int64)


@dataclass
class _Gains:
    """Per stage (or link), in sorted order: how much each rank's idle (columns: the
    step's ranks, sorted) shrinks when only that stage is balanced (that link free)."""

    keys: list[Any]
    gain: np.ndarray  # len(keys) x ranks, int64


def _gains(keys: list[Any], gain: np.ndarray) -> _Gains:
    """The gains of ``keys`` (rows in sorted key order): the first ones', in order, as
    replayed (``gain``: one row each, how much each rank's idle shrank); the rest, not
    replayed, gain 0."""
    ordered = sorted(keys)
    row = {key: k for k, key in enumerate(ordered)}
    out = np.zeros((len(ordered), gain.shape[1]), dtype=np.int64)
    for key, shrank in zip(keys, gain):
        out[row[key]] = shrank
    return _Gains(ordered, out)


def _link_latency(graph: StepGraph) -> dict[tuple[int, int], int]:
    """Total measured latency of each link (src rank, dst rank) in the step, the links in
    the order of their first edge."""
    pairs = np.stack([graph.rank[graph.edge_src], graph.rank[graph.edge_dst]], axis=1).astype(np.int64)
    links, first, inverse = np.unique(pairs.reshape(-1, 2), axis=0, return_index=True, return_inverse=True)
    total = np.zeros(len(links), dtype=np.int64)
    np.add.at(total, inverse.reshape(-1), np.asarray(graph.edge_lat, dtype=np.int64) + graph.edge_xfer)
    return {(int(links[k, 0]), int(links[k, 1])): int(total[k]) for k in np.argsort(first, kind="stable").tolist()}


def _excess_work(graph: StepGraph, balanced: np.ndarray, stage: int) -> float:
    on = graph.stage == stage
    return float(max(0, int(graph.dur[on].sum() - balanced[on].sum())))


def attribute(run: Run, bubbles: pd.DataFrame, progress: Callable[[str], None] | None = None) -> Attribution:
    """Attribute every pipeline step of the run (a flush-free one over its per-rank
    windows, those of ``bubbles``); ``progress`` is told each step as its replays start."""
    steps = []
    flush_free = run.schedule is not None and run.schedule.flush_free
    graphs = step_graphs(run, bubbles[["rank", "step", "window_start_ns"]] if flush_free else None)
    if run.schedule is not None and run.schedule.name == TERAPIPE_NAME:
        # token slices cost more by design: that spread is the workload's, not a stage's
        # (reported on its own by tracekit.analyze.slices), so balancing keeps it
        for graph in graphs.values():
            graph.balance_by_microbatch = True
    in_order = list(graphs.values())

    def scenarios() -> Iterator[tuple[StepGraph, list[Scenario], tuple[StepGraph, _StepReplays]]]:
        for graph in in_order:  # made as replay_steps asks, used as its walks end
            plan = _step_replays(graph)
            yield graph, plan.every, (graph, plan)

    def announce(group: list[int]) -> None:  # each walk of replay_steps: one step, or several side by side
        if progress:
            first, last = in_order[group[0]].step, in_order[group[-1]].step
            which = f"step {first}" if len(group) == 1 else f"steps {first}-{last}"
            places = f"{group[0] + 1}" if len(group) == 1 else f"{group[0] + 1}-{group[-1] + 1}"
            actions = sum(len(in_order[i].action_id) for i in group)
            progress(f"attribution: replaying {which} ({places} of {len(in_order)}, {actions:,} actions)")

    for (graph, plan), replays in replay_steps(scenarios(), on_walk=announce):
        rows = bubbles[bubbles["step"] == graph.step]
        measured_idle = {int(r): int(i) for r, i in zip(rows["rank"], rows["idle_ns"])}
        # the replay's step runs over the step's whole window: a flushed step's ranks may have
        # windows split where steps overlap (bubbles.rank_windows), a flush-free one per-rank ones
        if flush_free or not len(rows):
            measured_makespan = int(rows["window_ns"].max()) if len(rows) else 0
        else:
            measured_makespan = int(rows["window_end_ns"].max() - rows["window_start_ns"].min())
        steps.append(_attributed(graph, plan, replays, measured_idle, measured_makespan))
    return Attribution(steps, graphs)
