"""Recognise the pipeline schedule (kind, p, v, m, placement) from the action order alone."""
from __future__ import annotations

import pandas as pd

from tracekit.model.run import UNRECOGNISED, Completeness, ScheduleInfo


def recognise(actions: pd.DataFrame, overlap_labels: bool = False,
              pipelines: list[list[int]] | None = None) -> ScheduleInfo | None:
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
            f"{_span(first)}")
        actions = actions[actions["rank"].isin(first)]
    ranks = sorted(actions["rank"].unique())
    p = len(ranks)
    stage_to_rank: dict[int, int] = {}
    for (stage, rank), _ in actions.groupby(["stage", "rank"]):
        if stage in stage_to_rank and stage_to_rank[stage] != rank:
            evidence.append(f"stage {stage} ran on ranks {stage_to_rank[stage]} and {rank}")
        stage_to_rank.setdefault(int(stage), int(rank))
    n_stages = len(stage_to_rank)
    v = max(1, n_stages // p) if p else 1
    per_step = actions[actions["kind"] == "F"].groupby(["step", "stage"])["microbatch"].nunique()
    m = int(per_step.max()) if len(per_step) else 0
    placement = _placement(stage_to_rank, ranks, p)
    kinds = set(actions["kind"].unique())
    split_backward = "W" in kinds
    evidence.append(f"{n_stages} stages on {p} ranks ({placement} placement), {m} microbatches per step")
    if overlap_labels:
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
            "every rank runs all its forwards before any backward" if all_forward_first
            else "ranks interleave forwards and backwards (one-forward-one-backward steady state)"
        )
    return ScheduleInfo(name=name, p=p, v=v, m=m, placement=placement, stage_to_rank=stage_to_rank,
                        split_backward=split_backward, evidence=evidence,
                        pipelines=[list(g) for g in pipelines])


def unrecognised(actions: pd.DataFrame, completeness: Completeness) -> ScheduleInfo:
    """The schedule of a run with ranks missing: what the ranks present show (their stages,
    microbatches per step), with p the job's world size and no name.

    The missing ranks' stages, their messages and their place in the order are unknown, so
    the name, the placement and a replica split read from the rest would describe another
    pipeline (three ranks of four look like a complete p=3 1F1B)."""
    stage_to_rank = {int(stage): int(rank) for (stage, rank), _ in actions.groupby(["stage", "rank"])}
    per_step = actions[actions["kind"] == "F"].groupby(["step", "stage"])["microbatch"].nunique()
    m = int(per_step.max()) if len(per_step) else 0
    present = completeness.ranks_present
    v = max(1, len(stage_to_rank) // max(len(present), 1))
    evidence = [
        f"incomplete run: {completeness.missing_text()}; the schedule is not recognised from a "
        "partial pipeline",
        f"p={completeness.world_size} is the job's world size ({completeness.world_size_source}); "
        "data-parallel replicas cannot be told apart with ranks missing",
        f"{len(stage_to_rank)} stages seen on the {len(present)} ranks present, {m} microbatches per step",
    ]
    return ScheduleInfo(name=UNRECOGNISED, p=int(completeness.world_size or len(present)), v=v, m=m,
                        placement="custom", stage_to_rank=stage_to_rank,
                        split_backward=bool((actions["kind"] == "W").any()), evidence=evidence,
                        pipelines=[list(present)])


def _span(ranks: list[int]) -> str:
    """"0-3" for a contiguous run of ranks, else the list."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _placement(stage_to_rank: dict[int, int], ranks: list, p: int) -> str:
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
