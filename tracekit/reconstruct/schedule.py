"""Recognise the pipeline schedule (kind, p, v, m, placement) from the action order alone
(and, for TeraPipe, from how the microbatches' compute grows with their index).

Two designs beyond torch's schedules:

- **PipeDream-2BW (no flush)**: some microbatch's forward and backward on one stage lie in
  two consecutive steps of its rank (in flight over the weight update). A flushed schedule
  never does that: every microbatch of a step finishes inside it. Microbatch ids then count
  on across steps, and m is the number of backwards per step (one weight update every m).
  Original PipeDream (an update per microbatch) looks the same with m = 1.
- **TeraPipe (token slices)**: GPipe's all-forwards-first order with the backwards last
  microbatch first on every rank (a slice's backward needs the later slices' gradients on
  its keys), and each microbatch's compute growing with its index on every stage
  (attention over a longer prefix). Without that growth, the order alone is reported as
  GPipe with the reversed backwards in the evidence.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from tracekit.model.run import UNRECOGNISED, Completeness, ScheduleInfo, compute_ns

FLUSH_FREE_NAME = "PipeDream-2BW (no flush)"
TERAPIPE_NAME = "TeraPipe (token slices)"
# TeraPipe's slices: the last slice's compute at least this many times the first's on every stage
SLICE_GROWTH_MIN = 1.2


def recognise(
    actions: pd.DataFrame, overlap_labels: bool = False, pipelines: list[list[int]] | None = None
) -> ScheduleInfo | None:
    """Name the schedule that produced these actions; None when there are none.

    ``pipelines``: the ranks of each data-parallel replica (:mod:`.pipelines`); p, the
    stage placement and the order are read from the first, which the others repeat."""
    if actions.empty:
        return None
    pipelines = pipelines or [sorted(int(r) for r in actions["rank"].unique())]
    evidence: list[str] = []
    if len(pipelines) > 1:
        first = pipelines[0]
        evidence.append(
            f"{len(pipelines)} data-parallel replicas of {len(first)} ranks each "
            f"({', '.join(_span(g) for g in pipelines[:4])}{' ...' if len(pipelines) > 4 else ''}), "
            "found from which ranks exchange messages; the schedule is read from ranks "
            f"{_span(first)}"
        )
        actions = actions[actions["rank"].isin(first)]
    ranks = sorted(actions["rank"].unique())
    p = len(ranks)
    stage_to_rank: dict[int, int] = {}
    for (stage, rank), _ in actions.groupby(["stage", "rank"]):
        if stage in stage_to_rank and stage_to_rank[stage] != rank:
            evidence.append(f"stage {stage} ran on ranks {stage_to_rank[stage]} and {rank}")
        stage_to_rank.setdefault(int(cast(int, stage)), int(cast(int, rank)))
    n_stages = len(stage_to_rank)
    v = max(1, n_stages // p) if p else 1
    crossing = _microbatches_across_steps(actions)
    flush_free = crossing > 0
    # flush-free: a step's forwards include the fill's; its backwards are the m of one update
    counted = "B" if flush_free and (actions["kind"] == "B").any() else "F"
    per_step = actions[actions["kind"] == counted].groupby(["step", "stage"])["microbatch"].nunique()
    m = int(per_step.max()) if len(per_step) else 0
    placement = _placement(stage_to_rank, ranks, p)
    kinds = set(actions["kind"].unique())
    split_backward = "W" in kinds
    evidence.append(
        f"{n_stages} stages on {p} ranks ({placement} placement), {m} microbatches per step"
        + (" (backwards per step: one weight update every m)" if flush_free else "")
    )
    if flush_free:
        ids = actions["microbatch"]
        evidence.append(
            f"no flush: {crossing} (stage, microbatch) pairs have their forward in one step and their "
            f"backward in the next (in flight over the weight update); microbatch ids run on across steps "
            f"({int(ids.min())}..{int(ids.max())})"
        )
    if flush_free and not split_backward and v == 1 and not overlap_labels:
        name = FLUSH_FREE_NAME
        evidence.append(
            "one forward one backward in steady state with no flush between steps: PipeDream-2BW "
            "(weight versions are not in the trace; original PipeDream would show m=1)"
        )
    elif overlap_labels:
        name = "DualPipeV"
        evidence.append("OVERLAP_F_B actions (forward and backward fused) present")
    elif split_backward and placement == "v":
        name = "ZBVZeroBubble"
        evidence.append("backward split into I and W, V-shaped stage placement")
    elif split_backward:
        name = "InterleavedZeroBubble" if v > 1 else "ZeroBubble (ZB-H1)"
        evidence.append("backward split into I and W")
    else:
        all_forward_first = _all_forward_first(actions)
        if v == 1:
            name = "GPipe" if all_forward_first else "1F1B"
        else:
            name = "LoopedBFS" if all_forward_first else "Interleaved1F1B"
        evidence.append(
            "every rank runs all its forwards before any backward"
            if all_forward_first
            else "ranks interleave forwards and backwards (one-forward-one-backward steady state)"
        )
        if all_forward_first and v == 1 and m > 1 and _backwards_reversed(actions):
            evidence.append("every rank runs its backwards last microbatch first")
            growth = slice_growth(actions)
            if growth is not None and growth >= SLICE_GROWTH_MIN:
                name = TERAPIPE_NAME
                evidence.append(
                    f"each microbatch's compute grows with its index on every stage (last / first >= "
                    f"{growth:.2f}x): token slices of one sequence, attention over a growing prefix"
                )
    if flush_free and name != FLUSH_FREE_NAME:
        evidence.append("no flush between steps although the order is that of a flushed schedule")
    return ScheduleInfo(
        name=name,
        p=p,
        v=v,
        m=m,
        placement=placement,
        stage_to_rank=stage_to_rank,
        split_backward=split_backward,
        evidence=evidence,
        pipelines=[list(g) for g in pipelines],
        flush_free=flush_free,
    )


def _microbatches_across_steps(actions: pd.DataFrame) -> int:
    """How many forwards have no backward of their (rank, stage, microbatch) in their own
    step but one in the rank's next step (ids repeat per step in flushed schedules)."""
    known = actions[actions["microbatch"] >= 0]
    keys = ["rank", "stage", "microbatch", "step"]
    fwd = known[known["kind"] == "F"][keys].drop_duplicates()
    bwd = pd.MultiIndex.from_frame(known[known["kind"].isin(("B", "I", "W"))][keys].drop_duplicates())
    same = pd.MultiIndex.from_frame(fwd).isin(bwd)
    later = pd.MultiIndex.from_frame(fwd.assign(step=fwd["step"] + 1)).isin(bwd)
    return int((~same & later).sum())


def _backwards_reversed(actions: pd.DataFrame) -> bool:
    """Whether every rank's backwards of every step run in strictly decreasing microbatch order."""
    backward = actions[actions["kind"] == "B"]
    if backward.empty:
        return False
    for _, group in backward.groupby(["rank", "step"]):
        mbs = group.sort_values("order")["microbatch"].to_numpy()
        if len(mbs) < 2 or not (np.diff(mbs) < 0).all():
            return False
    return True


def slice_growth(actions: pd.DataFrame) -> float | None:
    """The smallest, over stages, of the last microbatch's compute (forward + backward,
    median over steps: one stalled action does not hide the trend) over the first's, where
    every stage's compute rises with the microbatch index (rank correlation > 0.9); None
    where some stage's does not."""
    cost = actions.assign(compute=compute_ns(actions))
    per = cost.groupby(["stage", "microbatch", "step"])["compute"].sum().groupby(["stage", "microbatch"]).median()
    growth = []
    for _, by_mb in per.groupby(level="stage"):
        values = by_mb.to_numpy(dtype=float)
        if len(values) < 2 or values[0] <= 0:
            return None
        ranks_of = pd.Series(values).rank().to_numpy()
        if np.corrcoef(ranks_of, np.arange(len(values)))[0, 1] <= 0.9:
            return None
        growth.append(values[-1] / values[0])
    return min(growth) if growth else None


def unrecognised(actions: pd.DataFrame, completeness: Completeness) -> ScheduleInfo:
    """The schedule of a run with ranks missing: what the ranks present show (their stages,
    microbatches per step), with p the job's world size and no name.

    The missing ranks' stages, their messages and their place in the order are unknown, so
    the name, the placement and a replica split read from the rest would describe another
    pipeline (three ranks of four look like a complete p=3 1F1B)."""
    stage_to_rank = {
        int(cast(int, stage)): int(cast(int, rank)) for (stage, rank), _ in actions.groupby(["stage", "rank"])
    }
    per_step = actions[actions["kind"] == "F"].groupby(["step", "stage"])["microbatch"].nunique()
    m = int(per_step.max()) if len(per_step) else 0
    present = completeness.ranks_present
    v = max(1, len(stage_to_rank) // max(len(present), 1))
    evidence = [
        f"incomplete run: {completeness.missing_text()}; the schedule is not recognised from a partial pipeline",
        f"p={completeness.world_size} is the job's world size ({completeness.world_size_source}); "
        "data-parallel replicas cannot be told apart with ranks missing",
        f"{len(stage_to_rank)} stages seen on the {len(present)} ranks present, {m} microbatches per step",
    ]
    return ScheduleInfo(
        name=UNRECOGNISED,
        p=int(completeness.world_size or len(present)),
        v=v,
        m=m,
        placement="custom",
        stage_to_rank=stage_to_rank,
        split_backward=bool((actions["kind"] == "W").any()),
        evidence=evidence,
        pipelines=[list(present)],
    )


def _span(ranks: list[int]) -> str:
    """ "0-3" for a contiguous run of ranks, else the list."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _placement(stage_to_rank: dict[int, int], ranks: list[int], p: int) -> str:
    index = {r: i for i, r in enumerate(ranks)}
    if all(index[r] == s % p for s, r in stage_to_rank.items()):
        return "loop"
    if all(index[r] == (s if s < p else 2 * p - 1 - s) for s, r in stage_to_rank.items()):
        return "v"
    return "custom"


def _all_forward_first(actions: pd.DataFrame) -> bool:
    for _, group in actions.groupby(["rank", "step"]):
        kinds = group.sort_values("order")["kind"].tolist()
        if "B" in kinds and "F" in kinds:
            last_f = len(kinds) - 1 - kinds[::-1].index("F")
            if kinds.index("B") < last_f:
                return False
    return True
