"""What-if: the bubble and step time of another schedule, v or m, predicted by replay.

The measured run gives a cost model, in samples rather than averages (a pipeline's step is a
max over many paths, so the spread of the costs matters, not just their typical value):

- **compute**: for each rank and kind (F, B, I, W), one microbatch's compute on that rank,
  i.e. each measured action's duration times the measured v (a rank's layers split evenly
  over its chunks). Where the run split its backwards, B is drawn as I + W.
- **overhead**: each measured action's host overhead, per rank (the gap between "data there
  and rank free" and the compute starting); the second halves of fused labels (DualPipeV's
  ``OVERLAP_F_B``) in a pool of their own, used only where the replayed order fuses too.
- **latency**: each matched message's latency, per link (src rank -> dst rank); a link the
  measured run never used takes the samples of all links. Messages into the second half of
  a fused label have a pool of their own: their "latency" includes the first half's compute
  (the receiver only waited once it was done).

A prediction generates the target schedule's per-rank order
(:mod:`tracekit.analyze.schedules`), draws every action's compute (divided by the target v),
overhead and every message's latency from those samples, replays the step
(:mod:`tracekit.analyze.replay`) and repeats; the mean and spread over the replays are
reported. The same draws replayed on the *measured* order give the model's own error, shown
beside every prediction. With constant costs and free messages, predictions equal the
closed forms exactly (tested); on the project's real sample runs they are within a few
points of the runs captured with the other schedules (tested; see README).

``balanced=True`` adds, for every target, the same schedule with the stages re-split so that
every rank computes the mean (the run's total compute kept): how much a better split of the
layers would buy.

``keep="global-batch"`` (default): the step processes the same samples, so a microbatch's
compute scales with measured m / target m; ``keep="microbatch"``: microbatches keep their
size and the step does more work. Latencies are kept as measured in both (a message's size
changes with the microbatch, but its fixed cost dominates at these sizes; an assumption).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyze.replay import StepGraph, replay, step_graphs
from tracekit.analyze.schedules import GENERATORS, graph_from_orders
from tracekit.analyze.theory import theoretical_bubble
from tracekit.errors import TracekitError
from tracekit.model.run import Run

TARGETS = tuple(GENERATORS)  # schedules whose orders can be generated
KEEPS = ("global-batch", "microbatch")
DEFAULT_SAMPLES = 32
# A message pool: (src rank, dst rank), or (src, dst, "fused") for messages into the second
# half of a fused label (see _fused)
LinkKey = tuple[int, int] | tuple[int, int, str]
K = TypeVar("K", bound=Hashable)  # a cost pool's key


@dataclass
class CostModel:
    """Cost samples of one measured run (see the module doc)."""

    schedule: str
    p: int
    v: int
    m: int
    ranks: list[int]
    work: dict[tuple[int, str], np.ndarray]  # (rank, kind) -> one microbatch on the rank, ns
    overhead: dict[int, np.ndarray]  # rank -> ns (actions that start a label)
    latency: dict[LinkKey, np.ndarray]  # (src rank, dst rank[, "fused"]) -> ns
    all_latency: np.ndarray
    # Device messages' rendezvous transfers (see replay), pooled like latency; empty on the host.
    transfer: dict[LinkKey, np.ndarray] = field(default_factory=dict)
    all_transfer: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    fused_overhead: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> ns, second halves of fused labels
    stage_work: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # (stage, kind) -> one chunk, ns
    graphs: list[StepGraph] = field(default_factory=list)  # the measured steps
    fused: list[np.ndarray] = field(default_factory=list)  # per graph: action continues its predecessor's label
    n_actions: int = 0
    n_messages: int = 0

    def all_overhead(self) -> np.ndarray:
        return np.concatenate([*self.overhead.values(), *self.fused_overhead.values()])


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

    def to_dict(self) -> dict[str, Any]:
        m = self.model
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
            },
            "model_of_measured": self.as_measured.to_dict(),
            "predictions": [p.to_dict() for p in self.predictions],
            "skipped": list(self.skipped),
            "keep": self.keep,
            "replays_per_row": self.samples,
            "assumptions": list(self.assumptions),
        }


def cost_model(run: Run, graphs: list[StepGraph] | None = None) -> CostModel:
    """The cost samples of a reconstructed pipeline run (from its step ``graphs`` when the
    caller has them already)."""
    if run.completeness is not None and run.completeness.single_rank:
        raise TracekitError(
            f"{run.source}: one rank: no pipeline to vary; what-if needs every rank of a pipeline-parallel run"
        )
    sched = run.schedule
    if sched is None or not run.is_pipeline:
        raise TracekitError(
            f"{run.source}: no pipeline actions found, so there is no schedule to vary; "
            "what-if needs a pipeline-parallel run"
        )
    if run.completeness is not None and not run.completeness.complete:
        raise TracekitError(
            f"{run.source}: incomplete run: {run.completeness.missing_text()}; what-if "
            "replays the whole pipeline, so it needs every rank's trace"
        )
    if sched.flush_free:
        # the targets are flushed schedules replayed step by step; a flush-free run's steps
        # hold microbatches of its neighbours' steps, so its "measured step" is no such thing
        raise TracekitError(
            f"{run.source}: {sched.name} has no flush: what-if replays flushed steps, and "
            "this run's steps overlap by design; compare it with a flushed capture instead"
        )
    graphs = list(step_graphs(run).values()) if graphs is None else list(graphs)
    per_kind: dict[tuple[int, str], list[int]] = {}
    overhead: dict[int, list[int]] = {}
    fused_overhead: dict[int, list[int]] = {}
    per_stage: dict[tuple[int, str], list[int]] = {}
    latency: dict[LinkKey, list[int]] = {}
    transfer: dict[LinkKey, list[int]] = {}
    labels = run.actions.set_index("action_id")[["label", "label_start_ns"]]
    fused_of_graph = [_fused(labels, g) for g in graphs]
    for g, fused in zip(graphs, fused_of_graph):
        for r, k, d, o, f in zip(g.rank.tolist(), g.kind.tolist(), g.dur.tolist(), g.ovh.tolist(), fused.tolist()):
            per_kind.setdefault((r, k), []).append(d * sched.v)
            (fused_overhead if f else overhead).setdefault(r, []).append(o)
        for s, k, d in zip(g.stage.tolist(), g.kind.tolist(), g.dur.tolist()):
            per_stage.setdefault((s, k), []).append(d)
        for s, d, lat, xfer, msg in zip(g.edge_src, g.edge_dst, g.edge_lat, g.edge_xfer, g.edge_msg):
            if msg >= 0:  # into the second half of a fused label: its own pool (see _fused)
                key: LinkKey = (
                    (int(g.rank[s]), int(g.rank[d])) if not fused[d] else (int(g.rank[s]), int(g.rank[d]), "fused")
                )
                latency.setdefault(key, []).append(int(lat))
                transfer.setdefault(key, []).append(int(xfer))
    # Generated orders place stages on the first replica's ranks (the others repeat it).
    ranks = sorted(sched.pipelines[0]) if sched.pipelines else sorted(set(overhead) | set(fused_overhead))
    for r in ranks:  # a rank whose every action continues a fused label: use those
        if r not in overhead and r in fused_overhead:
            overhead[r] = list(fused_overhead[r])
    work: dict[tuple[int, str], np.ndarray] = {}
    rng = np.random.default_rng(0)
    for (r, k), samples in per_kind.items():
        work[(r, k)] = np.array(samples, dtype=np.int64)
    for r in ranks:
        if (r, "B") not in work and (r, "I") in work and (r, "W") in work:
            i_s, w_s = work[(r, "I")], work[(r, "W")]
            n = max(len(i_s), len(w_s))
            work[(r, "B")] = rng.choice(i_s, n) + rng.choice(w_s, n)  # I and W paired at random
        for kind, name in (("F", "forward"), ("B", "backward")):
            if (r, kind) not in work:
                raise TracekitError(f"{run.source}: rank {r} has no {name} actions; what-if needs both on every rank")
    all_latency = np.array([x for k, v in latency.items() if len(k) == 2 for x in v] or [0], dtype=np.int64)
    return CostModel(
        schedule=sched.name,
        p=sched.p,
        v=sched.v,
        m=sched.m,
        ranks=ranks,
        work=work,
        overhead={r: np.array(v, dtype=np.int64) for r, v in overhead.items()},
        fused_overhead={r: np.array(v, dtype=np.int64) for r, v in fused_overhead.items()},
        fused=fused_of_graph,
        stage_work={k: np.array(v, dtype=np.int64) for k, v in per_stage.items()},
        latency={k: np.array(v, dtype=np.int64) for k, v in latency.items()},
        all_latency=all_latency,
        graphs=graphs,
        transfer={k: np.array(v, dtype=np.int64) for k, v in transfer.items() if any(v)},
        all_transfer=np.array([x for k, v in transfer.items() if len(k) == 2 for x in v] or [0], dtype=np.int64),
        n_actions=sum(len(g.action_id) for g in graphs),
        n_messages=int(sum((g.edge_msg >= 0).sum() for g in graphs)),
    )


def _fused(labels: pd.DataFrame, graph: StepGraph) -> np.ndarray:
    """Per action: whether it is the second half of a fused label (DualPipeV's
    ``OVERLAP_F_B`` runs a forward and a backward in one label, back to back): its
    "overhead" is the gap inside the label, not a host gap between actions. ``labels``:
    the run's actions' label and label start, indexed by action id."""
    label = labels["label"].reindex(graph.action_id).fillna("").to_numpy()
    start = labels["label_start_ns"].reindex(graph.action_id).to_numpy()
    prev = graph.prev
    out = np.zeros(len(prev), dtype=bool)
    has_prev = prev >= 0
    out[has_prev] = (label[has_prev] != "") & (start[has_prev] == start[prev[has_prev]])
    return out


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
) -> tuple[np.ndarray, np.ndarray]:
    """Bubble ratios and step times of ``samples`` replays with freshly drawn costs;
    ``scale`` multiplies the compute (a number, or one per action); ``fused`` marks actions
    whose overhead comes from the fused-label pool; ``by_stage``: compute drawn per stage
    chunk (replaying the measured order) instead of per rank."""
    if by_stage:  # the measured order: each action's own stage (a rank's chunks can differ)
        pools, work_keys = model.stage_work, list(zip(graph.stage.tolist(), graph.kind.tolist()))
    else:
        pools, work_keys = model.work, list(zip(rank_of.tolist(), graph.kind.tolist()))
    ranks = rank_of.tolist()
    pairs = [(ranks[s], ranks[d]) for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist())]
    links: list[LinkKey] = list(pairs)
    if fused is not None and fused.any():  # messages into fused second halves: their own pool
        into_fused = fused[graph.edge_dst].tolist()
        links = [(a, b, "fused") if f else (a, b) for (a, b), f in zip(pairs, into_fused)]
    n_ranks = len(set(ranks))
    bubbles, steps = np.zeros(samples), np.zeros(samples)
    for i in range(samples):
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
        result = replay(graph, dur=dur, ovh=ovh, lat=lat, xfer=xfer)  # None: the graph's (zeros on the host)
        window = int(result.end.max() - result.start.min())
        steps[i] = window
        bubbles[i] = 1.0 - dur.sum() / (n_ranks * window) if window > 0 else 0.0
    return bubbles, steps


def as_measured(model: CostModel, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> Prediction:
    """The measured orders replayed with drawn costs: the model's own error."""
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
    return Prediction(
        "model of the measured run",
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
) -> Prediction:
    """Replay ``schedule`` with ``v`` chunks a rank and ``m`` microbatches on the measured
    costs; ``balanced``: with layers moved between stages so every rank computes the same."""
    check_target(model, schedule, v, m)
    if keep not in KEEPS:
        raise TracekitError(f"--keep {keep!r}: choose one of {', '.join(KEEPS)}")
    orders = GENERATORS[schedule](model.p, v, m)
    graph = graph_from_orders(orders, {"F": 1, "B": 1})
    rank_of = np.array([model.ranks[r] for r in graph.rank.tolist()], dtype=np.int64)
    scale: float | np.ndarray = model.m / m if keep == "global-batch" else 1.0
    if balanced:
        factors = balance_factors(model)
        scale = scale * np.array([factors[r] for r in rank_of.tolist()])
    rng = np.random.default_rng(seed)
    bubbles, steps = _replay_many(graph, model, rng, samples, scale, v, rank_of)
    theory = theoretical_bubble(schedule, model.p, v, m).bubble_ratio
    label = f"{schedule} v={v} m={m}" + (" balanced" if balanced else "")
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
    )


def check_target(model: CostModel, schedule: str, v: int, m: int) -> None:
    """Raise a one-line error for a configuration that cannot be generated."""
    if schedule not in TARGETS:
        raise TracekitError(
            f"{schedule}: what-if generates {', '.join(TARGETS)} so far; "
            "zero-bubble and DualPipeV orders are not generated yet"
        )
    if m < 1 or v < 1:
        raise TracekitError(f"{schedule} v={v} m={m}: v and m must be 1 or more")
    if schedule in ("GPipe", "1F1B") and v != 1:
        raise TracekitError(f"{schedule} has one chunk per rank: use v=1 (or Interleaved1F1B for v={v})")
    if schedule == "Interleaved1F1B":
        if v < 2:
            raise TracekitError("Interleaved1F1B needs v >= 2 chunks per rank")
        if m % model.p:
            raise TracekitError(f"Interleaved1F1B needs m to be a multiple of p={model.p} (got m={m})")


def default_targets(model: CostModel) -> list[tuple[str, int, int]]:
    """What a user would try first: each schedule at the measured m, and twice m."""
    v_int = model.v if model.v >= 2 else 2
    out = []
    for m in (model.m, 2 * model.m):
        out += [("GPipe", 1, m), ("1F1B", 1, m), ("Interleaved1F1B", v_int, m)]
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
    progress: Callable[[str], None] | None = None,
) -> WhatIf:
    """Predict every target (schedule, v, m); targets that cannot be generated are skipped
    with the reason. ``balanced``: every target also with stages re-split evenly.
    ``model`` and ``bubbles`` (the run's cost model and measured bubble table), when the
    caller has them already. ``progress`` is told each target as its replays start."""
    from tracekit.analyze.bubbles import measure_pipeline

    model = cost_model(run) if model is None else model
    if bubbles is None:
        bubbles = measure_pipeline(run.actions[run.actions["step"] >= 0])
    measured_bubble = float(bubbles["idle_ns"].sum() / max(1, bubbles["window_ns"].sum()))
    measured_step = float(bubbles.groupby("step")["window_ns"].first().mean())
    predictions: list[Prediction] = []
    skipped: list[str] = []
    chosen = targets or default_targets(model)
    for k, (schedule, v, m) in enumerate(chosen):
        if progress:
            progress(f"what-if: {schedule} v={v} m={m} ({k + 1} of {len(chosen)}, {samples} replays)")
        try:
            predictions.append(predict(model, schedule, v, m, keep, samples, seed))
            if balanced:
                predictions.append(predict(model, schedule, v, m, keep, samples, seed, balanced=True))
        except TracekitError as err:
            if targets:  # asked for explicitly: say why not
                skipped.append(str(err))
    if not predictions and skipped:
        raise TracekitError(skipped[0])
    assumptions = [
        f"compute per microbatch and rank, overheads and latencies drawn from {model.n_actions} "
        f"measured actions and {model.n_messages} messages; {samples} replays per row",
        "a rank's layers split evenly over its chunks (compute per chunk = rank compute / v)",
        (
            "global batch kept: compute per microbatch scales with measured m / target m"
            if keep == "global-batch"
            else "microbatch size kept: compute per microbatch as measured, the step does more work"
        ),
        "message latencies as measured (links the run never used take the pooled samples)",
    ]
    if balanced:
        factors = balance_factors(model)
        assumptions.append(
            "'balanced' rows: layers moved between stages so every rank computes the same; "
            + ", ".join(f"rank {r} x{f:.2f}" for r, f in factors.items())
        )
    return WhatIf(
        run.source,
        model,
        measured_bubble,
        measured_step,
        as_measured(model, samples, seed),
        predictions,
        skipped,
        keep,
        samples,
        assumptions,
    )


# The report's what-if: each default target twice (as is and balanced), within about this
# many replayed actions in all, and at most this many replays per row.
REPORT_REPLAY_BUDGET = 1_000_000
REPORT_REPLAYS = 16
# Fewer replays per row than this say too little about the spread to be worth a table.
REPORT_MIN_REPLAYS = 4


@dataclass(frozen=True)
class ReportWhatIf:
    """The what-if table of a report (the default targets, as is and balanced), or why
    there is none: ``note`` says what a reader of the report should know instead."""

    result: WhatIf | None
    note: str = ""


def report_what_if(
    run: Run, graphs: list[StepGraph], bubbles: pd.DataFrame, progress: Callable[[str], None] | None = None
) -> ReportWhatIf:
    """The default what-if (``tracekit whatif --balanced``) on the step graphs the
    attribution replayed; a run that cannot be varied gets the reason instead."""
    try:
        model = cost_model(run, graphs)
    except TracekitError as err:
        return ReportWhatIf(None, f"What if: not computed: {err}")
    targets = default_targets(model)
    samples = replays_within(REPORT_REPLAY_BUDGET, model.p, targets, rows_per_target=2, most=REPORT_REPLAYS)
    if samples < REPORT_MIN_REPLAYS:
        return ReportWhatIf(
            None,
            f"What if: not computed here: {model.p} ranks and m={model.m} are too large "
            f"to replay {REPORT_MIN_REPLAYS} times per row within the report's budget; "
            "run tracekit whatif with the targets you want",
        )
    try:
        result = what_if(run, targets, samples=samples, balanced=True, model=model, bubbles=bubbles, progress=progress)
    except TracekitError as err:
        return ReportWhatIf(None, f"What if: not computed: {err}")
    return ReportWhatIf(result)
