"""Who each point-to-point call talks to: the metadata's word, held against the trace.

A send or receive names its peer in its args (``record_param_comms`` ``Dst Rank`` /
``Src Rank``, ``c10d::send``'s ``Concrete Inputs``, the ``nccl:send a->b`` title). Those are
ranks of the process group the op ran on, not the job's: ``Process Group Ranks`` (and
``distributedInfo.pg_config``) map one to the other, and some torch versions write them
wrong altogether (pytorch#153819: the two-rank P2P communicator's ranks, ``nccl:recv 1<-0``
where ``3<-1`` was meant). Trusting one field made a 4-stage pipeline read as two pipelines
of 2, with ranks paired with themselves.

So the peers are a hypothesis, tested against the evidence the trace holds: a send from a to
b must meet a receive at b from a in the same step, as often; nobody sends to itself. The
hypotheses, in order: the metadata as the job's ranks; the metadata as ranks of a process
group each rank belongs to (the pipeline group first); none of it, the peers taken from the
pipeline's shape (the action a call follows or feeds, and the pipeline group's order where
pg_config gives one). The one under which the most calls find their partner is taken, the
earlier on a tie; where the metadata loses to the pipeline's shape, one warning names a call
whose metadata the trace contradicts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import cast

import pandas as pd

from tracekit.model.events import TraceFile

# Words in a process group's name or description that say it is the pipeline's.
_PIPELINE_WORDS = ("pipe", "pp")


@dataclass(frozen=True)
class ProcessGroup:
    """One process group a rank's trace lists (``distributedInfo.pg_config``)."""

    name: str
    description: str
    ranks: tuple[int, ...]  # the job's rank of each group rank

    @property
    def is_pipeline(self) -> bool:
        text = f"{self.name} {self.description}".lower()
        return any(word in text for word in _PIPELINE_WORDS)


def groups_of(files: list[TraceFile]) -> dict[int, list[ProcessGroup]]:
    """Each rank's process groups, as its file lists them."""
    out: dict[int, list[ProcessGroup]] = {}
    for trace in files:
        groups = [
            ProcessGroup(
                str(g.get("name", "")), str(g.get("description", "")), tuple(int(r) for r in g.get("ranks", []))
            )
            for g in trace.process_groups
        ]
        for rank in trace.ranks or [trace.rank]:
            out[int(rank)] = groups
    return out


@dataclass
class Resolved:
    """The sides with their peers, which hypothesis gave them, and the warning (if any)."""

    sends: pd.DataFrame
    recvs: pd.DataFrame
    hypothesis: str  # "metadata", "group ranks", "pipeline shape"
    warning: str | None = None


def matched_sides(sends: pd.DataFrame, recvs: pd.DataFrame) -> int:
    """How many calls find a partner when each send a -> b per step pairs with a receive at b
    from a in that step (as many as both have); a call to its own rank finds none."""
    s = Counter(
        (int(r), int(p), int(t)) for r, p, t in zip(sends["rank"], sends["peer"], sends["step"]) if p >= 0 and p != r
    )
    r = Counter(
        (int(p), int(rank), int(t))
        for rank, p, t in zip(recvs["rank"], recvs["peer"], recvs["step"])
        if p >= 0 and p != rank
    )
    return 2 * sum(min(n, r.get(key, 0)) for key, n in s.items())


def through_groups(sides: pd.DataFrame, groups: dict[int, list[ProcessGroup]], ranks: set[int]) -> pd.DataFrame:
    """The sides with each peer read as a rank of a process group of its caller: per rank, the
    first group (pipeline groups first, then the smaller) under which every peer it names
    is another rank of the run; a rank no group explains keeps its peers."""
    out = sides.copy()
    for rank, mine in sides.groupby("rank"):
        named: pd.Series[int] = mine["peer"][mine["peer"] >= 0]
        if named.empty:
            continue
        candidates = sorted(groups.get(int(cast(int, rank)), []), key=lambda g: (not g.is_pipeline, len(g.ranks)))
        for group in candidates:
            if int(named.max()) >= len(group.ranks) or int(cast(int, rank)) not in group.ranks:
                continue
            mapped = named.map(dict(enumerate(group.ranks)))
            if (mapped != rank).all() and mapped.isin(ranks).all():
                out.loc[named.index, "peer"] = mapped.to_numpy()
                break
    return out


def contradiction(
    sends: pd.DataFrame, recvs: pd.DataFrame, better_sends: pd.DataFrame, better_recvs: pd.DataFrame
) -> str:
    """One call whose metadata the chosen peers contradict, as a phrase."""
    for direction, sides, better in (("send", sends, better_sends), ("recv", recvs, better_recvs)):
        differs = sides.index[(sides["peer"] != better["peer"]).to_numpy() & (better["peer"] >= 0).to_numpy()]
        if len(differs):
            row = sides.loc[differs[0]]
            said = "itself" if int(row["peer"]) == int(row["rank"]) else f"rank {int(row['peer'])}"
            way = "to" if direction == "send" else "from"
            return (
                f"a {direction} on rank {int(row['rank'])} (step {int(row['step'])}) names {said}; the trace "
                f"shows it {way} rank {int(better.loc[differs[0], 'peer'])}"
            )
    return "calls that find no partner under it"
