"""The figures the HTML report shows beside its timelines, computed from the analysis so that
the page only formats them: each rank's idle by cause (or spent in collectives), each
stage's compute and the idle blamed on it, each link's latency and the idle blamed on it,
the slowest step's critical path, and the per-stage means over data-parallel replicas."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.analyze.diagnosis import message_latencies, stage_compute_ns
from tracekit.vocab import IDLE_CAUSES

if TYPE_CHECKING:
    from tracekit.analyze import Analysis
    from tracekit.schemas.analysis import PathStepDoc


def rank_causes_ns(analysis: Analysis) -> dict[int, dict[str, int]]:
    """Each rank's idle by cause (key -> ns), summed over the steps; empty where the run was
    not attributed."""
    if analysis.attribution is None:
        return {}
    return analysis.attribution.rank_causes_ns(analysis.summary.per_rank)


@dataclass(frozen=True)
class CollectiveIdle:
    """Idle time spent in collective kernels: per rank (those with any), and over all ranks."""

    per_rank: dict[int, int]
    total_ns: int


def collective_idle(analysis: Analysis) -> CollectiveIdle:
    """The run's idle in collective kernels (device runs; none where none ran)."""
    if analysis.device is None:
        return CollectiveIdle({}, 0)
    per_rank = analysis.device.per_rank()
    ranks = {
        int(r): int(ns) for r, ns in zip(per_rank.index.tolist(), per_rank["collective_idle_ns"].tolist()) if ns > 0
    }
    return CollectiveIdle(ranks, sum(ranks.values()))


@dataclass(frozen=True)
class StageFigures:
    """One stage: its compute per step, against the stages' median, and the imbalance idle
    blamed on it (ns over the run, and its share of the run's idle)."""

    stage: int
    rank: int | None  # the rank that runs it (None: the schedule does not say)
    compute_ns: float
    vs_median: float | None  # compute over the stages' median (None: the median is 0)
    blamed_ns: float
    idle_share: float


@dataclass(frozen=True)
class LinkFigures:
    """One link: its messages' count and median latency and post delay, and the comm idle
    blamed on it (ns over the run, and its share of the run's idle)."""

    src_rank: int
    dst_rank: int
    n_messages: int
    latency_ns: float
    post_delay_ns: float
    blamed_ns: float
    idle_share: float


def stage_figures(analysis: Analysis) -> list[StageFigures]:
    """Every stage of an attributed pipeline, the most blamed first."""
    if analysis.attribution is None or not analysis.is_pipeline:
        return []
    blame = analysis.attribution.stage_blame
    compute = stage_compute_ns(analysis.run.actions)
    idle = max(analysis.summary.idle_ns, 1)
    schedule = analysis.run.schedule
    to_rank = schedule.stage_to_rank if schedule is not None else {}
    by_stage = blame.groupby("stage")["imbalance_ns"].sum() if len(blame) else pd.Series(dtype=float)
    median = float(compute.median()) if len(compute) else 0.0
    return [
        StageFigures(
            stage=int(stage),
            rank=to_rank.get(int(stage)),
            compute_ns=compute[stage],
            vs_median=compute[stage] / median if median else None,
            blamed_ns=by_stage.get(stage, 0),
            idle_share=by_stage.get(stage, 0) / idle,
        )
        for stage in sorted(compute.index, key=lambda s: -by_stage.get(s, 0))
    ]


def link_figures(analysis: Analysis) -> list[LinkFigures]:
    """Every link of an attributed pipeline that carried a message, the most blamed first."""
    if analysis.attribution is None or not analysis.is_pipeline:
        return []
    blame = analysis.attribution.link_blame
    idle = max(analysis.summary.idle_ns, 1)
    latencies = message_latencies(analysis)
    by_link = blame.groupby(["src_rank", "dst_rank"])["comm_ns"].sum() if len(blame) else pd.Series(dtype=float)
    stats = latencies.groupby(["src_rank", "dst_rank"]).agg(
        n=("latency_ns", "size"), latency=("latency_ns", "median"), post=("post_delay_ns", "median")
    )
    out = []
    for link in sorted(stats.index, key=lambda k: -by_link.get(k, 0)):
        s = stats.loc[link]
        out.append(
            LinkFigures(
                src_rank=link[0],
                dst_rank=link[1],
                n_messages=int(s["n"]),
                latency_ns=s["latency"],
                post_delay_ns=s["post"],
                blamed_ns=by_link.get(link, 0),
                idle_share=by_link.get(link, 0) / idle,
            )
        )
    return out


@dataclass(frozen=True)
class CriticalPath:
    """The slowest step's critical path, first action first, and its compute and comm."""

    step: int
    makespan_ns: int
    path: list[PathStepDoc]  # the attribution's entries: kind, stage, microbatch, rank, ...
    compute_ns: int
    comm_ns: int


def slowest_critical_path(analysis: Analysis) -> CriticalPath | None:
    """The critical path of the step with the longest measured makespan; None where no step
    was attributed."""
    attribution = analysis.attribution
    if attribution is None or not attribution.steps:
        return None
    slowest = max(attribution.steps, key=lambda s: s.measured_makespan_ns)
    path = list(reversed(slowest.critical_path))
    return CriticalPath(
        step=slowest.step,
        makespan_ns=slowest.measured_makespan_ns,
        path=path,
        compute_ns=sum(p["compute_ns"] for p in path),
        comm_ns=sum(p.get("comm_ns", 0) for p in path),
    )


@dataclass(frozen=True)
class StepFigures:
    """One step over every rank: its window (the ranks' earliest start to latest end) and its
    bubble ratio (idle over window, summed over the ranks)."""

    start_ns: int
    end_ns: int
    bubble_ratio: float


def step_figures(analysis: Analysis) -> dict[int, StepFigures]:
    """Each measured step's window and bubble ratio, by step."""
    bubbles = analysis.bubbles
    if not len(bubbles):
        return {}
    by_step = bubbles.groupby("step").agg(
        lo=("window_start_ns", "min"), hi=("window_end_ns", "max"), idle=("idle_ns", "sum"), window=("window_ns", "sum")
    )
    return {
        int(step): StepFigures(int(lo), int(hi), float(idle / max(int(window), 1)))
        for step, lo, hi, idle, window in zip(
            by_step.index.tolist(), by_step["lo"], by_step["hi"], by_step["idle"], by_step["window"]
        )
    }


@dataclass(frozen=True)
class Culprit:
    """A stage (on its rank) or a link that a rank's idle of one cause in one step is blamed
    on, and how much of that idle (the attribution's stage_blame and link_blame)."""

    blamed_ns: float
    stage: int | None = None
    stage_rank: int | None = None  # the rank that runs the stage (None: the schedule does not say)
    link: tuple[int, int] | None = None


def culprits(analysis: Analysis) -> dict[tuple[int, int, str], list[Culprit]]:
    """(rank, step, cause) -> who that idle is blamed on, largest first: the stages behind
    the rank's imbalance and the links behind its comm latency."""
    if analysis.attribution is None:
        return {}
    schedule = analysis.run.schedule
    to_rank = schedule.stage_to_rank if schedule is not None else {}
    out: dict[tuple[int, int, str], list[Culprit]] = {}
    for step in analysis.attribution.steps:
        for rank, rows in step.stage_blame.groupby("rank"):
            rows = rows.sort_values("imbalance_ns", ascending=False)
            out[(_int(rank), step.step, "imbalance")] = [
                Culprit(float(ns), stage=int(s), stage_rank=to_rank.get(int(s)))
                for s, ns in zip(rows["stage"], rows["imbalance_ns"])
            ]
        for rank, rows in step.link_blame.groupby("rank"):
            rows = rows.sort_values("comm_ns", ascending=False)
            out[(_int(rank), step.step, "comm")] = [
                Culprit(float(ns), link=(int(a), int(b)))
                for a, b, ns in zip(rows["src_rank"], rows["dst_rank"], rows["comm_ns"])
            ]
    return out


def _int(value: object) -> int:
    """A group's key (a rank) as an int."""
    assert isinstance(value, (int, np.integer))
    return int(value)


@dataclass(frozen=True)
class PlaceMeans:
    """One place of a run of data-parallel replicas (a rank's position in its replica): its
    busy and idle over the run, and its idle by cause, each the mean over the replicas."""

    stages: list[int]
    busy_ns: float
    idle_ns: float
    causes_ns: dict[str, float]  # empty without attribution


def place_means(analysis: Analysis) -> list[PlaceMeans]:
    """Each place of the replica roll-up, in its order; empty without one."""
    rollup = analysis.replicas
    if rollup is None:
        return []
    per_rank = analysis.summary.per_rank
    n = rollup.n_replicas
    attributed = any(p.causes_ns for p in rollup.places)
    return [
        PlaceMeans(
            stages=place.stages,
            busy_ns=sum(per_rank[r].busy_ns for r in place.ranks) / n,
            idle_ns=sum(per_rank[r].idle_ns for r in place.ranks) / n,
            causes_ns={c.key: place.causes_ns.get(c.key, 0) / n for c in IDLE_CAUSES} if attributed else {},
        )
        for place in rollup.places
    ]


def busy_per_step_ns(analysis: Analysis) -> dict[int, float]:
    """Each rank's busy time per step of the replica roll-up; empty without one."""
    rollup = analysis.replicas
    if rollup is None:
        return {}
    return {rank: info.busy_ns / rollup.n_steps for rank, info in analysis.summary.per_rank.items()}


MESSAGE_TIMING_COLUMNS = [
    "src_rank",
    "dst_rank",
    "send_post_ns",
    "arrival_ns",
    "latency_ns",
    "post_ns",
    "wire_ns",
    "recv_wait_ns",
    "direction",
]


def message_timings(analysis: Analysis, step: int, ranks: Collection[int]) -> pd.DataFrame:
    """The step's messages between ``ranks`` as the report's timeline draws them (the
    messages table's index kept): when each was posted and arrived, its latency from its
    producer's end (from the send's post where no producer is known), split into the wait
    before the post (``post_ns``) and the rest (``wire_ns``), and the receiver's wait. Empty
    off a pipeline."""
    messages = analysis.run.messages
    if not analysis.is_pipeline or len(messages) == 0:
        return pd.DataFrame(columns=MESSAGE_TIMING_COLUMNS)
    msgs = messages[(messages["step"] == step) & messages["src_rank"].isin(ranks) & messages["dst_rank"].isin(ranks)]
    producer_end = analysis.run.actions.set_index("action_id")["end_ns"]
    ready = msgs["producer_action"].map(producer_end).fillna(msgs["send_post_ns"]).astype(np.int64)
    latency = (msgs["arrival_ns"] - ready).clip(lower=0)
    post = (msgs["send_post_ns"] - ready).clip(lower=0)
    return pd.DataFrame(
        {
            "src_rank": msgs["src_rank"],
            "dst_rank": msgs["dst_rank"],
            "send_post_ns": msgs["send_post_ns"],
            "arrival_ns": msgs["arrival_ns"],
            "latency_ns": latency,
            "post_ns": post,
            "wire_ns": (latency - post).clip(lower=0),
            "recv_wait_ns": msgs["recv_wait_ns"],
            "direction": msgs["direction"],
        }
    )
