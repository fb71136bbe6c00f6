"""The job around the pipeline: which ranks are tensor-parallel shards of one stage, which are
data-parallel replicas of the whole pipeline, in which rank order (``tracekit.reconstruct.layout``
finds it; this module holds what it found).

A pipeline rank is one dimension of a larger job. Megatron-LM numbers ranks in the order
``tp-cp-ep-dp-pp`` (megatron/core/parallel_state.py, ``RankGenerator``): the tensor-parallel
rank varies fastest, then the data-parallel rank, the pipeline stage slowest. A job of 16 ranks
with PP 4 x TP 2 x DP 2 has 2 data-parallel replicas, each a 4-stage pipeline whose every stage
runs on 2 ranks; point-to-point messages only flow between the same tensor-parallel rank of
adjacent stages, so the traffic alone shows 4 separate chains of 4 ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracekit.schemas.analysis import LayoutDoc, RoleGroupDoc

# The dimensions, in Megatron's default rank order (fastest first).
ROLES = ("tp", "cp", "ep", "dp", "pp")
ROLE_NAMES = {
    "tp": "tensor parallel",
    "cp": "context parallel",
    "ep": "expert parallel",
    "dp": "data parallel",
    "pp": "pipeline parallel",
}
MEGATRON_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class RoleGroup:
    """One process group and the dimension it spans."""

    role: str  # one of ROLES
    ranks: tuple[int, ...]
    name: str = ""  # the process group's name (pg_config's pg_name), "" when inferred
    description: str = ""  # its description (pg_desc, e.g. TENSOR_MODEL_PARALLEL_GROUP)

    def to_dict(self) -> RoleGroupDoc:
        return {"role": self.role, "ranks": list(self.ranks), "name": self.name, "description": self.description}


@dataclass
class Layout:
    """The job's parallel dimensions and groups."""

    world: int  # ranks in the job (those traced)
    dims: dict[str, int]  # role -> size, every role of ROLES (1 where absent)
    order: str  # roles from fastest-varying rank to slowest, e.g. "tp-dp-pp" (only sizes > 1)
    source: str  # "process groups" (the traces' pg_config) or "traffic" (who talks to whom)
    groups: list[RoleGroup] = field(default_factory=list)
    # The data-parallel replicas: each the ranks of one copy of the model, ordered by stage
    # place then tensor-parallel rank, so that place i of every replica runs the same work.
    replicas: list[list[int]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def size(self, role: str) -> int:
        return self.dims.get(role, 1)

    @property
    def is_3d(self) -> bool:
        """More than a pipeline: tensor, context, expert or data parallel too."""
        return any(self.size(r) > 1 for r in ROLES if r != "pp")

    def groups_of(self, role: str) -> list[tuple[int, ...]]:
        return [g.ranks for g in self.groups if g.role == role]

    def peers(self, role: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group of ``role`` (itself alone where it has none)."""
        for ranks in self.groups_of(role):
            if rank in ranks:
                return ranks
        return (rank,)

    def line(self) -> str:
        """One line: "16 ranks: PP 4 x TP 2 x DP 2, Megatron order tp-dp-pp"."""
        shown = [f"{r.upper()} {self.size(r)}" for r in ("pp", "tp", "cp", "ep", "dp") if self.size(r) > 1 or r == "pp"]
        order = ""
        if len(self.order.split("-")) > 1:
            megatron = [r for r in MEGATRON_ORDER.split("-") if r in self.order.split("-")]
            kind = "Megatron order" if megatron == self.order.split("-") else "rank order"
            order = f", {kind} {self.order}"
        return f"{self.world} ranks: {' x '.join(shown)}{order}"

    def to_dict(self) -> LayoutDoc:
        return {
            "line": self.line(),
            "world": self.world,
            "dims": {r: self.size(r) for r in ROLES},
            "order": self.order,
            "source": self.source,
            "groups": [g.to_dict() for g in self.groups],
            "replicas": [list(r) for r in self.replicas],
            "evidence": list(self.evidence),
        }
