"""Data-parallel replicas: which ranks form one pipeline.

Large jobs run several copies of the same pipeline side by side (data parallelism across
pipelines): ranks 0-3 are one 4-stage pipeline, ranks 4-7 another, each labelling its
stages 0-3. Read as one pipeline that would be p=8 with every stage run twice, and every
figure derived from p (the closed-form bubble, the fill/drain advice) would be wrong.

Point-to-point messages only flow inside a pipeline, so the ranks joined by matched
messages are one replica. The split is used only when it is unambiguous: every group has the
same number of ranks (two or more) and runs the same set of stages. Anything else (a rank's
trace missing, so its pipeline looks broken in two) stays one pipeline, as before.
"""

from __future__ import annotations

import pandas as pd


def pipeline_groups(actions: pd.DataFrame, messages: pd.DataFrame) -> list[list[int]]:
    """The ranks of each pipeline replica, lowest rank first; one group when there is one
    pipeline or the split is not clean."""
    ranks = sorted(int(r) for r in actions["rank"].unique())
    if len(ranks) < 4 or messages.empty:
        return [ranks]
    parent = {r: r for r in ranks}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for src, dst in set(zip(messages["src_rank"].tolist(), messages["dst_rank"].tolist())):
        if src in parent and dst in parent:
            a, b = find(src), find(dst)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(find(r), []).append(r)
    found = sorted(groups.values())
    if len(found) < 2 or len({len(g) for g in found}) != 1 or len(found[0]) < 2:
        return [ranks]
    if stage_is_rank(actions):
        return found  # native schedules name no stages: each replica's ranks are its stages
    # pandas-stubs type agg's result as a scalar; pandas keeps any object the function returns
    stages = actions.groupby("rank")["stage"].agg(lambda s: frozenset(s.tolist()))  # type: ignore[type-var]
    stage_sets = {frozenset().union(*(stages[r] for r in group)) for group in found}
    if len(stage_sets) != 1:
        return [ranks]
    return found


def stage_is_rank(actions: pd.DataFrame) -> bool:
    """Whether stages were numbered by rank (torch's native GPipe/1F1B name no stage)."""
    return bool((actions["stage"] == actions["rank"]).all())


def restage(actions: pd.DataFrame, groups: list[list[int]]) -> pd.DataFrame:
    """Stages numbered by rank, renumbered by the rank's place in its replica (rank 5 of
    replica 4-7 runs stage 1), so replicas share stage numbers as labelled runs do."""
    place = {r: i for group in groups for i, r in enumerate(group)}
    return actions.assign(stage=actions["rank"].map(place).astype(actions["stage"].dtype))
