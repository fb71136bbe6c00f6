"""Roll-ups across data-parallel replicas: what a person reads when a run has hundreds of ranks.

A job of p pipeline ranks times R data-parallel replicas has p*R ranks, and a table of them is
unreadable past a few dozen rows. Replicas run the same stages, so the figures are summarised
per *place* in the pipeline (a rank's position in its replica, which fixes the stages it runs),
over the replicas: min, median and max of each rank's bubble ratio, idle per step and compute
per step, with the replica at the worst end named; then every rank ordered by bubble ratio, the
worst first. The figures summarised are the per-rank ones of :class:`RunSummary`, so each
min/median/max is one of (or the middle of) the per-rank figures the JSON lists.

Patterns across replicas compare like with like: a place's compute per step in one replica
against the same place in the other replicas (a slow host shows as a replica slower on every
stage, a slow GPU as one rank slower than its peers), and each replica's places against each
other (a stage slowest in every replica is the model split, not a host). Identical replicas
show no pattern.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from tracekit.analyze.shares import share
from tracekit.vocab import CATEGORIES

if TYPE_CHECKING:  # the package imports this module
    from tracekit.analyze import Analysis
    from tracekit.model.layout import Layout
    from tracekit.schemas.analysis import (
        PlaceDoc,
        RollupDoc,
        SlowestEverywhereDoc,
        SlowRankDoc,
        SlowReplicaDoc,
        SpreadDoc,
        SpreadNsDoc,
    )

# A place's compute at least this much above the other replicas' median at the same place is slow.
SLOW_FACTOR = 1.05
# A place whose compute is at least this much above the other places' median in every replica
# is the slowest stage everywhere.
SLOWEST_PLACE_FACTOR = 1.10
# Slow ranks named per replica (the rest are counted).
MAX_SLOW_RANKS = 3
# Replicas whose timelines the report keeps (each a few hundred glyphs per step): the rest are
# in its heat map and distributions only.
MAX_TIMELINE_REPLICAS = 6


@dataclass(frozen=True)
class Spread:
    """Min, median and max of one figure over the replicas (or over every rank)."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(float(min(values)), float(statistics.median(values)), float(max(values)))

    def to_dict(self) -> SpreadDoc:
        return {"min": round(self.min, 6), "median": round(self.median, 6), "max": round(self.max, 6)}

    def to_ns_dict(self) -> SpreadNsDoc:
        """A spread of times: whole ns."""
        return {"min": int(round(self.min)), "median": int(round(self.median)), "max": int(round(self.max))}


@dataclass(frozen=True)
class PlaceRollup:
    """One place in the pipeline (the same stages in every replica), over the replicas."""

    place: int  # the rank's position in its replica, 0 first
    stages: list[int]  # the stages the rank at this place runs (as in the first replica)
    ranks: list[int]  # the rank at this place in each replica, replica order
    bubble_ratio: Spread
    idle_per_step_ns: Spread
    busy_per_step_ns: Spread
    worst_replica: int  # highest bubble ratio (ties: the first replica)
    worst_rank: int
    slowest_replica: int  # most compute per step (ties: the first replica)
    causes_ns: dict[str, int]  # idle by cause at this place, summed over replicas and steps
    top_cause: str | None  # the cause with the most idle here (None without attribution)
    tp_rank: int | None = None  # the ranks' tensor-parallel rank, where the layout has TP

    def to_dict(self) -> PlaceDoc:
        out: PlaceDoc = {
            "place": self.place,
            "stages": list(self.stages),
            "ranks": list(self.ranks),
            "bubble_ratio": self.bubble_ratio.to_dict(),
            "idle_per_step_ns": self.idle_per_step_ns.to_ns_dict(),
            "busy_per_step_ns": self.busy_per_step_ns.to_ns_dict(),
            "worst_replica": self.worst_replica,
            "worst_rank": self.worst_rank,
            "slowest_replica": self.slowest_replica,
            "causes_ns": dict(self.causes_ns),
            "top_cause": self.top_cause,
        }
        return out if self.tp_rank is None else {"tp_rank": self.tp_rank, **out}  # tp_rank first


@dataclass(frozen=True)
class SlowRank:
    """A rank computing more per step than the same place in the other replicas."""

    rank: int
    replica: int
    place: int
    stages: list[int]
    busy_per_step_ns: int
    others_median_ns: int  # the same place in the other replicas, median
    slowdown: float  # busy_per_step_ns / others_median_ns

    def to_dict(self) -> SlowRankDoc:
        return {
            "rank": self.rank,
            "replica": self.replica,
            "place": self.place,
            "stages": list(self.stages),
            "busy_per_step_ns": self.busy_per_step_ns,
            "others_median_ns": self.others_median_ns,
            "slowdown": round(self.slowdown, 4),
        }


@dataclass(frozen=True)
class SlowReplica:
    """A replica whose ranks are slower than the other replicas' (every place, or some).

    ``every_place``: slower at every place (a slow host or node: ``min_slowdown`` is the
    least of its places' slowdowns); else ``ranks`` are the slow ones (a slow GPU). The cost
    is the replica's step length over the others' median (``excess_per_step_ns``): the step
    windows are global, so every rank's window is that much longer (each slow replica
    counted as if it were the only one)."""

    replica: int
    replica_ranks: list[int]
    every_place: bool
    min_slowdown: float
    median_slowdown: float
    ranks: list[SlowRank]  # the slow ones, slowest first
    excess_per_step_ns: int
    cost_share: float

    def to_dict(self) -> SlowReplicaDoc:
        return {
            "replica": self.replica,
            "replica_ranks": list(self.replica_ranks),
            "every_place": self.every_place,
            "min_slowdown": round(self.min_slowdown, 4),
            "median_slowdown": round(self.median_slowdown, 4),
            "ranks": [r.to_dict() for r in self.ranks],
            "excess_per_step_ns": self.excess_per_step_ns,
            "cost_share": round(self.cost_share, 4),
        }


@dataclass(frozen=True)
class SlowestEverywhere:
    """The place that computes the most in every replica (the split, not a host)."""

    place: int
    stages: list[int]
    ranks: list[int]
    min_ratio: float  # over replicas: its compute over the other places' median in that replica
    median_ratio: float

    def to_dict(self) -> SlowestEverywhereDoc:
        return {
            "place": self.place,
            "stages": list(self.stages),
            "ranks": list(self.ranks),
            "min_ratio": round(self.min_ratio, 4),
            "median_ratio": round(self.median_ratio, 4),
        }


@dataclass
class ReplicaRollup:
    """The run's ranks summarised per place over the replicas, and the patterns across them."""

    replicas: list[list[int]]  # ranks of each replica (one group for a single pipeline or a plain run)
    n_steps: int
    bubble_ratio: Spread  # over every rank
    places: list[PlaceRollup]  # pipeline runs only
    ranks_by_bubble: list[int]  # every rank, highest bubble ratio first (ties: lower rank first)
    slow_replicas: list[SlowReplica] = field(default_factory=list)
    slowest_everywhere: SlowestEverywhere | None = None
    replica_step_ns: dict[int, int] = field(default_factory=dict)  # replica: median step length
    replica_bubble: dict[int, float] = field(default_factory=dict)  # replica: idle over window, its ranks
    # The replicas worth a timeline, each with why, the slowest (the one the others wait for) first.
    timeline_replicas: list[tuple[int, str]] = field(default_factory=list)

    @property
    def n_replicas(self) -> int:
        return len(self.replicas)

    def replica_of(self, rank: int) -> int:
        return next((i for i, group in enumerate(self.replicas) if rank in group), -1)

    def to_dict(self) -> RollupDoc:
        return {
            "n_replicas": self.n_replicas,
            "replicas": [list(g) for g in self.replicas],
            "n_steps": self.n_steps,
            "slow_factor": SLOW_FACTOR,
            "bubble_ratio": self.bubble_ratio.to_dict(),
            "places": [p.to_dict() for p in self.places],
            "ranks_by_bubble": list(self.ranks_by_bubble),
            "replica_step_ns": {str(k): v for k, v in sorted(self.replica_step_ns.items())},
            "replica_bubble": {str(k): round(v, 6) for k, v in sorted(self.replica_bubble.items())},
            "timeline_replicas": [{"replica": r, "why": why} for r, why in self.timeline_replicas],
            "patterns": {
                "slow_replicas": [s.to_dict() for s in self.slow_replicas],
                "slowest_everywhere": self.slowest_everywhere.to_dict() if self.slowest_everywhere else None,
            },
        }


def rollup(analysis: Analysis) -> ReplicaRollup | None:
    """The roll-up of ``analysis`` (None for a run with no measured rank)."""
    per_rank = analysis.summary.per_rank
    if not per_rank:
        return None
    n_steps = max(int(analysis.bubbles["step"].nunique()), 1)
    ratio = {r: s.bubble_ratio for r, s in per_rank.items()}
    order = sorted(per_rank, key=lambda r: (-ratio[r], r))
    everyone = Spread.of(list(ratio.values()))
    run = analysis.run
    if not analysis.is_pipeline or run.schedule is None:
        return ReplicaRollup([sorted(per_rank)], n_steps, everyone, [], order)
    layout = run.layout
    # data-parallel replicas: tensor-parallel shards of one stage are one replica's, never two
    replicas = layout.replicas if layout is not None and layout.is_3d else run.schedule.pipelines
    groups = [[r for r in g if r in per_rank] for g in replicas]
    groups = [g for g in groups if g] or [sorted(per_rank)]
    causes = _rank_causes(analysis)
    stages: dict[int, list[int]] = {}
    pairs = run.actions[["rank", "stage"]].drop_duplicates().sort_values(["rank", "stage"])
    for rank, stage in zip(pairs["rank"].tolist(), pairs["stage"].tolist()):
        stages.setdefault(int(rank), []).append(int(stage))
    busy = {r: s.busy_ns / n_steps for r, s in per_rank.items()}
    if analysis.dimensions is not None:
        # compute only: a TP collective's time is mostly waiting for the slowest peer of its
        # group, which is that peer's slowness, not this rank's
        tp_alone = analysis.dimensions.per_step.groupby("rank")["tp_alone_ns"].sum()
        busy = {r: b - float(tp_alone.get(r, 0)) / n_steps for r, b in busy.items()}
    places = []
    for place in range(min(len(g) for g in groups)):
        ranks = [g[place] for g in groups]
        worst = max(range(len(ranks)), key=lambda i: (ratio[ranks[i]], -i))
        slowest = max(range(len(ranks)), key=lambda i: (busy[ranks[i]], -i))
        summed = {c: sum(causes.get(r, {}).get(c, 0) for r in ranks) for c in CATEGORIES} if causes else {}
        top = max(summed, key=lambda c: summed[c]) if summed and max(summed.values()) > 0 else None
        places.append(
            PlaceRollup(
                place=place,
                stages=list(stages.get(ranks[0], [])),
                ranks=ranks,
                bubble_ratio=Spread.of([ratio[r] for r in ranks]),
                idle_per_step_ns=Spread.of([per_rank[r].idle_ns / n_steps for r in ranks]),
                busy_per_step_ns=Spread.of([busy[r] for r in ranks]),
                worst_replica=worst,
                worst_rank=ranks[worst],
                slowest_replica=slowest,
                causes_ns=summed,
                top_cause=top,
                tp_rank=_tp_rank(layout, ranks[0]),
            )
        )
    result = ReplicaRollup(groups, n_steps, everyone, places, order)
    if len(groups) > 1:
        result.replica_step_ns = _replica_step_ns(analysis, groups)
        result.slow_replicas = _slow_replicas(analysis, result, busy)
        result.slowest_everywhere = _slowest_everywhere(places, busy)
        result.replica_bubble = {
            i: share(
                sum(per_rank[r].idle_ns for r in g),
                max(sum(per_rank[r].window_ns for r in g), 1),
                f"replica {i}: bubble ratio",
            )
            for i, g in enumerate(groups)
        }
        result.timeline_replicas = _timeline_replicas(result)
    return result


def _tp_rank(layout: Layout | None, rank: int) -> int | None:
    """``rank``'s place in its tensor-parallel group (None without tensor parallelism)."""
    if layout is None or layout.size("tp") < 2:
        return None
    return layout.peers("tp", rank).index(rank)


def _timeline_replicas(result: ReplicaRollup) -> list[tuple[int, str]]:
    """The replicas a report draws timelines of: the slowest (longest median step; the others
    wait for it), those a pattern names, the highest and lowest bubble, the median step;
    at most MAX_TIMELINE_REPLICAS."""
    steps = result.replica_step_ns
    bubble = result.replica_bubble
    by_step = sorted(steps, key=lambda i: (-steps[i], -bubble.get(i, 0.0), i))
    by_bubble = sorted(bubble, key=lambda i: (-bubble[i], i))
    picks: list[tuple[int, str]] = []
    if by_step:
        picks.append((by_step[0], "slowest: the longest steps"))
    picks += [(s.replica, "named by a finding") for s in result.slow_replicas]
    if by_bubble:
        picks += [(by_bubble[0], "highest bubble"), (by_bubble[-1], "lowest bubble")]
    if by_step:
        picks.append((by_step[len(by_step) // 2], "median step"))
    chosen: dict[int, str] = {}
    for replica, why in picks:
        if replica in chosen:
            chosen[replica] += f", {why.split(':')[0]}"
        elif len(chosen) < MAX_TIMELINE_REPLICAS:
            chosen[replica] = why
    return list(chosen.items())


def _rank_causes(analysis: Analysis) -> dict[int, dict[str, int]]:
    """rank: idle by cause, summed over steps (empty without attribution)."""
    if analysis.attribution is None:
        return {}
    table = analysis.attribution.table
    if not len(table):
        return {}
    sums = table.groupby("rank")[[f"{c}_ns" for c in CATEGORIES]].sum()
    return {int(r): dict(zip(CATEGORIES, row)) for r, row in zip(sums.index.tolist(), sums.to_numpy().tolist())}


def _makespans(analysis: Analysis, groups: list[list[int]]) -> pd.DataFrame:
    """Each replica's step length (first compute start to last compute end of its ranks):
    index step, one column per replica."""
    actions = analysis.run.actions
    actions = actions[actions["step"] >= 0]
    replica = {r: i for i, g in enumerate(groups) for r in g}
    tagged = actions.assign(replica=actions["rank"].map(replica)).dropna(subset=["replica"])
    spans = tagged.groupby(["step", "replica"]).agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    return (spans["hi"] - spans["lo"]).unstack("replica")


def _replica_step_ns(analysis: Analysis, groups: list[list[int]]) -> dict[int, int]:
    makespans = _makespans(analysis, groups)
    return {int(c): int(makespans[c].median()) for c in makespans.columns}


def _slow_replicas(analysis: Analysis, result: ReplicaRollup, busy: dict[int, float]) -> list[SlowReplica]:
    """Replicas with a place (or every place) computing at least SLOW_FACTOR times the other
    replicas' median there, slowest first."""
    makespans = _makespans(analysis, result.replicas)
    window_ns = max(analysis.summary.window_ns, 1)
    n_ranks = analysis.summary.n_ranks
    found = []
    # per place, each replica's peers' median: sorted once per place, not once per replica
    peers = [others_median([busy[r] for r in place.ranks]) for place in result.places]
    for i, group in enumerate(result.replicas):
        slow, ratios = [], []
        for place, medians in zip(result.places, peers):
            median = medians[i]
            mine = busy[place.ranks[i]]
            ratio = mine / median if median > 0 else 1.0
            ratios.append(ratio)
            if ratio >= SLOW_FACTOR:
                slow.append(
                    SlowRank(place.ranks[i], i, place.place, place.stages, int(mine), int(median), float(ratio))
                )
        if not slow:
            continue
        peer_steps = makespans.drop(columns=[i]).median(axis=1) if i in makespans.columns else None
        excess = (makespans[i] - peer_steps).clip(lower=0) if peer_steps is not None else pd.Series(dtype=float)
        excess_total = float(excess.sum()) if len(excess) else 0.0
        found.append(
            SlowReplica(
                replica=i,
                replica_ranks=list(group),
                every_place=len(slow) == len(result.places),
                min_slowdown=float(min(ratios)),
                median_slowdown=float(statistics.median(ratios)),
                ranks=sorted(slow, key=lambda s: -s.slowdown),
                excess_per_step_ns=int(excess.mean()) if len(excess) else 0,
                cost_share=share(excess_total * n_ranks, window_ns, f"replica {i}: the slow replica's cost"),
            )
        )
    return sorted(found, key=lambda s: (-s.cost_share, s.replica))


def others_median(values: Sequence[float]) -> list[float]:
    """For each value, the median of all the others (itself for a single value): from one
    sort, so a place with thousands of replicas costs O(R log R), not O(R^2)."""
    n = len(values)
    if n < 2:
        return [float(v) for v in values]
    order = sorted(range(n), key=lambda i: values[i])
    ranked = [float(values[i]) for i in order]
    out = [0.0] * n
    rest = n - 1
    half = rest // 2
    for position, i in enumerate(order):
        # the j-th smallest of the others is ranked[j] below this value's place, else ranked[j + 1]
        picks = [j if j < position else j + 1 for j in ((half,) if rest % 2 else (half - 1, half))]
        out[i] = sum(ranked[j] for j in picks) / len(picks)
    return out


def _slowest_everywhere(places: list[PlaceRollup], busy: dict[int, float]) -> SlowestEverywhere | None:
    """The place computing the most in every replica, at least SLOWEST_PLACE_FACTOR times the
    other places' median in each; None if the slowest place differs between replicas."""
    if len(places) < 2:
        return None
    n_replicas = len(places[0].ranks)
    picked, ratios = set(), []
    for i in range(n_replicas):
        compute = [busy[p.ranks[i]] for p in places]
        top = max(range(len(places)), key=lambda k: (compute[k], -k))
        rest = statistics.median(compute[:top] + compute[top + 1 :])
        picked.add(top)
        ratios.append(compute[top] / rest if rest > 0 else float("inf"))
    if len(picked) != 1 or min(ratios) < SLOWEST_PLACE_FACTOR:
        return None
    place = places[picked.pop()]
    return SlowestEverywhere(
        place.place, place.stages, place.ranks, float(min(ratios)), float(statistics.median(ratios))
    )
