"""What-if: the bubble and step time of another schedule, v or m, predicted by replay.

The measured run gives a cost model, in samples rather than averages (a pipeline's step is a
max over many paths, so the spread of the costs matters, not just their typical value):

- **compute**: for each rank and kind (F, B, I, W), one microbatch's compute on that rank,
  i.e. each measured action's duration times the measured v (a rank's layers split evenly
  over its chunks). Where the run split its backwards, B is drawn as I + W. The zero-bubble
  targets' I and W (ZB-H1, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV): as measured
  where the run split its backwards, else each half of the measured B (an assumption, said
  in the output; on the project's samples a split backward costs ~4-6% more than a whole
  one, which that estimate misses); stage 0 on its own either way, since torch leaves its I
  empty and runs the whole backward in W (see ``_split_costs``).
- **overhead**: each measured action's host overhead, per rank (the gap between "data there
  and rank free" and the compute starting); the second halves of fused labels (DualPipeV's
  ``OVERLAP_F_B``) in a pool of their own, used only where the replayed order fuses too.
- **latency**: each matched message's latency, per link (src rank -> dst rank); a link the
  measured run never used takes the samples of all links. A send its sender held back behind
  a receive of its own (posted on the receiving thread only after that receive completed, as
  DeepSpeed's PipelineEngine posts a forward's activation behind the next gradient) counts
  from its post: the wait before it is the sender's schedule, not the link (see held_back_ns). Messages into the second half of
  a fused label have a pool of their own: their "latency" includes the first half's compute
  (the receiver only waited once it was done).

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
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyze.memory import ActivationSize, in_flight_per_rank, orders_of_graph, peak_activation_bytes
from tracekit.analyze.replay import StepGraph, replay, step_graphs
from tracekit.analyze.schedules import V_PLACED, ZERO_BUBBLE, flatten, graph_from_orders, orders_for
from tracekit.analyze.theory import theoretical_bubble
from tracekit.errors import TracekitError
from tracekit.model.run import Run

# Targets with whole backwards (the findings in diagnosis.py replay these), and every target
# (the zero-bubble family too: backward split into I and W, DualPipeV's fused pairs).
TARGETS = ("GPipe", "1F1B", "Interleaved1F1B")
ALL_TARGETS = TARGETS + ZERO_BUBBLE
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
    held_back: int = 0  # messages whose latency counts from the send's post (see held_back_ns)
    fused_overhead: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> ns, second halves of fused labels
    stage_work: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # (stage, kind) -> one chunk, ns
    graphs: list[StepGraph] = field(default_factory=list)  # the measured steps
    fused: list[np.ndarray] = field(default_factory=list)  # per graph: action continues its predecessor's label
    n_actions: int = 0
    n_messages: int = 0
    # Whether the run split its backwards into I and W, and how the I and W pools were made
    # (see _split_costs): work holds (rank, "I"/"W") for stages past the first, (rank, "I0"/"W0")
    # for stage 0, whose I torch leaves empty.
    split_backward: bool = False
    iw_source: str = ""

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
    orders: str = ""  # where a generated order came from: torch's class or tracekit's generator
    keep: str = "global-batch"  # what the prediction keeps fixed when m changes (see the module doc)
    messages_per_step: int | None = None  # cross-rank messages one step passes
    in_flight: int | None = None  # most (stage, microbatch) activations one rank holds (tracekit.analyze.memory)
    activation_bytes: int | None = None  # their bytes, where an activation size is known (--search)

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

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        extra: dict[str, Any] = {}
        if self.links is not None:
            extra["links"] = self.links.describe()
        if self.search is not None:
            extra["search"] = self.search.to_dict()
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
    later_iw: dict[tuple[int, str], list[int]] = {}  # I and W of stages past the first
    overhead: dict[int, list[int]] = {}
    fused_overhead: dict[int, list[int]] = {}
    per_stage: dict[tuple[int, str], list[int]] = {}
    latency: dict[LinkKey, list[int]] = {}
    transfer: dict[LinkKey, list[int]] = {}
    labels = run.actions.set_index("action_id")[["label", "label_start_ns"]]
    fused_of_graph = [_fused(labels, g) for g in graphs]
    held = held_back_ns(run)
    for g, fused in zip(graphs, fused_of_graph):
        for r, k, d, o, f in zip(g.rank.tolist(), g.kind.tolist(), g.dur.tolist(), g.ovh.tolist(), fused.tolist()):
            per_kind.setdefault((r, k), []).append(d * sched.v)
            (fused_overhead if f else overhead).setdefault(r, []).append(o)
        for r, s, k, d in zip(g.rank.tolist(), g.stage.tolist(), g.kind.tolist(), g.dur.tolist()):
            per_stage.setdefault((s, k), []).append(d)
            if k in ("I", "W") and s > 0:
                later_iw.setdefault((r, k), []).append(d * sched.v)
        for s, d, lat, xfer, msg in zip(g.edge_src, g.edge_dst, g.edge_lat, g.edge_xfer, g.edge_msg):
            if msg >= 0:  # into the second half of a fused label: its own pool (see _fused)
                key: LinkKey = (
                    (int(g.rank[s]), int(g.rank[d])) if not fused[d] else (int(g.rank[s]), int(g.rank[d]), "fused")
                )
                latency.setdefault(key, []).append(max(0, int(lat) - held.get(int(msg), 0)))
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
    stage_work = {k: np.array(v, dtype=np.int64) for k, v in per_stage.items()}
    split = any(k in ("I", "W") for _, k in per_kind)
    iw_source = _split_costs(work, later_iw, stage_work, ranks, sched.v, split)
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
        stage_work=stage_work,
        latency={k: np.array(v, dtype=np.int64) for k, v in latency.items()},
        all_latency=all_latency,
        held_back=len(held),
        graphs=graphs,
        transfer={k: np.array(v, dtype=np.int64) for k, v in transfer.items() if any(v)},
        all_transfer=np.array([x for k, v in transfer.items() if len(k) == 2 for x in v] or [0], dtype=np.int64),
        n_actions=sum(len(g.action_id) for g in graphs),
        n_messages=int(sum((g.edge_msg >= 0).sum() for g in graphs)),
        split_backward=split,
        iw_source=iw_source,
    )


def _split_costs(
    work: dict[tuple[int, str], np.ndarray],
    later_iw: dict[tuple[int, str], list[int]],
    stage_work: dict[tuple[int, str], np.ndarray],
    ranks: list[int],
    v: int,
    split: bool,
) -> str:
    """Fill ``work`` with the input-grad (I) and weight-grad (W) pools the zero-bubble targets
    draw from, and say where they came from.

    torch splits the first stage's backward unlike the others: the model's input needs no
    gradient, so stage 0's I computes nothing and its W is the whole backward (seen in every
    split sample: I ~0.05 ms, W ~ B). So stage 0 has pools of its own, (first rank, "I0"/"W0"),
    and (rank, "I"/"W") hold the other stages' samples. Measured where the run split its
    backwards; otherwise each taken as half of a measured B, stage 0's I as 0 and its W as B."""
    first = ranks[0]
    if split and (0, "I") in stage_work and (0, "W") in stage_work:
        work[(first, "I0")] = stage_work[(0, "I")] * v
        work[(first, "W0")] = stage_work[(0, "W")] * v
    else:
        work[(first, "I0")] = np.zeros(1, dtype=np.int64)
        work[(first, "W0")] = work[(first, "B")]
    estimated = []
    for r in ranks:
        for kind in ("I", "W"):
            if split and (r, kind) in later_iw:
                work[(r, kind)] = np.array(later_iw[(r, kind)], dtype=np.int64)
            else:  # not measured past stage 0 on this rank (or at all): half of a backward
                work[(r, kind)] = work[(r, "B")] // 2
                estimated.append(r)
    if not split:
        return (
            "I and W not measured (this run's backwards are whole): each taken as half of B, "
            "except stage 0's, whose I torch leaves empty: I = 0, W = B there"
        )
    if estimated:
        missing = ", ".join(str(r) for r in sorted(set(estimated)))
        return f"I and W as measured; rank {missing} split no stage past the first: half of B each there"
    return "I and W as measured (stage 0's on their own: torch leaves its I empty and runs the backward in W)"


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


def held_back_ns(run: Run) -> dict[int, int]:
    """msg_id -> how long the sender held the send back after its producer ended, for sends
    posted behind a receive of the sender's own: on the thread of a receive that completed
    between the producer's end and the send's post. DeepSpeed's TrainSchedule posts a
    forward's activation in the next schedule step, behind that step's RecvGrad (the last
    warm-up activation leaves only once gradient 0 is back: 27-87 ms on sample_traces/
    deepspeed_1f1b); pooled as link latency, that wait landed on other messages in the
    replay and put the model 12 points high. torch's and Megatron's schedules post right
    after the producer (none held back on any sample); a send posted late by another thread
    (``--p2p-delay-ms``'s sender) is link latency as the receiver sees it and is kept."""
    msgs = run.messages[(run.messages["producer_action"] >= 0) & (run.messages["consumer_action"] >= 0)]
    needed = ("send_post_ns", "recv_done_ns", "src_file_id", "src_source_index", "dst_file_id", "dst_source_index")
    if msgs.empty or any(c not in msgs for c in needed):
        return {}
    events = run.events
    tid = pd.Series(
        events["tid"].to_numpy(), index=pd.MultiIndex.from_arrays([events["file_id"], events["source_index"]])
    )
    tid = tid[~tid.index.duplicated()]
    send_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["src_file_id"], msgs["src_source_index"]])).tolist()
    recv_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["dst_file_id"], msgs["dst_source_index"]])).tolist()
    produced = run.actions.set_index("action_id")["end_ns"].reindex(msgs["producer_action"]).tolist()
    done: dict[tuple[int, object], list[int]] = {}  # (rank, thread) -> its receives' completions
    for rank, thread, t in zip(msgs["dst_rank"].tolist(), recv_tid, msgs["recv_done_ns"].tolist()):
        done.setdefault((int(rank), thread), []).append(int(t))
    completions = {key: np.sort(np.array(times, dtype=np.int64)) for key, times in done.items()}
    out: dict[int, int] = {}
    for msg, rank, thread, end, post in zip(
        msgs["msg_id"].tolist(), msgs["src_rank"].tolist(), send_tid, produced, msgs["send_post_ns"].tolist()
    ):
        times = completions.get((int(rank), thread))
        if times is None or not post > end:
            continue
        if np.searchsorted(times, post, side="right") > np.searchsorted(times, end, side="right"):
            out[int(msg)] = int(post - end)
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
    work_kinds: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Bubble ratios and step times of ``samples`` replays with freshly drawn costs;
    ``scale`` multiplies the compute (a number, or one per action); ``fused`` marks actions
    whose overhead comes from the fused-label pool; ``by_stage``: compute drawn per stage
    chunk (replaying the measured order) instead of per rank; ``work_kinds``: the compute
    pool of each action's kind on its rank (default: its kind; see _split_costs)."""
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
    if model.graphs:
        orders = orders_of_graph(model.graphs[0])
        in_flight = max(in_flight_per_rank(orders).values(), default=0)
        if activation is not None:
            bytes_held = peak_activation_bytes(orders, activation, model.v, model.m, model.m, "microbatch")[1]
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
) -> Prediction:
    """Replay ``schedule`` with ``v`` chunks a rank and ``m`` microbatches on the measured
    costs; ``balanced``: with layers moved between stages so every rank computes the same;
    ``activation``: also the activation bytes the order holds on its fullest rank.
    ``stage_costs``: (target stage, "F" | "B") -> one microbatch's compute of that stage at
    the measured m, ns (a split of the layers, :mod:`tracekit.analyze.split`): each action's
    draws from its rank's samples are rescaled so that their mean is that cost (the rank's
    relative spread kept; the measured split gives back the measured costs)."""
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
    scale: float | np.ndarray = model.m / m if keep == "global-batch" else 1.0
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
        graph, model, rng, samples, scale, v, rank_of, fused if fused.any() else None, work_kinds=work_kinds
    )
    theory = theoretical_bubble(schedule, model.p, v, m).bubble_ratio
    label = label or f"{schedule} v={v} m={m}" + (" balanced" if balanced else "")
    in_flight, bytes_held = peak_activation_bytes(
        orders, activation or ActivationSize(0, ""), v, m, model.m, keep, model.ranks
    )
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
        activation_bytes=None if activation is None else bytes_held,
    )


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


def default_targets(model: CostModel) -> list[tuple[str, int, int]]:
    """What a user would try first: each schedule at the measured m, and twice m."""
    v_int = model.v if model.v >= 2 else 2
    out = []
    for m in (model.m, 2 * model.m):
        out += [("GPipe", 1, m), ("1F1B", 1, m), ("Interleaved1F1B", v_int, m)]
    return out


def zero_bubble_targets(model: CostModel) -> list[tuple[str, int, int]]:
    """The zero-bubble family at the measured m, those that this p and m allow."""
    out = []
    for schedule, v in (("ZB-H1", 1), ("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2)):
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
) -> WhatIf:
    """Predict every target (schedule, v, m) (default: :func:`default_targets`; the
    zero-bubble family, :func:`zero_bubble_targets`, when asked for); targets that cannot be generated are skipped with the reason. ``balanced``: every target also with stages re-split evenly.
    ``model`` and ``bubbles`` (the run's cost model and measured bubble table), when the
    caller has them already. ``links``: every prediction with the message latencies changed
    (the measured order too, as a row of its own; the model-of-the-measured row keeps the
    measured links: it is the model's error). ``activation``: rows also say the activation
    bytes their order holds. ``p``: the targets' number of ranks, refused unless the
    measured one (changing p is out of scope). ``progress`` is told each target as its
    replays start."""
    from tracekit.analyze.bubbles import measure_pipeline

    model = cost_model(run) if model is None else model
    check_ranks(model, p)
    measured_model = model
    if links is not None:
        model = with_links(model, links)
    if bubbles is None:
        bubbles = measure_pipeline(run.actions[run.actions["step"] >= 0])
    measured_bubble = float(bubbles["idle_ns"].sum() / max(1, bubbles["window_ns"].sum()))
    measured_step = float(bubbles.groupby("step")["window_ns"].first().mean())
    predictions: list[Prediction] = []
    skipped: list[str] = []
    if links is not None:
        predictions.append(as_measured(model, samples, seed, activation, f"measured order, {links.short()}"))
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
    assumptions = [
        f"compute per microbatch and rank, overheads and latencies drawn from {model.n_actions} "
        f"measured actions and {model.n_messages} messages; {samples} replays per row",
        "a rank's layers split evenly over its chunks (compute per chunk = rank compute / v)",
        keep_assumption(keep),
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
            "'balanced' rows: layers moved between stages so every rank computes the same; "
            + ", ".join(f"rank {r} x{f:.2f}" for r, f in factors.items())
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
    )


def keep_assumption(keep: str) -> str:
    """What a prediction with this ``--keep`` assumes, in one line (quoted wherever it is)."""
    if keep == "global-batch":
        return (
            "--keep global-batch: the step's samples kept, so compute per microbatch scales as 1/m "
            "(measured m / target m; only approximately true on GPUs, where small microbatches use the device less well)"
        )
    return (
        "--keep microbatch: microbatches keep their size, compute per microbatch as measured, the step does more work"
    )


_TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass(frozen=True)
class LinkChange:
    """A change to every measured message latency (and device transfer): scaled by
    ``factor``, shifted by ``add_ns`` or set to ``set_ns``; ``overlap``: P2P fully overlapped
    with compute (every message free, the data dependencies and so the order kept)."""

    factor: float = 1.0
    add_ns: int = 0
    set_ns: int | None = None
    overlap: bool = False
    text: str = ""  # the --link-latency value as given

    def apply(self, samples: np.ndarray, transfer: bool = False) -> np.ndarray:
        if self.overlap or (transfer and self.set_ns is not None):
            return np.zeros_like(samples)
        if self.set_ns is not None:
            return np.full_like(samples, self.set_ns)
        out = np.rint(samples * self.factor).astype(np.int64)
        return out if transfer else np.maximum(out + self.add_ns, 0)

    def short(self) -> str:
        """A row label's few words: "links x0.5", "P2P overlapped"."""
        return "P2P overlapped" if self.overlap else f"links {self.text}"

    def describe(self) -> str:
        parts = []
        if self.text:
            parts.append(f"every link latency {self.text}")
        if self.overlap:
            parts.append("P2P fully overlapped with compute (messages free, order kept)")
        return "; ".join(parts)


def parse_link_latency(text: str | None, overlap: bool = False) -> LinkChange | None:
    """``x0.5`` (scale), ``+2ms`` / ``-1ms`` (shift), ``5ms`` (set) -> a LinkChange; None when
    nothing is changed. A malformed value is a one-line error."""
    if not text and not overlap:
        return None
    if not text:
        return LinkChange(overlap=True)
    raw = text.strip().lower()
    bad = TracekitError(f"--link-latency {text!r}: give x0.5 (scale), +2ms or -1ms (shift) or 5ms (set; ns/us/ms/s)")
    try:
        if raw[:1] in ("x", "*"):
            factor = float(raw[1:])
            if not np.isfinite(factor) or factor < 0:
                raise bad
            return LinkChange(factor=factor, overlap=overlap, text=text.strip())
        unit = next((u for u in ("ns", "us", "ms", "s") if raw.endswith(u)), None)
        if unit is None:
            raise bad
        value = float(raw[: -len(unit)]) * _TIME_UNITS[unit]
    except ValueError:
        raise bad from None
    if not np.isfinite(value):
        raise bad
    if raw[:1] in ("+", "-"):
        return LinkChange(add_ns=int(round(value)), overlap=overlap, text=text.strip())
    if value < 0:
        raise bad
    return LinkChange(set_ns=int(round(value)), overlap=overlap, text=text.strip())


def with_links(model: CostModel, change: LinkChange) -> CostModel:
    """The cost model with every link's latency (and transfer) samples changed. Messages into
    the second half of a fused label keep theirs: that pool's "latency" is mostly the first
    half's compute (see the module doc); only replays of a fused measured order draw it."""

    def pools(samples: dict[LinkKey, np.ndarray], transfer: bool) -> dict[LinkKey, np.ndarray]:
        return {k: (change.apply(x, transfer) if len(k) == 2 else x) for k, x in samples.items()}

    return replace(
        model,
        latency=pools(model.latency, False),
        all_latency=change.apply(model.all_latency),
        transfer=pools(model.transfer, True),
        all_transfer=change.apply(model.all_transfer, True),
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

    def cost(self, p: Prediction) -> float:
        return p.step_ns / p.m if self.objective == "time per microbatch" else p.step_ns

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
