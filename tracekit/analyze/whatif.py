"""What-if: the bubble and step time of another schedule, v or m, predicted by replay.

The measured run gives a cost model (:mod:`tracekit.analyze.costs`): compute per rank and
kind, host overhead per rank and message latency per link, kept as samples rather than
averages (a pipeline's step is a max over many paths, so the spread of the costs matters).

A prediction generates the target schedule's per-rank order
(:mod:`tracekit.analyze.schedules`; the zero-bubble family's from torch's own schedule
classes where torch is installed, equal action for action to tracekit's generators), draws
every action's compute (divided by the target v), overhead and every message's latency
from those samples, replays the step
(:mod:`tracekit.analyze.replay`) and repeats; the mean and spread over the replays are
reported. The same draws replayed on the *measured* order give the model's own error, shown
beside every prediction. With constant costs and free messages, predictions equal the
closed forms exactly (tested); on the project's real sample runs they are within a few
points of the runs captured with the other schedules (tested; see README).

The measured p is kept: changing the number of ranks is out of scope (refused in one line).

``balanced=True`` adds, for every target, its *ideal balance*: the same schedule with every
rank computing the mean (the run's total compute kept, as if layers could be cut anywhere),
a bound on what a better split of the layers could buy. The best split in whole layers, what
``tracekit whatif --balanced`` recommends, is :mod:`tracekit.analyze.split`'s; the report
shows both, each under its own name.

``keep="global-batch"`` (default): the step processes the same samples, so a microbatch's
compute scales with measured m / target m; ``keep="microbatch"``: microbatches keep their
size and the step does more work. Latencies are kept as measured in both (a message's size
changes with the microbatch, but its fixed cost dominates at these sizes; an assumption).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyze.costs import CostModel, LinkChange, LinkKey, cost_model, with_links, without_recompute
from tracekit.analyze.grouping import ranks_by_stage
from tracekit.analyze.memory import (
    ActivationSize,
    activation_bytes_per_rank,
    in_flight_per_rank,
    orders_of_graph,
    split_activation_bytes,
)
from tracekit.analyze.recompute_memory import RecomputeMemory
from tracekit.analyze.replay import Scenario, StepGraph, replay_many
from tracekit.analyze.schedules import V_PLACED, ZERO_BUBBLE, flatten, graph_from_orders, orders_for
from tracekit.analyze.theory import theoretical_bubble
from tracekit.errors import TracekitError
from tracekit.model import schedules as traits
from tracekit.model.run import Run

# Targets with whole backwards (the findings in diagnosis.py replay these), and every target
# (the zero-bubble family too: backward split into I and W, DualPipeV's fused pairs).
TARGETS = traits.names(generated=True, split_backward=False, offered=True)
ALL_TARGETS = traits.names(generated=True)
KEEPS = ("global-batch", "microbatch")
DEFAULT_SAMPLES = 32
K = TypeVar("K", bound=Hashable)  # a cost pool's key
# What a row with every rank at the mean compute is called (the best split in whole layers is
# "best split 5,4,3,4": tracekit.analyze.split)
IDEAL_BALANCE = "ideal balance"


@dataclass
class Prediction:
    label: str
    schedule: str
    p: int
    v: int
    m: int
    bubble_ratio: float  # mean over the replays
    bubble_sd: float
    step_ns: float  # mean step time (first compute start to last compute end)
    step_sd: float
    theory: float | None  # closed form, balanced and free messages
    basis: str  # "measured order" | "generated order"
    orders: str = ""  # where a generated order came from: torch's class or tracekit's generator
    keep: str = "global-batch"  # what the prediction keeps fixed when m changes (see the module doc)
    messages_per_step: int | None = None  # cross-rank messages one step passes
    in_flight: int | None = None  # most (stage, microbatch) activations one rank holds (tracekit.analyze.memory)
    activation_bytes: int | None = None  # their bytes, where an activation size is known (--search)
    ideal_balance: bool = False  # every rank at the mean compute: a bound, not a configuration to run
    # each pipeline rank's peak activation bytes (rank i of the order on the i-th measured
    # rank), where an activation size is known; over_budget: set where --memory-budget is given
    activation_bytes_per_rank: list[int] | None = None
    over_budget: bool | None = None

    @property
    def microbatch_ns(self) -> float:
        """Its step time per microbatch."""
        return self.step_ns / self.m

    def against(self, measured_step_ns: float) -> float:
        """Its step time's change against a measured step: +0.05 is 5% slower."""
        return self.step_ns / measured_step_ns - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "schedule": self.schedule,
            "p": self.p,
            "v": self.v,
            "m": self.m,
            "bubble_ratio": self.bubble_ratio,
            "bubble_sd": self.bubble_sd,
            "step_ns": int(round(self.step_ns)),
            "step_sd_ns": int(round(self.step_sd)),
            "theory_bubble_ratio": self.theory,
            "basis": self.basis,
            "keep": self.keep,
            "messages_per_step": self.messages_per_step,
            "in_flight": self.in_flight,
            "activation_bytes": self.activation_bytes,
            **({"orders": self.orders} if self.orders else {}),
            **(
                {"activation_bytes_per_rank": list(self.activation_bytes_per_rank)}
                if self.activation_bytes_per_rank is not None
                else {}
            ),
            **({"over_budget": self.over_budget} if self.over_budget is not None else {}),
        }


@dataclass
class WhatIf:
    source: str
    model: CostModel
    measured_bubble: float
    measured_step_ns: float
    as_measured: Prediction
    predictions: list[Prediction]
    skipped: list[str]
    keep: str
    samples: int
    assumptions: list[str]
    links: LinkChange | None = None
    search: Search | None = None
    recompute_memory: RecomputeMemory | None = None  # --no-recompute: activation memory on and off
    activation: ActivationSize | None = None  # what the rows' activation bytes were sized from
    memory_budget: int | None = None  # --memory-budget (without --search): rows over it are never the fastest

    @property
    def fastest(self) -> Prediction | None:
        """The prediction a user could run fastest, by what ``keep`` holds (:func:`fastest`),
        among those within ``memory_budget`` where one is given."""
        return fastest([p for p in self.predictions if not p.over_budget], self.keep)

    @property
    def fastest_of_all(self) -> Prediction | None:
        """The fastest row, in budget or not."""
        return fastest(self.predictions, self.keep)

    def fastest_where(self, runs: Callable[[str], bool]) -> Prediction | None:
        """The fastest of the rows whose label ``runs`` accepts (those a framework can run)
        and that fit the memory budget."""
        return fastest([p for p in self.predictions if runs(p.label) and not p.over_budget], self.keep)

    @property
    def measured_microbatch_ns(self) -> float:
        """The measured step's time per microbatch (``keep="microbatch"`` compares by it)."""
        return self.measured_step_ns / self.model.m

    def microbatch_against(self, p: Prediction) -> float:
        """``p``'s time per microbatch against the measured one's: +0.05 is 5% slower."""
        return p.microbatch_ns / self.measured_microbatch_ns - 1

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        extra: dict[str, Any] = {}
        if self.links is not None:
            extra["links"] = self.links.describe()
        if self.search is not None:
            extra["search"] = self.search.to_dict()
        if self.recompute_memory is not None:
            extra["recompute_memory"] = self.recompute_memory.to_dict()
        if self.search is None and (self.activation is not None or self.memory_budget is not None):
            best, first = self.fastest, self.fastest_of_all
            extra["memory"] = {
                "memory_budget_bytes": self.memory_budget,
                "activation_bytes_per_microbatch": None
                if self.activation is None
                else self.activation.bytes_per_microbatch,
                "activation_source": None if self.activation is None else self.activation.source,
                "fastest_within_budget": None if best is None else best.label,
                "fastest": None if first is None else first.label,
            }
        return {
            "source": self.source,
            "measured": {
                "schedule": m.schedule,
                "p": m.p,
                "v": m.v,
                "m": m.m,
                "bubble_ratio": self.measured_bubble,
                "step_ns": int(round(self.measured_step_ns)),
                "steps": len(m.graphs),
                "actions": m.n_actions,
                "messages": m.n_messages,
                "split_backward": m.split_backward,
            },
            "model_of_measured": self.as_measured.to_dict(),
            "predictions": [p.to_dict() for p in self.predictions],
            "skipped": list(self.skipped),
            "keep": self.keep,
            "replays_per_row": self.samples,
            "assumptions": list(self.assumptions),
            **extra,
        }


def _draw(
    rng: np.random.Generator, pools: Mapping[K, np.ndarray], keys: Sequence[K], fallback: np.ndarray | None = None
) -> np.ndarray:
    """One draw per key from its pool (grouped, so each pool is sampled once)."""
    out = np.zeros(len(keys), dtype=np.int64)
    by_key: dict[K, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    for key, rows in by_key.items():
        pool = pools.get(key, fallback)
        if pool is None:
            raise ValueError(f"no cost samples for {key!r} and no fallback pool")
        out[rows] = rng.choice(pool, len(rows))
    return out


def _replay_many(
    graph: StepGraph,
    model: CostModel,
    rng: np.random.Generator,
    samples: int,
    scale: float | np.ndarray,
    v: int,
    rank_of: np.ndarray,
    fused: np.ndarray | None = None,
    by_stage: bool = False,
    work_kinds: np.ndarray | None = None,
    m_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Bubble ratios and step times of ``samples`` replays with freshly drawn costs;
    ``scale`` multiplies the compute (a number, or one per action); ``fused`` marks actions
    whose overhead comes from the fused-label pool; ``by_stage``: compute drawn per stage
    chunk (replaying the measured order) instead of per rank; ``work_kinds``: the compute
    pool of each action's kind on its rank (default: its kind; see tracekit.analyze.costs._split_costs);
    ``m_scale``: a microbatch's rows scaled (--keep global-batch): each draw's per-row part
    scales, its fixed part stays (CostModel.m_scaled)."""
    if by_stage:  # the measured order: each action's own stage (a rank's chunks can differ)
        pools, work_keys = model.stage_work, list(zip(graph.stage.tolist(), graph.kind.tolist()))
    else:
        kinds = graph.kind if work_kinds is None else work_kinds
        pools, work_keys = model.work, list(zip(rank_of.tolist(), kinds.tolist()))
    ranks = rank_of.tolist()
    pairs = [(ranks[s], ranks[d]) for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist())]
    links: list[LinkKey] = list(pairs)
    if fused is not None and fused.any():  # messages into fused second halves: their own pool
        into_fused = fused[graph.edge_dst].tolist()
        links = [(a, b, "fused") if f else (a, b) for (a, b), f in zip(pairs, into_fused)]
    n_ranks = len(set(ranks))
    if m_scale != 1.0:
        per_key = {key: model.m_scaled(key, m_scale) for key in set(work_keys)}
        scale = scale * np.array([per_key[key] for key in work_keys])
    # Every sample's costs drawn first (in the same order as one replay after another), then
    # all replayed in one walk of the graph.
    scenarios: list[Scenario] = []
    busy_ns: list[int] = []
    for _ in range(samples):
        dur = np.rint(_draw(rng, pools, work_keys) * scale / v).astype(np.int64)
        ovh = _draw(rng, model.overhead, ranks)
        if fused is not None and fused.any():
            ovh[fused] = _draw(
                rng, model.fused_overhead, [ranks[i] for i in np.flatnonzero(fused)], model.all_overhead()
            )
        lat = _draw(rng, model.latency, links, model.all_latency)
        xfer = None
        if model.transfer:  # device messages (host runs draw nothing more: same answers as before)
            xfer = _draw(rng, model.transfer, links, model.all_transfer)
        if by_stage:  # dependencies the measured run passed no message on keep their latency
            lat = np.where(graph.edge_msg >= 0, lat, graph.edge_lat)
            xfer = None if xfer is None else np.where(graph.edge_msg >= 0, xfer, graph.edge_xfer)
        scenarios.append(Scenario(dur=dur, ovh=ovh, lat=lat, xfer=xfer))  # xfer None: the graph's (zeros on the host)
        busy_ns.append(int(dur.sum()))
    bubbles, steps = np.zeros(samples), np.zeros(samples)
    for i, result in enumerate(replay_many(graph, scenarios)):
        window = int(result.end.max() - result.start.min())
        steps[i] = window
        bubbles[i] = 1.0 - busy_ns[i] / (n_ranks * window) if window > 0 else 0.0
    return bubbles, steps


def as_measured(
    model: CostModel,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    activation: ActivationSize | None = None,
    label: str = "model of the measured run",
) -> Prediction:
    """The measured orders replayed with drawn costs: the model's own error (``activation``:
    also the activation bytes its order holds)."""
    rng = np.random.default_rng(seed)
    bubbles: list[float] = []
    steps: list[float] = []
    per_graph = max(1, -(-samples // max(1, len(model.graphs))))
    fused_of_graph: list[np.ndarray | None] = list(model.fused) or [None] * len(model.graphs)
    for graph, fused in zip(model.graphs, fused_of_graph):
        b, s = _replay_many(graph, model, rng, per_graph, 1.0, 1, graph.rank, fused, by_stage=True)
        bubbles.extend(b)
        steps.extend(s)
    theory = theoretical_bubble(model.schedule, model.p, model.v, model.m).bubble_ratio
    in_flight = bytes_held = None
    per_rank: list[int] | None = None
    if model.graphs:
        orders = orders_of_graph(model.graphs[0])
        in_flight = max(in_flight_per_rank(orders).values(), default=0)
        if activation is not None:
            held = activation_bytes_per_rank(orders, activation, model.v, model.m, model.m, "microbatch")
            bytes_held, per_rank = max(held.values(), default=0), [held[r] for r in sorted(held)]
    return Prediction(
        label,
        model.schedule,
        model.p,
        model.v,
        model.m,
        float(np.mean(bubbles)),
        float(np.std(bubbles)),
        float(np.mean(steps)),
        float(np.std(steps)),
        theory,
        "measured order",
        keep="as measured",
        messages_per_step=int(round(model.n_messages / max(1, len(model.graphs)))),
        in_flight=in_flight,
        activation_bytes=bytes_held,
        activation_bytes_per_rank=per_rank,
    )


def balance_factors(model: CostModel) -> dict[int, float]:
    """Per rank, what its compute is multiplied by when stages are re-split so that every
    rank computes the same (the total kept): mean over ranks / the rank's own, by medians."""
    per_rank = {r: float(np.median(model.work[(r, "F")]) + np.median(model.work[(r, "B")])) for r in model.ranks}
    mean = sum(per_rank.values()) / len(per_rank)
    return {r: (mean / c if c > 0 else 1.0) for r, c in per_rank.items()}


def predict(
    model: CostModel,
    schedule: str,
    v: int,
    m: int,
    keep: str = "global-batch",
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    balanced: bool = False,
    activation: ActivationSize | None = None,
    stage_costs: Mapping[tuple[int, str], float] | None = None,
    label: str | None = None,
    stage_activation_bytes: Sequence[float] | None = None,
) -> Prediction:
    """Replay ``schedule`` with ``v`` chunks a rank and ``m`` microbatches on the measured
    costs; ``balanced``: its ideal balance, every rank computing the mean;
    ``activation``: also the activation bytes the order holds on its fullest rank.
    ``stage_costs``: (target stage, "F" | "B") -> one microbatch's compute of that stage at
    the measured m, ns (a split of the layers, :mod:`tracekit.analyze.split`): each action's
    draws from its rank's samples are rescaled so that their mean is that cost (the rank's
    relative spread kept; the measured split gives back the measured costs).
    ``stage_activation_bytes``: what one microbatch (measured size) leaves on each target
    stage (a split's own layers), sizing the activations instead of ``activation``."""
    check_target(model, schedule, v, m)
    if keep not in KEEPS:
        raise TracekitError(f"--keep {keep!r}: choose one of {', '.join(KEEPS)}")
    try:
        orders, source = orders_for(schedule, model.p, v, m)
    except ValueError as err:
        raise TracekitError(f"{schedule} p={model.p} v={v} m={m}: {err}") from err
    graph = graph_from_orders(orders, {"F": 1, "B": 1, "I": 1, "W": 1})
    fused = flatten(orders)[1][graph.action_id]
    rank_of = np.array([model.ranks[r] for r in graph.rank.tolist()], dtype=np.int64)
    # stage 0's I and W draw from pools of their own (torch leaves that I empty)
    first_iw = (graph.stage == 0) & np.isin(graph.kind, ("I", "W"))
    work_kinds = np.where(first_iw, graph.kind.astype(str) + "0", graph.kind.astype(str))
    m_scale = model.m / m if keep == "global-batch" else 1.0
    scale: float | np.ndarray = 1.0
    if balanced:
        factors = balance_factors(model)
        scale = scale * np.array([factors[r] for r in rank_of.tolist()])
    if stage_costs is not None:  # draws are divided by v in the replay: undo it for a stage's own cost
        means = {key: float(np.mean(pool)) for key, pool in model.work.items()}
        scale = scale * np.array(
            [
                stage_costs[(s, k)] * v / means[(r, k)] if means[(r, k)] > 0 else 0.0
                for s, k, r in zip(graph.stage.tolist(), graph.kind.tolist(), rank_of.tolist())
            ]
        )
    rng = np.random.default_rng(seed)
    bubbles, steps = _replay_many(
        graph,
        model,
        rng,
        samples,
        scale,
        v,
        rank_of,
        fused if fused.any() else None,
        work_kinds=work_kinds,
        m_scale=m_scale,
    )
    theory = theoretical_bubble(schedule, model.p, v, m).bubble_ratio
    label = label or f"{schedule} v={v} m={m}" + (f" {IDEAL_BALANCE}" if balanced else "")
    in_flight = max(in_flight_per_rank(orders).values(), default=0)
    if stage_activation_bytes is not None:
        held = split_activation_bytes(orders, stage_activation_bytes, m, model.m, keep)
    else:
        held = activation_bytes_per_rank(orders, activation or ActivationSize(0, ""), v, m, model.m, keep, model.ranks)
    sized = activation is not None or stage_activation_bytes is not None
    return Prediction(
        label,
        schedule,
        model.p,
        v,
        m,
        float(bubbles.mean()),
        float(bubbles.std()),
        float(steps.mean()),
        float(steps.std()),
        theory,
        "generated order",
        source if schedule in ZERO_BUBBLE else "",
        keep=keep,
        messages_per_step=len(graph.edge_src),
        in_flight=in_flight,
        activation_bytes=max(held.values(), default=0) if sized else None,
        ideal_balance=balanced,
        activation_bytes_per_rank=[held[r] for r in sorted(held)] if sized else None,
    )


def fastest(predictions: Sequence[Prediction], keep: str) -> Prediction | None:
    """The prediction a user could run fastest: the shortest step (``keep="global-batch"``) or
    time per microbatch (``"microbatch"``: the steps do different work); ideal-balance rows
    are bounds, not configurations, and never the answer."""
    runnable = [p for p in predictions if not p.ideal_balance]
    if not runnable:
        return None
    if keep == "global-batch":
        return min(runnable, key=lambda p: p.step_ns)
    return min(runnable, key=lambda p: p.microbatch_ns)


def check_target(model: CostModel, schedule: str, v: int, m: int) -> None:
    """Raise a one-line error for a configuration that cannot be generated."""
    if schedule not in ALL_TARGETS:
        raise TracekitError(f"{schedule}: what-if generates {', '.join(ALL_TARGETS)}")
    if m < 1 or v < 1:
        raise TracekitError(f"{schedule} v={v} m={m}: v and m must be 1 or more")
    if schedule in ("GPipe", "1F1B") and v != 1:
        raise TracekitError(f"{schedule} has one chunk per rank: use v=1 (or Interleaved1F1B for v={v})")
    if schedule == "Interleaved1F1B":
        if v < 2:
            raise TracekitError("Interleaved1F1B needs v >= 2 chunks per rank")
        if m % model.p:
            raise TracekitError(f"Interleaved1F1B needs m to be a multiple of p={model.p} (got m={m})")
    if schedule == "ZB-H1" and v != 1:
        raise TracekitError(f"ZB-H1 has one chunk per rank: use v=1 (or InterleavedZeroBubble for v={v})")
    if schedule == "InterleavedZeroBubble":
        if v < 2:
            raise TracekitError("InterleavedZeroBubble needs v >= 2 chunks per rank (ZB-H1 is its v=1)")
        rounds = max(1, m // model.p)
        if m % rounds:
            raise TracekitError(
                f"InterleavedZeroBubble needs m to split into rounds of about p microbatches "
                f"(m // p = {rounds} rounds; got m={m})"
            )
    if schedule in V_PLACED and v != 2:
        raise TracekitError(f"{schedule} places exactly 2 stages per rank in a V: use v=2")
    if schedule == "DualPipeV" and m < 2 * model.p:
        raise TracekitError(f"DualPipeV needs m >= 2p = {2 * model.p} microbatches (got m={m})")


def check_ranks(model: CostModel, p: int | None) -> None:
    """Refuse a target with another number of ranks, in one line."""
    if p is not None and p != model.p:
        raise TracekitError(
            f"p={p}: changing the number of ranks is out of scope; what-if keeps the measured "
            f"run's p={model.p} (its ranks, links and stage placement) and varies the schedule, v and m"
        )


def _grid(model: CostModel) -> tuple[str, ...]:
    """The schedules a what-if tries unasked: :data:`TARGETS`, and the measured one where it
    is generated with whole backwards but not offered by default (a LoopedBFS run)."""
    own = model.schedule
    mine = own in traits.names(generated=True, split_backward=False) and own not in TARGETS
    return (*TARGETS, own) if mine else TARGETS


def default_targets(model: CostModel) -> list[tuple[str, int, int]]:
    """What a user would try first: each schedule at the measured m, and twice m."""
    v_int = model.v if model.v >= 2 else 2
    return [(s, traits.chunks_per_rank(s, several=v_int), m) for m in (model.m, 2 * model.m) for s in _grid(model)]


def requested_targets(
    model: CostModel, schedules: Sequence[str] = (), vs: Sequence[int] = (), ms: Sequence[int] = ()
) -> list[tuple[str, int, int]]:
    """The targets ``-s`` / ``-v`` / ``-m`` ask for: each schedule (none given: the ones with
    whole backwards, or Interleaved1F1B where only v is given) at each m (the measured m and
    twice it unless given) and each v it takes: 1 for one chunk a rank, the V's 2, else the
    given v (the V's too, where v is given: checked later), the measured v, or 2."""
    chosen = schedules or (("Interleaved1F1B",) if vs else _grid(model))
    m_values = ms or (model.m, 2 * model.m)
    v_interleaved = tuple(vs) or ((model.v if model.v >= 2 else 2),)

    def chunks(schedule: str) -> tuple[int, ...]:
        per_rank = traits.BY_NAME[schedule].chunks
        if per_rank == "one":
            return (1,)
        return (2,) if per_rank == "two" and not vs else v_interleaved

    return [(s, v, m) for s in chosen for v in chunks(s) for m in m_values]


def zero_bubble_targets(model: CostModel) -> list[tuple[str, int, int]]:
    """The zero-bubble family at the measured m, those that this p and m allow."""
    out = []
    for schedule in ZERO_BUBBLE:
        v = traits.chunks_per_rank(schedule, several=2)
        try:
            check_target(model, schedule, v, model.m)
        except TracekitError:
            continue
        out.append((schedule, v, model.m))
    return out


def replays_within(
    budget: int, p: int, targets: list[tuple[str, int, int]], rows_per_target: int = 1, most: int = DEFAULT_SAMPLES
) -> int:
    """Replays per prediction that keep ``targets`` (each ``rows_per_target`` times) within
    ``budget`` replayed actions in all (a replay costs Python time per action), at most ``most``."""
    size = rows_per_target * sum(2 * v * m * p for _, v, m in targets)
    return min(most, budget // max(size, 1))


def what_if(
    run: Run,
    targets: list[tuple[str, int, int]] | None = None,
    keep: str = "global-batch",
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    balanced: bool = False,
    model: CostModel | None = None,
    bubbles: pd.DataFrame | None = None,
    links: LinkChange | None = None,
    activation: ActivationSize | None = None,
    p: int | None = None,
    progress: Callable[[str], None] | None = None,
    no_recompute: dict[int, int] | None = None,
    recompute_memory: RecomputeMemory | None = None,
    memory_budget: int | None = None,
) -> WhatIf:
    """Predict every target (schedule, v, m) (default: :func:`default_targets`; the
    zero-bubble family, :func:`zero_bubble_targets`, when asked for); targets that cannot be generated are skipped with the reason. ``balanced``: every target also at its ideal balance.
    ``model`` and ``bubbles`` (the run's cost model and measured bubble table), when the
    caller has them already. ``links``: every prediction with the message latencies changed
    (the measured order too, as a row of its own; the model-of-the-measured row keeps the
    measured links: it is the model's error). ``activation``: rows also say the activation
    bytes their order holds. ``p``: the targets' number of ranks, refused unless the
    measured one (changing p is out of scope). ``progress`` is told each target as its
    replays start. ``no_recompute``: per rank the recomputation a backward sheds (ns), every
    prediction without it; ``recompute_memory``: what that costs in activation memory.
    ``memory_budget``: rows whose activations (sized by ``activation``) exceed it are marked
    and never the fastest."""
    from tracekit.analyze.bubbles import measure_pipeline

    model = cost_model(run) if model is None else model
    check_ranks(model, p)
    measured_model = model
    if links is not None:
        model = with_links(model, links)
    if no_recompute is not None:
        model = without_recompute(model, no_recompute, ranks_by_stage(run.actions))
    if bubbles is None:
        bubbles = measure_pipeline(run.actions[run.actions["step"] >= 0])
    measured_bubble = float(bubbles["idle_ns"].sum() / max(1, bubbles["window_ns"].sum()))
    measured_step = float(bubbles.groupby("step")["window_ns"].first().mean())
    predictions: list[Prediction] = []
    skipped: list[str] = []
    if links is not None or no_recompute is not None:
        changed = [links.short()] if links is not None else []
        changed += ["no recomputation"] if no_recompute is not None else []
        predictions.append(as_measured(model, samples, seed, activation, f"measured order, {', '.join(changed)}"))
    # The zero-bubble family only when asked for: its orders come from torch's classes, and
    # importing torch's pipelining takes seconds (3.3 s here), more than all the replays of a
    # default what-if; the output says how to ask.
    chosen = targets or default_targets(model)
    for k, (schedule, v, m) in enumerate(chosen):
        if progress:
            progress(f"what-if: {schedule} v={v} m={m} ({k + 1} of {len(chosen)}, {samples} replays)")
        try:
            predictions.append(predict(model, schedule, v, m, keep, samples, seed, activation=activation))
            if balanced:
                predictions.append(
                    predict(model, schedule, v, m, keep, samples, seed, balanced=True, activation=activation)
                )
        except TracekitError as err:
            if targets:  # asked for explicitly: say why not
                skipped.append(str(err))
    if not predictions and skipped:
        raise TracekitError(skipped[0])
    if memory_budget is not None:
        for pr in predictions:
            if pr.activation_bytes is not None:
                pr.over_budget = pr.activation_bytes > memory_budget
    assumptions = [
        f"compute per microbatch and rank, overheads and latencies drawn from {model.n_actions} "
        f"measured actions and {model.n_messages} messages; {samples} replays per row",
        "a rank's layers split evenly over its chunks (compute per chunk = rank compute / v)",
        keep_assumption(keep, model),
        "message latencies as measured (links the run never used take the pooled samples)"
        if links is None
        else f"message latencies: {links.describe()} (links the run never used take the pooled samples)",
    ]
    if not targets:
        offered = ", ".join(f"-s {s}" for s, _, _ in zero_bubble_targets(model))
        if offered:
            assumptions.append(
                f"zero-bubble targets on request ({offered}), or all of them with --search --memory-budget SIZE"
            )
    if any(pr.schedule in ZERO_BUBBLE for pr in predictions):
        assumptions.append(model.iw_source)
        sources = dict.fromkeys(f"{pr.schedule}: {pr.orders}" for pr in predictions if pr.orders)
        assumptions.append("zero-bubble orders from " + "; ".join(sources))
    if any(pr.schedule == "DualPipeV" for pr in predictions):
        assumptions.append(
            "DualPipeV's fused pairs (OVERLAP_F_B) run their halves back to back (no compute overlap "
            "on one device) and send both outputs after the second, as torch does"
        )
    if balanced:
        factors = balance_factors(model)
        assumptions.append(
            f"'{IDEAL_BALANCE}' rows: every rank computes the mean (the total kept, as if layers could be cut "
            "anywhere; a bound on what a split buys): " + ", ".join(f"rank {r} x{f:.2f}" for r, f in factors.items())
        )
    if no_recompute is not None:
        assumptions.append(
            "recomputation off: each backward without the forward it ran again ("
            + ", ".join(f"rank {r} -{ns / 1e6:.1f} ms" for r, ns in sorted(no_recompute.items()))
            + " a backward, as measured); "
            + (
                "the activations it kept out of memory are not sized here"
                if recompute_memory is None
                else "what it kept out of memory: 'activation memory' (sized from the traces' op shapes)"
            )
        )
    if model.held_back:
        assumptions.append(
            f"{model.held_back} sends were held back by their sender behind a receive of its own: "
            "their latency counts from the send's post, not from the producer's end"
        )
    return WhatIf(
        run.source,
        model,
        measured_bubble,
        measured_step,
        as_measured(measured_model, samples, seed, activation),
        predictions,
        skipped,
        keep,
        samples,
        assumptions,
        links,
        recompute_memory=recompute_memory,
        activation=activation,
        memory_budget=memory_budget,
    )


def keep_assumption(keep: str, model: CostModel | None = None) -> str:
    """What a prediction with this ``--keep`` assumes, in one line (quoted wherever it is;
    ``model``: also the share of its compute that is fixed per op)."""
    if keep == "global-batch":
        fixed = ""
        if model is not None and any(model.fixed_share.values()):
            fixed = f": {100 * float(np.median(list(model.fixed_share.values()))):.0f}% of an action here, median"
        elif model is not None:
            fixed = ": none here, the ops inside the actions were not read"
        return (
            "--keep global-batch: the step's samples kept, so an action's work ops scale as 1/m "
            "(measured m / target m) and its fixed part (the small ops and the gaps between ops, measured per "
            f"rank and kind{fixed}) stays; only approximately true on GPUs, where small microbatches use the "
            "device less well"
        )
    return (
        "--keep microbatch: microbatches keep their size, compute per microbatch as measured, the step does more work"
    )


# The search's grid (narrowed by the user's -s / -v / -m): chunks per rank, and multiples of
# the measured m.
SEARCH_VS = (1, 2, 4, 8)
SEARCH_M_FACTORS = (0.5, 1, 2, 4)
# Replayed actions the whole search may cost (each row gets at least SEARCH_MIN_REPLAYS).
SEARCH_REPLAY_BUDGET = 4_000_000
SEARCH_MIN_REPLAYS = 4


@dataclass
class Search:
    """The fastest (schedule, v, m) whose activations fit ``budget_bytes`` on every rank, and
    per (schedule, v) the fastest m that fits (the V trade-off: more chunks, a smaller bubble,
    more messages)."""

    budget_bytes: int
    activation: ActivationSize
    objective: str  # "step time" (global batch kept) | "time per microbatch" (microbatch size kept)
    best: Prediction | None  # None: nothing fits
    per_v: list[Prediction]
    message_latency_ns: int  # median per-message latency the predictions draw from
    fastest: Prediction | None = None  # the fastest of all, in budget or not

    def fits(self, p: Prediction) -> bool:
        return p.activation_bytes is not None and p.activation_bytes <= self.budget_bytes

    def over_budget(self, p: Prediction) -> bool:
        """Its activations are known and exceed the budget (an unknown size is neither)."""
        return p.activation_bytes is not None and p.activation_bytes > self.budget_bytes

    def cost(self, p: Prediction) -> float:
        return p.microbatch_ns if self.objective == "time per microbatch" else p.step_ns

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_budget_bytes": self.budget_bytes,
            "activation_bytes_per_microbatch": self.activation.bytes_per_microbatch,
            "activation_source": self.activation.source,
            "objective": self.objective,
            "best": None if self.best is None else self.best.label,
            "fastest": None if self.fastest is None else self.fastest.label,
            "per_v": [p.label for p in self.per_v],
            "message_latency_ns": self.message_latency_ns,
        }


def search_targets(
    model: CostModel, schedules: Sequence[str] = (), vs: Sequence[int] = (), ms: Sequence[int] = ()
) -> list[tuple[str, int, int]]:
    """The grid a search replays: every generated schedule (or ``schedules``), v in
    ``SEARCH_VS`` (or ``vs``), m a multiple of the measured m (or ``ms``), keeping only what
    each schedule can be generated with."""
    m_values = ms or sorted({max(1, int(model.m * f)) for f in SEARCH_M_FACTORS})
    out = []
    for schedule in schedules or ALL_TARGETS:  # every schedule with a generated order
        for v in vs or SEARCH_VS:
            for m in m_values:
                try:
                    check_target(model, schedule, v, m)
                except TracekitError:
                    continue
                out.append((schedule, v, m))
    return out


def search(
    run: Run,
    budget_bytes: int,
    activation: ActivationSize,
    keep: str = "global-batch",
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    schedules: Sequence[str] = (),
    vs: Sequence[int] = (),
    ms: Sequence[int] = (),
    links: LinkChange | None = None,
    model: CostModel | None = None,
) -> WhatIf:
    """Replay the search grid (:func:`search_targets`) and pick the fastest target whose
    activations fit ``budget_bytes`` per rank (time per microbatch with ``keep="microbatch"``:
    those steps do different amounts of work)."""
    model = cost_model(run) if model is None else model
    targets = search_targets(model, schedules, vs, ms)
    if not targets:
        raise TracekitError("--search: no (schedule, v, m) in the grid can be generated; widen -s / -v / -m")
    samples = min(samples, max(SEARCH_MIN_REPLAYS, replays_within(SEARCH_REPLAY_BUDGET, model.p, targets)))
    result = what_if(run, targets, keep, samples, seed, model=model, links=links, activation=activation)
    objective = "time per microbatch" if keep == "microbatch" else "step time"
    drawn = with_links(model, links) if links is not None else model
    found = Search(budget_bytes, activation, objective, None, [], int(np.median(drawn.all_latency)))
    generated = [p for p in result.predictions if p.basis == "generated order"]
    fitting = [p for p in generated if found.fits(p)]
    found.best = min(fitting, key=found.cost) if fitting else None
    found.fastest = min(generated, key=found.cost) if generated else None
    by_v: dict[tuple[str, int], list[Prediction]] = {}
    for p in generated:
        by_v.setdefault((p.schedule, p.v), []).append(p)
    for rows in by_v.values():
        fit = [p for p in rows if found.fits(p)]
        # nothing fits: the row that needs the least memory, shown over the budget
        found.per_v.append(min(fit, key=found.cost) if fit else min(rows, key=lambda p: p.activation_bytes or 0))
    result.search = found
    result.assumptions.append(
        f"activation memory per rank: peak (stage, microbatch) pairs in flight x {activation.source} "
        "(weights, gradients and optimizer state are the same for every target: p is kept, and not counted)"
    )
    return result
