"""The replay engine: a step's dependency graph, replayed with chosen durations, overheads
and message latencies.

A step is a set of actions. Each action waits for the previous action on its rank and for
the messages it consumes, then spends ``ovh`` (host/launch overhead) before ``dur`` of
compute::

    start[a] = max(end[prev(a)] or t0, max over edges e into a: end[src(e)] + lat[e]) + ovh[a]
    end[a]   = start[a] + dur[a]

From a trace, ``dur``, ``lat`` and ``ovh`` are measured so that replaying them reproduces
the measured timeline (:func:`graph_from_run`); the residual is reported as fidelity.
Counterfactuals replace one ingredient (balanced durations, free messages, no overhead);
what-if questions build a graph from another schedule (:mod:`tracekit.analyze.schedules`).
The graph knows nothing about which schedule made it: any per-rank order plus data edges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import pandas as pd

from tracekit.analyze.grouping import int_groups
from tracekit.model.groups import group_ids, pair_codes, split_by
from tracekit.model.run import Run, compute_ns, fused_groups
from tracekit.reconstruct.device import receives_on_device

if TYPE_CHECKING:
    from tracekit.schemas.analysis import PathStepDoc


@dataclass
class StepGraph:
    """One step's actions (in a topological order) and their dependencies."""

    step: int
    t0: int  # replay origin: the step window's start
    action_id: np.ndarray  # id in run.actions (or synthetic index)
    rank: np.ndarray
    stage: np.ndarray
    kind: np.ndarray  # "F" | "B" | "I" | "W"
    microbatch: np.ndarray
    prev: np.ndarray  # index of the previous action on its rank, -1
    dur: np.ndarray  # measured compute duration, ns
    ovh: np.ndarray  # measured overhead before the action, ns
    edge_src: np.ndarray  # producer index
    edge_dst: np.ndarray  # consumer index
    edge_lat: np.ndarray  # measured latency (producer end -> data there), ns
    edge_msg: np.ndarray  # msg_id, -1 for a dependency with no message
    measured_start: np.ndarray | None = None
    measured_end: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    # Rendezvous transfer of each edge (NCCL on the device: the data moves only once both
    # kernels run, so it takes this long after the later of the producer's data leaving and
    # the consumer's rank being free); zeros: the latency is all there is.
    edge_xfer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # empty: zeros
    # Flush-free pipelines (PipeDream-2BW): each rank's own window start, where its first
    # action may begin (else t0 for every rank) and from which its idle is counted (else
    # t0, and the step ends at its last action on any rank); see step_graphs.
    rank_start: dict[int, int] | None = None
    # Earliest start of each action from outside the graph: inputs that a previous step
    # produced, taken as they arrived (0: none).
    release: np.ndarray | None = None
    # Microbatches that differ in cost by design (TeraPipe's token slices): balancing keeps
    # each microbatch's cost and balances the stages per microbatch.
    balance_by_microbatch: bool = False
    # Per edge, the action on the consumer's rank after which its receive was posted: the
    # rendezvous transfer starts no earlier than that action's end (-1: the rank's start).
    # A schedule that receives ahead (Megatron posts a unit's receives before the unit runs)
    # posts it before the consumer's previous action. Empty: the consumer's previous action.
    edge_anchor: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # How replay_many walks the graph, made on its first replay (see _level_plan).
    level_plan: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not len(self.edge_xfer):
            self.edge_xfer = np.zeros(len(self.edge_src), dtype=np.int64)
        if not len(self.edge_anchor):
            self.edge_anchor = np.asarray(self.prev, dtype=np.int64)[np.asarray(self.edge_dst, dtype=np.int64)]

    @property
    def ranks(self) -> np.ndarray:
        return np.unique(self.rank)

    def origin(self, i: int) -> int:
        """Where action ``i``'s rank starts: its own window start, else t0."""
        if self.rank_start is None:
            return self.t0
        return self.rank_start.get(int(self.rank[i]), self.t0)

    def window_ns(self, result: "Replay") -> dict[int, int]:
        """Each rank's replayed window: from t0 (or its own start) to the step's last end
        (or, with per-rank windows, its own last end)."""
        if self.rank_start is None:
            makespan = result.makespan(self.t0)
            return {int(r): makespan for r in self.ranks}
        return {
            int(r): int(result.end[self.rank == r].max()) - self.rank_start.get(int(r), self.t0) for r in self.ranks
        }

    def edge_links(self) -> list[tuple[int, int]]:
        return [(int(self.rank[s]), int(self.rank[d])) for s, d in zip(self.edge_src, self.edge_dst)]

    def balanced_durations(self, by_microbatch: bool | None = None) -> np.ndarray:
        """Every action at its kind's typical duration: the median over stages of each
        stage's mean duration for that kind (a slow stage is the outlier, not the norm);
        per kind and microbatch with ``by_microbatch`` (default: ``balance_by_microbatch``)."""
        n = len(self.dur)
        if not n:
            return np.zeros(0, dtype=np.int64)
        by_microbatch = self.balance_by_microbatch if by_microbatch is None else by_microbatch
        _, group = np.unique(self.kind.astype(str), return_inverse=True)  # a code per kind
        group = group.reshape(-1).astype(np.int64)
        if by_microbatch:  # per kind and microbatch
            group = group_ids(group, np.asarray(self.microbatch, np.int64))
        # each (group, stage)'s mean duration: sums in row order, as a group's own bincount adds them
        cell = group_ids(group, np.asarray(self.stage, np.int64))
        means = np.bincount(cell, weights=self.dur) / np.bincount(cell)
        cell_group = np.zeros(len(means), dtype=np.int64)
        cell_group[cell] = group
        # each group's median over its stages: the middle mean, or the mean of the middle two
        order = np.lexsort((means, cell_group))
        sizes = np.bincount(cell_group)
        first = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        low, high = means[order[first + (sizes - 1) // 2]], means[order[first + sizes // 2]]
        median = np.where(sizes % 2 == 1, low, (low + high) / 2)
        return np.round(median).astype(np.int64)[group]


@dataclass
class Replay:
    start: np.ndarray
    end: np.ndarray
    binding: np.ndarray  # per action: -1 = previous action on the rank / t0, else edge index

    def makespan(self, t0: int) -> int:
        return int(self.end.max() - t0) if len(self.end) else 0


def replay(
    graph: StepGraph,
    dur: np.ndarray | None = None,
    ovh: np.ndarray | None = None,
    lat: np.ndarray | None = None,
    xfer: np.ndarray | None = None,
) -> Replay:
    """Replay the graph; any ingredient not given is the measured one. A message arrives
    ``lat`` after its producer ends, plus ``xfer`` counted from when both that and the
    consumer's rank are ready (rendezvous)."""
    return replay_many(graph, [Scenario(dur, ovh, lat, xfer)])[0]


@dataclass(frozen=True)
class Scenario:
    """One replay's ingredients; None: the graph's measured one (see :func:`replay`)."""

    dur: np.ndarray | None = None
    ovh: np.ndarray | None = None
    lat: np.ndarray | None = None
    xfer: np.ndarray | None = None


T = TypeVar("T")

# Scenarios replayed together hold at most this many actions in all (a few arrays of int64).
_BATCH_CELLS = 1 << 22
# Graphs replayed side by side (replay_steps) hold at most this many: small steps gain most
# from sharing a walk, and a big step's own walk is already mostly array work, so several
# of them together would only hold more memory at once (1,024 ranks: +130 MB at 1 << 22).
_UNION_CELLS = 1 << 19


def replay_many(graph: StepGraph, scenarios: list[Scenario]) -> list[Replay]:
    """:func:`replay` of each scenario, all at once: the graph is walked once, by levels
    (an action's level is one more than the deepest of its rank predecessor and producers,
    so the actions of a level depend only on earlier levels), each level's actions and
    every scenario in one numpy step. A step of a big pipeline is a few hundred levels
    deep, and attribution replays it ~70 times: this is what makes that seconds."""
    n = len(graph.action_id)
    per_batch = max(1, _BATCH_CELLS // max(n, 1))
    out: list[Replay] = []
    for lo in range(0, len(scenarios), per_batch):
        out.extend(_replay_batch(graph, scenarios[lo : lo + per_batch]))
    return out


def _stacked(values: list[np.ndarray | None], default: np.ndarray) -> np.ndarray:
    """One column per scenario (rows: actions or edges, so that a level's rows are gathered whole)."""
    cols = [default if v is None else np.asarray(v) for v in values]
    return np.stack(cols, axis=1).astype(np.int64, copy=False)


def replay_steps(
    steps: Iterable[tuple[StepGraph, list[Scenario], T]], on_walk: Callable[[list[int]], None] | None = None
) -> Iterator[tuple[T, list[Replay]]]:
    """:func:`replay_many` of each graph with its own scenarios, several graphs in one walk:
    each step's ``T`` (whatever its caller carries along with it) and the graph's replays,
    in order, as its walk ends.

    The graphs are disjoint, so side by side they are one graph whose level ``L`` is every
    graph's level ``L``: one walk of as many levels as the deepest graph replays them all,
    where a graph at a time took that many levels per graph (a profile of 33 steps: 66 walks
    of a small graph become 2). A graph with fewer scenarios than the others replays its
    measured ingredients in the spare columns, which are dropped. Graphs are taken together
    up to :data:`_UNION_CELLS` actions x scenarios; a graph over that alone goes through
    :func:`replay_many`. ``steps`` is read as the walks need it and the replays are handed
    on walk by walk, so a caller that makes each step's scenarios as it is asked for them
    and uses each step's replays as they come holds one walk's worth at a time.
    ``on_walk`` is told the positions (in ``steps``) of each walk's graphs before it starts.
    """
    group: list[tuple[int, StepGraph, list[Scenario], T]] = []
    size = width = 0

    def walk() -> Iterator[tuple[T, list[Replay]]]:
        if on_walk:
            on_walk([i for i, _, _, _ in group])
        if len(group) == 1:
            replayed = [replay_many(group[0][1], group[0][2])]
        else:
            replayed = _replay_union([g for _, g, _, _ in group], [sc for _, _, sc, _ in group])
        return zip([carried for _, _, _, carried in group], replayed)

    for i, (graph, scenarios, carried) in enumerate(steps):
        n, k = len(graph.action_id), len(scenarios)
        if group and (size + n) * max(width, k) > _UNION_CELLS:
            yield from walk()
            group, size, width = [], 0, 0
        group.append((i, graph, scenarios, carried))
        size, width = size + n, max(width, k)
    if group:
        yield from walk()


def _replay_batch(graph: StepGraph, scenarios: list[Scenario]) -> list[Replay]:
    k = len(scenarios)
    start, end, binding = _walk(
        _level_plan(graph),
        _origins(graph),
        None if graph.release is None else np.asarray(graph.release, dtype=np.int64),
        graph.edge_src,
        np.asarray(graph.edge_anchor, dtype=np.int64),
        _stacked([s.dur for s in scenarios], graph.dur),
        _stacked([s.ovh for s in scenarios], graph.ovh),
        _stacked([s.lat for s in scenarios], graph.edge_lat),
        _stacked([s.xfer for s in scenarios], graph.edge_xfer),
    )
    return [Replay(start[i], end[i], binding[i]) for i in range(k)]


def _origins(graph: StepGraph) -> np.ndarray:
    """Where each action's rank starts (read at each replay, as t0 and rank_start may be
    set after one)."""
    if graph.rank_start is None:
        return np.full(len(graph.action_id), graph.t0, dtype=np.int64)
    return np.array([graph.rank_start.get(int(r), graph.t0) for r in graph.rank], dtype=np.int64)


def _replay_union(graphs: list[StepGraph], scenarios: list[list[Scenario]]) -> list[list[Replay]]:
    """:func:`replay_steps` of graphs that fit one batch: side by side, one walk."""
    k = max(len(s) for s in scenarios)
    if not k:
        return [[] for _ in graphs]
    sizes = np.array([len(g.action_id) for g in graphs], dtype=np.int64)
    n_edges = np.array([len(g.edge_src) for g in graphs], dtype=np.int64)
    node_at = np.concatenate(([0], np.cumsum(sizes)))
    edge_at = np.concatenate(([0], np.cumsum(n_edges)))

    def column(j: int, field: str, default: str) -> np.ndarray:
        parts = []
        for g, sc in zip(graphs, scenarios):
            value = getattr(sc[j], field) if j < len(sc) else None
            parts.append(np.asarray(getattr(g, default) if value is None else value, dtype=np.int64))
        return np.concatenate(parts)

    def stacked(field: str, default: str) -> np.ndarray:
        return np.stack([column(j, field, default) for j in range(k)], axis=1)

    releases = [g.release for g in graphs]
    release = (
        None
        if all(r is None for r in releases)
        else np.concatenate(
            [
                # no release: the earliest time there is (times may be negative on a shifted clock)
                np.full(len(g.action_id), np.iinfo(np.int64).min) if r is None else np.asarray(r, np.int64)
                for g, r in zip(graphs, releases)
            ]
        )
    )
    start, end, binding = _walk(
        _union_plan(graphs, node_at),
        np.concatenate([_origins(g) for g in graphs]),
        release,
        np.concatenate([np.asarray(g.edge_src, np.int64) + off for g, off in zip(graphs, node_at[:-1].tolist())]),
        np.concatenate(
            [
                np.where(np.asarray(g.edge_anchor, np.int64) >= 0, np.asarray(g.edge_anchor, np.int64) + off, -1)
                for g, off in zip(graphs, node_at[:-1].tolist())
            ]
        ),
        stacked("dur", "dur"),
        stacked("ovh", "ovh"),
        stacked("lat", "edge_lat"),
        stacked("xfer", "edge_xfer"),
    )
    out = []
    for sc, lo, hi, e0 in zip(scenarios, node_at[:-1].tolist(), node_at[1:].tolist(), edge_at[:-1].tolist()):
        bound = binding[:, lo:hi]
        bound = np.where(bound >= 0, bound - e0, -1)
        out.append([Replay(start[j, lo:hi].copy(), end[j, lo:hi].copy(), bound[j].copy()) for j in range(len(sc))])
    return out


def _walk(
    plan: "_LevelPlan",
    origin: np.ndarray,
    release: np.ndarray | None,
    src: np.ndarray,
    anchor: np.ndarray,
    dur: np.ndarray,
    ovh: np.ndarray,
    lat: np.ndarray,
    xfer: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replay's recurrence level by level, every scenario a column (``dur``, ``ovh``:
    action x scenario; ``lat``, ``xfer``: edge x scenario; ``anchor``: per edge, the action
    whose end its rendezvous waits for, -1 the consumer's rank start); start, end and
    binding as scenario x action."""
    n, k = dur.shape
    start = np.zeros((n, k), dtype=np.int64)
    end = np.zeros((n, k), dtype=np.int64)
    binding = np.full((n, k), -1, dtype=np.int64)
    release_col = None if release is None else release[:, None]
    rendezvous = bool(xfer.any())
    for nodes, prev, edges, local_dst, seg_starts, seg_nodes in plan.levels:
        free = np.where((prev >= 0)[:, None], end[np.maximum(prev, 0)], origin[nodes][:, None])
        ready = free if release_col is None else np.maximum(free, release_col[nodes])
        if len(edges):
            arrival = end[src[edges]] + lat[edges]
            if rendezvous:
                x = xfer[edges]
                posted = anchor[edges]  # the receive's anchor: of an earlier level, so already replayed
                partner = np.where(
                    (posted >= 0)[:, None], end[np.maximum(posted, 0)], origin[nodes[local_dst]][:, None]
                )
                arrival = np.where(x != 0, np.maximum(arrival, partner) + x, arrival)
            latest = np.maximum.reduceat(arrival, seg_starts, axis=0)  # per action with inputs
            before = ready[seg_nodes]
            # the binding input: the first edge (in edge order) with the latest arrival, if
            # it came after the rank was free (a later edge must arrive strictly later)
            counts = np.diff(np.append(seg_starts, len(edges)))
            is_latest = arrival == np.repeat(latest, counts, axis=0)
            first = np.minimum.reduceat(np.where(is_latest, np.arange(len(edges))[:, None], len(edges)), seg_starts)
            bound = latest > before
            ready = ready.copy()
            ready[seg_nodes] = np.where(bound, latest, before)
            binding[nodes[seg_nodes]] = np.where(bound, edges[np.minimum(first, len(edges) - 1)], -1)
        start[nodes] = ready + ovh[nodes]
        end[nodes] = start[nodes] + dur[nodes]
    return start.T.copy(), end.T.copy(), binding.T.copy()


@dataclass
class _LevelPlan:
    """The graph cut into levels once (see :func:`replay_many`); per level: its actions,
    their rank predecessors, the edges into them sorted by consumer then edge index, each
    edge's consumer as a position in the level, where each consumer's edges begin, and
    which positions those consumers have."""

    key: tuple[np.ndarray, np.ndarray, np.ndarray]  # the graph's prev, edge_src, edge_dst
    level: np.ndarray  # each action's level
    levels: list["_Level"]


def _level_plan(graph: StepGraph) -> _LevelPlan:
    # The arrays themselves, not their ids: held by the plan, a replaced array cannot be
    # freed and its id reused by the new one.
    key = (graph.prev, graph.edge_src, graph.edge_dst)
    plan = graph.level_plan
    if isinstance(plan, _LevelPlan) and all(a is b for a, b in zip(plan.key, key)):
        return plan
    n = len(graph.action_id)
    prev = np.asarray(graph.prev, dtype=np.int64)
    src = np.asarray(graph.edge_src, dtype=np.int64)
    dst = np.asarray(graph.edge_dst, dtype=np.int64)
    # Levels in one pass: the actions are in a topological order (replay walks them so).
    producers: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist()):
        producers[d].append(s)
    level_list = [0] * n
    for i, p in enumerate(prev.tolist()):
        deepest = level_list[p] + 1 if p >= 0 else 0
        for s in producers[i]:
            deepest = max(deepest, level_list[s] + 1)
        level_list[i] = deepest
    level = np.array(level_list, dtype=np.int64)
    plan = _LevelPlan(key, level, _cut_into_levels(level, prev, dst))
    graph.level_plan = plan
    return plan


def _union_plan(graphs: list[StepGraph], node_at: np.ndarray) -> _LevelPlan:
    """The level plan of the graphs side by side (action indices offset by ``node_at``,
    edges numbered on, graph after graph): each action keeps its own graph's level, so level ``L``
    holds every graph's level ``L``, a graph's actions after the earlier graphs'."""
    plans = [_level_plan(g) for g in graphs]
    offsets = node_at[:-1].tolist()
    level = np.concatenate([p.level for p in plans])
    prev = np.concatenate(
        [np.where(g.prev >= 0, np.asarray(g.prev, np.int64) + o, -1) for g, o in zip(graphs, offsets)]
    )
    dst = np.concatenate([np.asarray(g.edge_dst, np.int64) + o for g, o in zip(graphs, offsets)])
    empty = np.zeros(0, dtype=np.int64)
    return _LevelPlan((empty, empty, empty), level, _cut_into_levels(level, prev, dst))


_Level = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _cut_into_levels(level: np.ndarray, prev: np.ndarray, dst: np.ndarray) -> list[_Level]:
    """The per-level tuples of :class:`_LevelPlan` from each action's level."""
    n = len(level)
    node_order = np.argsort(level, kind="stable")
    node_bounds = np.searchsorted(level[node_order], np.arange(int(level.max()) + 2 if n else 1))
    edge_order = np.lexsort((np.arange(len(dst)), dst, level[dst])) if len(dst) else np.zeros(0, dtype=np.int64)
    edge_levels = level[dst[edge_order]] if len(dst) else np.zeros(0, dtype=np.int64)
    edge_bounds = np.searchsorted(edge_levels, np.arange(len(node_bounds)))
    position = np.empty(n, dtype=np.int64)
    levels = []
    for lv in range(len(node_bounds) - 1):
        nodes = node_order[node_bounds[lv] : node_bounds[lv + 1]]
        if not len(nodes):
            continue
        position[nodes] = np.arange(len(nodes))
        edges = edge_order[edge_bounds[lv] : edge_bounds[lv + 1]]
        local_dst = position[dst[edges]]
        if len(edges):
            seg_starts = np.flatnonzero(np.diff(local_dst, prepend=-1))
        else:
            seg_starts = np.zeros(0, dtype=np.int64)
        levels.append((nodes, prev[nodes], edges, local_dst, seg_starts, local_dst[seg_starts]))
    return levels


def idle_per_rank(graph: StepGraph, result: Replay, dur: np.ndarray | None = None) -> dict[int, int]:
    """Each rank's idle time in the replayed step window [t0, last end] (per-rank windows:
    [its start, its last end])."""
    dur = graph.dur if dur is None else dur
    windows = graph.window_ns(result)
    ranks, codes = np.unique(graph.rank, return_inverse=True)
    busy = np.zeros(len(ranks), dtype=np.int64)
    np.add.at(busy, codes.reshape(-1), np.asarray(dur, dtype=np.int64))
    return {int(r): windows[int(r)] - int(b) for r, b in zip(ranks, busy)}


def critical_path(graph: StepGraph, result: Replay) -> list[PathStepDoc]:
    """The chain of actions and waits that set the step's length, last action first."""
    if len(result.end) == 0:
        return []
    i = int(np.argmax(result.end))
    path: list[PathStepDoc] = []
    while i >= 0:
        e = int(result.binding[i])
        entry: PathStepDoc = {
            "action_id": int(graph.action_id[i]),
            "rank": int(graph.rank[i]),
            "kind": str(graph.kind[i]),
            "stage": int(graph.stage[i]),
            "microbatch": int(graph.microbatch[i]),
            "compute_ns": int(result.end[i] - result.start[i]),
            "overhead_ns": int(graph.ovh[i]) if result.start[i] >= graph.ovh[i] else 0,
            "via": "message" if e >= 0 else "rank order",
        }
        if e >= 0:
            entry["msg_id"] = int(graph.edge_msg[e])
            entry["link"] = f"{int(graph.rank[graph.edge_src[e]])}->{int(graph.rank[i])}"
            entry["comm_ns"] = int(result.start[i] - graph.ovh[i] - result.end[graph.edge_src[e]])
            path.append(entry)
            i = int(graph.edge_src[e])
        else:
            path.append(entry)
            i = int(graph.prev[i])
    return path


def topological_order(
    n: int, prev: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray, tie_break: np.ndarray
) -> np.ndarray:
    """Kahn's order over rank-order and message edges; ties broken by ``tie_break``."""
    import heapq

    indegree = np.zeros(n, dtype=np.int64)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        if prev[i] >= 0:
            succ[prev[i]].append(i)
            indegree[i] += 1
    for s, d in zip(edge_src, edge_dst):
        succ[s].append(d)
        indegree[d] += 1
    heap = [(tie_break[i], i) for i in range(n) if indegree[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(heap, (tie_break[j], j))
    if len(order) != n:
        raise ValueError("dependency cycle: the action order contradicts the data dependencies")
    return np.array(order, dtype=np.int64)


def reorder(graph_fields: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Permute per-action arrays into ``order`` and remap indices that point at actions."""
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    out = dict(graph_fields)
    for key in ("action_id", "rank", "stage", "kind", "microbatch", "dur", "ovh", "measured_start", "measured_end"):
        if out.get(key) is not None:
            out[key] = np.asarray(out[key])[order]
    prev = np.asarray(graph_fields["prev"])[order]
    out["prev"] = np.where(prev >= 0, position[np.clip(prev, 0, None)], -1)
    out["edge_src"] = position[np.asarray(graph_fields["edge_src"], dtype=np.int64)]
    out["edge_dst"] = position[np.asarray(graph_fields["edge_dst"], dtype=np.int64)]
    return out


def dependency_pairs(
    rank: np.ndarray, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, replica: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """Cross-rank data dependencies implied by stage adjacency: activations flow from
    stage s to s+1, gradients from s+1 to s (through I when backward is split), inside one
    data-parallel ``replica`` (all one pipeline when not given)."""
    src, dst = _dependencies(rank, stage, kind, microbatch, replica)
    return list(zip(src.tolist(), dst.tolist()))


def _dependencies(
    rank: np.ndarray, stage: np.ndarray, kind: np.ndarray, microbatch: np.ndarray, replica: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dependency_pairs` as (producer, consumer) arrays, consumers in action order:
    each action's producer looked up among all actions at once (the last action of a
    (replica, kind, stage, microbatch) where two share one)."""
    n = len(kind)
    group = np.zeros(n, dtype=np.int64) if replica is None else np.asarray(replica, dtype=np.int64)
    kinds = np.asarray(kind).astype(str)
    kind_names, kind_code = np.unique(kinds, return_inverse=True)
    stage = np.asarray(stage, dtype=np.int64)
    mb = np.asarray(microbatch, dtype=np.int64)
    # Every action's (replica, kind, stage, microbatch) and each lookup's wanted one, coded
    # as one int64 each (pair_codes: the same tuple the same code across all the sets).
    forward = np.flatnonzero(kinds == "F")
    backward = np.flatnonzero((kinds == "B") | (kinds == "I"))
    lookups = {"F": (forward, -1), "B": (backward, 1), "I": (backward, 1)}  # rows, producer's stage offset
    sets = [(group, kind_code, stage, mb)]
    for want, (rows, offset) in lookups.items():
        want_code = int(np.searchsorted(kind_names, want)) if want in kind_names else -1
        sets.append((group[rows], np.full(len(rows), want_code), stage[rows] + offset, mb[rows]))
    codes = [part[0] for part in sets]
    for column in (1, 2, 3):
        pairs = [(code, part[column]) for code, part in zip(codes, sets)]
        codes = pair_codes(*pairs[0], *pairs[1:])
    table, last_reversed = np.unique(codes[0][::-1], return_index=True)
    position = n - 1 - last_reversed  # the last action of each distinct tuple
    wanted = dict(zip(lookups, codes[1:]))

    def find(want_kind: str) -> np.ndarray:
        keys = wanted[want_kind]
        if not len(table):
            return np.full(len(keys), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
        return np.where(table[at] == keys, position[at], -1)

    producer = np.full(n, -1, dtype=np.int64)
    producer[forward] = find("F")
    found = find("B")
    missing = found < 0
    found[missing] = find("I")[missing]
    producer[backward] = found
    rank = np.asarray(rank)
    consumer = np.flatnonzero(producer >= 0)
    consumer = consumer[rank[producer[consumer]] != rank[consumer]]
    return producer[consumer], consumer


# The column of step_graphs' actions holding each one's fused range (fused_groups).
_FUSED = "_fused_group"


def _fused_ends(
    acts: pd.DataFrame, order: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per action (positions in ``order``): the first-starting and the last-ending part of
    its fused range (:func:`tracekit.model.run.fused_groups`, or the ``_FUSED`` column
    :func:`step_graphs` gives it); itself where it is none."""
    n = len(order)
    first_of = np.arange(n, dtype=np.int64)
    last_of = np.arange(n, dtype=np.int64)
    group = (acts[_FUSED].to_numpy(np.int64) if _FUSED in acts else fused_groups(acts))[order]
    for members in split_by(group[group >= 0], np.flatnonzero(group >= 0)).values():
        first_of[members] = members[np.lexsort((members, start[members]))[0]]
        last_of[members] = members[np.lexsort((-members, end[members]))[-1]]
    return first_of, last_of


def step_graphs(run: Run, windows: pd.DataFrame | None = None) -> dict[int, StepGraph]:
    """The measured graph of every step (the run's tables split by step once).

    ``windows``: per-rank step windows (rank, step, window_start_ns), given for flush-free
    pipelines (:func:`tracekit.analyze.bubbles.continuous_windows`). A step's graph then
    starts each rank at its own window, takes every message into one of its actions
    (whichever step the message is filed under), and an input produced in the previous
    step as a release time at its measured arrival: that step is not replayed again."""
    # fused ranges found once for the run (a pandas grouping each step cost ~1 ms a step)
    actions = run.actions.assign(**{_FUSED: fused_groups(run.actions)})
    acts_by_step = {s: g for (s,), g in int_groups(actions, ["step"]) if s >= 0}
    msgs = run.messages[(run.messages["producer_action"] >= 0) & (run.messages["consumer_action"] >= 0)]
    if windows is not None:
        step_of_action = dict(zip(run.actions["action_id"], run.actions["step"]))
        by_consumer = msgs["consumer_action"].map(step_of_action)
        # grouped by a mapped series (the consumer's step), not a column: its key is an int id too
        msgs_by_step = {int(cast(int, s)): g for s, g in msgs.groupby(by_consumer, sort=False)}
        starts = {
            s: {int(r): int(t) for r, t in zip(g["rank"], g["window_start_ns"])}
            for (s,), g in int_groups(windows, ["step"])
        }
    else:
        msgs_by_step = {s: g for (s,), g in int_groups(msgs, ["step"], sort=False)}
        starts = {}
    empty = msgs.iloc[0:0]
    return {
        step: graph_from_run(run, step, acts, msgs_by_step.get(step, empty), starts.get(step))
        for step, acts in acts_by_step.items()
    }


def graph_from_run(
    run: Run,
    step: int,
    acts: pd.DataFrame | None = None,
    msgs: pd.DataFrame | None = None,
    rank_start: dict[int, int] | None = None,
) -> StepGraph:
    """The measured dependency graph of one step of a reconstructed run (``acts`` and
    ``msgs``: that step's actions and linked messages, when already split out;
    ``rank_start``: per-rank window starts of a flush-free pipeline, see step_graphs)."""
    if acts is None:
        acts = run.actions[run.actions["step"] == step]
    # in (start, end) order, ties kept in table order (a stable sort, as sort_values by two keys)
    order = np.lexsort((acts["end_ns"].to_numpy(dtype=np.int64), acts["start_ns"].to_numpy(dtype=np.int64)))

    def column(name: str, dtype: type = np.int64) -> np.ndarray:
        return acts[name].to_numpy(dtype=dtype)[order]

    n = len(acts)
    ids = column("action_id")
    rank = column("rank")
    start = column("start_ns")
    end = column("end_ns")
    prev = _previous_on_rank(rank)
    notes: list[str] = []
    if msgs is None:
        msgs = run.messages[
            (run.messages["step"] == step)
            & (run.messages["producer_action"] >= 0)
            & (run.messages["consumer_action"] >= 0)
        ]
    # Every message at once, in table order: its producer and consumer in the step (-1: not here).
    msg_id = msgs["msg_id"].to_numpy(dtype=np.int64)
    s, d = (
        _positions(ids, msgs["producer_action"].to_numpy(dtype=np.int64)),
        _positions(ids, msgs["consumer_action"].to_numpy(dtype=np.int64)),
    )
    # A range that fuses a forward and a backward (DualPipeV's OVERLAP_F_B) runs as one: it
    # starts once all its inputs are there, and sends what either part made once it ends.
    first_of, last_of = _fused_ends(acts, order, start, end)
    s = np.where(s >= 0, last_of[np.maximum(s, 0)], s)
    d = np.where(d >= 0, first_of[np.maximum(d, 0)], d)
    arrival = msgs["arrival_ns"].to_numpy(dtype=np.int64)
    release = np.zeros(n, dtype=np.int64) if rank_start is not None else None
    if release is not None:
        # an input from outside the step: its consumer may start once it arrived
        outside = (s < 0) & (d >= 0)
        np.maximum.at(release, d[outside], np.minimum(arrival[outside], start[d[outside]]))
    linked = (s >= 0) & (d >= 0)
    linked[linked] = rank[s[linked]] != rank[d[linked]]
    # On the host's timeline a receive that queued an NCCL kernel returned at once: its host
    # never waited for the data, so the message binds no host span (no edge, and no note
    # where the consumer's host started first, as it mostly does); it still carries its
    # dependency (no bare edge for it either).
    unbound = linked & _unbound_on_host(run, msgs)
    carried = s[unbound] * max(n, 1) + d[unbound]
    linked &= ~unbound
    late = linked.copy()
    late[linked] = end[s[linked]] > start[d[linked]]
    notes += [f"message {m} arrives after its consumer started; ignored" for m in msg_id[late].tolist()]
    kept = np.flatnonzero(linked & ~late)
    s, d = s[kept], d[kept]
    room = start[d] - end[s]
    # Device messages: the data leaves at ``leave_ns`` and moves for ``transfer_ns`` once
    # both sides run (rendezvous); host messages: all latency up to ``arrival_ns``.
    if "leave_ns" in msgs:
        leave = msgs["leave_ns"].to_numpy(dtype=np.int64)[kept]
        transfer = msgs["transfer_ns"].to_numpy(dtype=np.int64)[kept]
    else:
        leave = transfer = np.full(len(kept), -1, dtype=np.int64)
    rendezvous = (leave >= 0) & (transfer >= 0)
    lat = np.minimum(np.maximum(np.where(rendezvous, leave, arrival[kept]) - end[s], 0), room)
    xfer = np.where(rendezvous, np.minimum(transfer, room - lat), 0)
    # the receiver's action after which each receive was posted (its kernel starts once the
    # work queued before it has run): the consumer's previous action, or an earlier one
    # where the schedule receives ahead
    anchor = prev[d]
    if "recv_post_ns" in msgs:
        posted = msgs["recv_post_ns"].to_numpy(dtype=np.int64)[kept]
        anchor = np.where(rendezvous, _posted_after(end, d, posted, prev), anchor)
    # One edge per (producer, consumer): the first message of the largest latency + transfer.
    pick = np.lexsort((np.arange(len(kept)), -(lat + xfer), d, s))
    first = np.ones(len(pick), dtype=bool)
    first[1:] = (s[pick][1:] != s[pick][:-1]) | (d[pick][1:] != d[pick][:-1])
    pick = pick[first]
    kind = acts["kind"].to_numpy()[order]
    stage = column("stage")
    mb = column("microbatch")
    replica_of = {r: i for i, group in enumerate(run.schedule.pipelines if run.schedule else []) for r in group}
    replica = np.array([replica_of.get(int(r), 0) for r in np.unique(rank)], dtype=np.int64)[
        np.searchsorted(np.unique(rank), rank)
    ]
    dep_src, dep_dst = _dependencies(rank, stage, kind, mb, replica)
    # a dependency no message carried, where its order allows: an edge of no latency
    # (producer, consumer) pairs as one number each: positions in the step, both below n
    messaged = np.isin(
        last_of[dep_src] * max(n, 1) + first_of[dep_dst], np.concatenate((s[pick] * max(n, 1) + d[pick], carried))
    )
    bare = ~messaged & (end[dep_src] <= start[dep_dst])
    unmessaged = int(bare.sum())
    if unmessaged:
        notes.append(f"{unmessaged} cross-rank dependencies have no matched message; their wait counts as overhead")
    edge_src = np.concatenate((s[pick], dep_src[bare]))
    edge_dst = np.concatenate((d[pick], dep_dst[bare]))
    edge_lat = np.concatenate((lat[pick], np.zeros(unmessaged, dtype=np.int64)))
    edge_msg = np.concatenate((msg_id[kept][pick], np.full(unmessaged, -1, dtype=np.int64)))
    edge_xfer = np.concatenate((xfer[pick], np.zeros(unmessaged, dtype=np.int64)))
    edge_anchor = np.concatenate((anchor[pick], prev[dep_dst[bare]]))
    by_pair = np.lexsort((edge_dst, edge_src))  # edges sorted by (producer, consumer)
    edge_src, edge_dst, edge_lat, edge_msg, edge_xfer, edge_anchor = (
        a[by_pair].astype(np.int64) for a in (edge_src, edge_dst, edge_lat, edge_msg, edge_xfer, edge_anchor)
    )
    t0 = int(start.min()) if n else 0
    if rank_start is not None:
        t0 = min([t0, *rank_start.values()])
    # Compute time (on the device: the union of the action's kernels); an action's idle
    # stretches between its kernels fall, in the replay, into the overhead of what follows.
    dur = np.minimum(compute_ns(acts).to_numpy(dtype=np.int64)[order], end - start)
    done = start + dur
    # Overhead: how long after its rank was free and its inputs were there each action began.
    if rank_start is None:
        origin = np.full(n, t0, dtype=np.int64)
    else:
        origin = np.array([rank_start.get(int(r), t0) for r in rank], dtype=np.int64)
    free = np.where(prev >= 0, done[np.maximum(prev, 0)], origin)
    ready = free if release is None else np.maximum(free, release)
    inputs = done[edge_src] + edge_lat
    partner = np.where(edge_anchor >= 0, done[np.maximum(edge_anchor, 0)], origin[edge_dst])
    inputs = np.where(edge_xfer != 0, np.maximum(inputs, partner) + edge_xfer, inputs)
    np.maximum.at(ready, edge_dst, inputs)
    ovh = np.maximum(0, start - ready)
    return StepGraph(
        step=step,
        t0=t0,
        action_id=ids,
        rank=rank,
        stage=stage,
        kind=kind,
        microbatch=mb,
        prev=prev,
        dur=dur,
        ovh=ovh,
        edge_src=edge_src,
        edge_dst=edge_dst,
        edge_lat=edge_lat,
        edge_msg=edge_msg,
        measured_start=start,
        measured_end=end,
        notes=notes,
        edge_xfer=edge_xfer,
        edge_anchor=edge_anchor,
        rank_start=rank_start,
        release=release,
    )


def _posted_after(end: np.ndarray, consumer: np.ndarray, posted: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """For each receive (its consumer's position and when it was posted): the last action
    of the consumer's rank before the consumer that ended by then, -1 for none; the
    consumer's previous action where the receive was posted after it (or it is unknown)."""
    out: np.ndarray = np.array(prev[consumer], dtype=np.int64)
    ahead = np.flatnonzero((out >= 0) & (end[np.maximum(out, 0)] > posted))  # most receives: none
    for i in ahead.tolist():
        a, t = int(out[i]), int(posted[i])
        while a >= 0 and end[a] > t:  # walk back along the rank to the action done by the post
            a = int(prev[a])
        out[i] = a
    return out


def _unbound_on_host(run: Run, msgs: pd.DataFrame) -> np.ndarray:
    """Which messages bind no span of the run's timeline: on the host's, those whose receive
    launched a device kernel (a GPU run read with ``--timeline host``)."""
    if run.timeline != "host":
        return np.zeros(len(msgs), dtype=bool)
    return receives_on_device(msgs, run.device_summary)


def _previous_on_rank(rank: np.ndarray) -> np.ndarray:
    """Each action's previous one on its rank (positions in table order), -1 for a rank's first."""
    order = np.argsort(rank, kind="stable")
    prev = np.full(len(rank), -1, dtype=np.int64)
    same = rank[order][1:] == rank[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each wanted id is in ``ids`` (the last place where one is twice), -1 where absent."""
    if not len(ids):
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")  # equal ids in table order: the last one last
    at = np.searchsorted(ids[order], wanted, side="right") - 1
    found = (at >= 0) & (ids[order][np.maximum(at, 0)] == wanted)
    return np.where(found, order[np.maximum(at, 0)], -1)
