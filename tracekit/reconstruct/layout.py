"""The job's layout: tensor-parallel shards, data-parallel replicas and pipeline stages, from
the traces' process groups, held against who talks to whom.

Point-to-point messages flow only between the same tensor-parallel (and data-parallel) rank of
adjacent stages, so the traffic alone splits a job of PP 4 x TP 2 into two chains of 4 ranks,
which look exactly like two data-parallel replicas. What tells them apart:

- **The process groups** each rank's trace lists (Kineto ``distributedInfo.pg_config``: name,
  description, ranks). Megatron-LM describes every group it creates
  (megatron/core/parallel_state.py ``initialize_model_parallel``: ``create_group(...,
  group_desc="TENSOR_MODEL_PARALLEL_GROUP")``, ``DATA_PARALLEL_GROUP``,
  ``PIPELINE_MODEL_PARALLEL_GROUP``, ``CONTEXT_PARALLEL_GROUP``, ``EXPERT_MODEL_PARALLEL_GROUP``);
  torch's DeviceMesh names its groups ``mesh_<dim>`` (``mesh_tp``, ``mesh_dp_replicate``,
  ``mesh_pp``). Each is tested against the trace before it is believed: every message must
  run inside one pipeline group, and the ranks of a tensor- or data-parallel group must run
  the same stages.
- **The collectives**, where no group is described (or the descriptions fail the test):
  tensor-parallel shards all-reduce inside every forward and backward
  (megatron/core/tensor_parallel/mappings.py), data-parallel replicas only reduce gradients,
  after or at the end of the backward. Ranks at the same place of the chains whose collectives
  run inside their actions are one stage's shards; otherwise the chains are replicas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tracekit.model.layout import MEGATRON_ORDER, ROLES, Layout, RoleGroup
from tracekit.reconstruct.peers import ProcessGroup

# Megatron-LM's group descriptions (megatron/core/parallel_state.py), exactly: its other groups
# (TENSOR_AND_DATA_PARALLEL_GROUP, EXPERT_TENSOR_PARALLEL_GROUP, ...) span two dimensions.
_MEGATRON_DESCRIPTIONS = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "DATA_PARALLEL_GROUP": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
}
#: the descriptions above: a trace that holds one was written by Megatron (tracekit.analyze.framework)
MEGATRON_DESCRIPTIONS = frozenset(_MEGATRON_DESCRIPTIONS)
# torch DeviceMesh: each mesh dimension's group is described "mesh_<dim name>"
# (torch/distributed/device_mesh.py, _init_process_groups: group_desc=f"mesh_{dim_name}").
_MESH = re.compile(r"^mesh_([a-z]+)(?:_(replicate|shard))?$")
_MESH_ROLES = {
    "tp": "tp",
    "tensor": "tp",
    "cp": "cp",
    "context": "cp",
    "ep": "ep",
    "expert": "ep",
    "dp": "dp",
    "data": "dp",
    "pp": "pp",
    "pipe": "pp",
    "pipeline": "pp",
}
# Host ops of a collective (gloo and NCCL alike): the c10d dispatcher's ops.
_COLLECTIVE = re.compile(
    r"^c10d::(?:allreduce_|all_reduce|allreduce_coalesced_|allgather_|_allgather_base_|allgather_into_tensor_coalesced_|"
    r"reduce_scatter_|_reduce_scatter_base_|reduce_scatter_tensor_coalesced_|alltoall_|alltoall_base_|broadcast_|reduce_)$"
)
# A rank's collectives run inside its actions when at least this many per action do.
_PER_ACTION = 0.5


def role_of(group: ProcessGroup) -> str | None:
    """The dimension a process group spans, from its description (None: not one of them)."""
    described = _MEGATRON_DESCRIPTIONS.get(group.description.strip())
    if described:
        return described
    mesh = _MESH.match(group.description.strip().lower())
    if mesh and mesh.group(2) != "shard":
        return _MESH_ROLES.get(mesh.group(1))
    return None


def collective_ops(events: pd.DataFrame) -> pd.DataFrame:
    """The host ops of collectives (rank, tid, name, start_ns, end_ns): all-reduce,
    all-gather, reduce-scatter, all-to-all, broadcast, reduce; P2P and barriers aside."""
    if events.empty:
        return pd.DataFrame({"rank": [], "tid": [], "name": [], "start_ns": [], "end_ns": []})
    host = events[~events["on_gpu"].astype(bool)]
    names = host["name"].astype(str)
    hit = names.str.startswith("c10d::")
    if hit.any():
        hit[hit] = names[hit].str.match(_COLLECTIVE)
    found = host.loc[hit, ["rank", "tid", "name", "start_ns", "end_ns"]]
    return found.assign(name=found["name"].astype(str)).reset_index(drop=True)


def group_strides(events: pd.DataFrame) -> pd.DataFrame:
    """NCCL's collectives that say how their group's ranks are spaced (rank, start_ns, stride:
    ``record_param_comms``' "Global rank stride", which the parser keeps in ``tag``)."""
    if events.empty:
        return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": [], "stride": []})
    host = events[~events["on_gpu"].astype(bool)]
    names = host["name"].astype(str)
    hit = names.str.startswith("record_param_comms:") & (host["tag"] > 0)
    found = host.loc[hit, ["rank", "start_ns", "end_ns", "tag"]].rename(columns={"tag": "stride"})
    return found.reset_index(drop=True)


def collectives_inside_actions(
    collectives: pd.DataFrame, actions: pd.DataFrame, kinds: tuple[str, ...] | None = None
) -> pd.Series:
    """Per collective (in ``collectives``' order): whether it started inside one of its rank's
    actions (the action's host span; only actions of ``kinds`` where given)."""
    inside = np.zeros(len(collectives), dtype=bool)
    if kinds is not None:
        actions = actions[actions["kind"].isin(kinds)]
    if collectives.empty or actions.empty:
        return pd.Series(inside, index=collectives.index)
    lo = actions["label_start_ns"].where(actions["label_start_ns"] >= 0, actions["start_ns"])
    hi = actions["label_end_ns"].where(actions["label_end_ns"] >= 0, actions["end_ns"])
    for rank, rows in collectives.groupby("rank").indices.items():
        mine = (actions["rank"] == rank).to_numpy()
        starts, ends = lo[mine].to_numpy(), hi[mine].to_numpy()
        if not len(starts):
            continue
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], np.maximum.accumulate(ends[order])
        t = collectives["start_ns"].to_numpy()[rows]
        k = np.searchsorted(starts, t, side="right") - 1
        inside[rows] = (k >= 0) & (ends[np.maximum(k, 0)] >= t)
    return pd.Series(inside, index=collectives.index)


def find_layout(
    ranks: Sequence[int],
    groups: Mapping[int, list[ProcessGroup]],
    actions: pd.DataFrame,
    messages: pd.DataFrame,
    pipelines: list[list[int]],
    collectives: pd.DataFrame,
    strides: pd.DataFrame | None = None,
) -> Layout | None:
    """The job's layout (module doc); None for a single rank. ``pipelines``: the chains of
    ranks joined by messages (:func:`tracekit.reconstruct.pipelines.pipeline_groups`);
    ``collectives``: :func:`collective_ops`; ``strides``: :func:`group_strides`."""
    if strides is None:
        strides = group_strides(pd.DataFrame())
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) < 2:
        return None
    stages = _stage_places(actions, pipelines)
    declared = _declared(ranks, groups)
    if declared is not None:
        problem = _contradiction(declared, messages, stages)
        if problem is None:
            return _built(ranks, declared, "process groups", [_declared_note(declared)], _described(ranks, groups))
        evidence = [f"process groups not used: {problem}"]
    else:
        evidence = []
    inferred, note = _inferred(ranks, pipelines, actions, collectives, strides)
    return _built(ranks, inferred, "traffic", [*evidence, note])


def _declared(ranks: list[int], groups: Mapping[int, list[ProcessGroup]]) -> dict[str, list[tuple[int, ...]]] | None:
    """Role -> its groups' ranks, from the described process groups of the traced ranks; None
    where no group has a role or a role's groups do not partition the ranks evenly."""
    found: dict[str, dict[tuple[int, ...], None]] = {}
    for group in _described(ranks, groups).values():
        found.setdefault(group.role, {})[group.ranks] = None
    if not found:
        return None
    out: dict[str, list[tuple[int, ...]]] = {}
    for role, seen in found.items():
        by_rank: dict[int, tuple[int, ...]] = {}
        for members in seen:
            for r in members:
                if by_rank.setdefault(r, members) != members:
                    return None  # a rank in two groups of one role: not a partition
        sizes = {len(m) for m in seen}
        if len(sizes) != 1:
            return None
        out[role] = sorted(seen)
    if not any(len(g[0]) > 1 for g in out.values()):
        return None
    return out


def _described(
    ranks: list[int], groups: Mapping[int, list[ProcessGroup]]
) -> dict[tuple[str, tuple[int, ...]], RoleGroup]:
    """The traced ranks' process groups that span one dimension, by role and (sorted) ranks,
    with their names and descriptions."""
    out: dict[tuple[str, tuple[int, ...]], RoleGroup] = {}
    for rank in ranks:
        for group in groups.get(rank, []):
            role = role_of(group)
            if role is not None and group.ranks:
                members = tuple(sorted(group.ranks))
                out.setdefault((role, members), RoleGroup(role, members, group.name, group.description))
    return out


def _declared_note(declared: dict[str, list[tuple[int, ...]]]) -> str:
    said = ", ".join(
        f"{role.upper()} {len(gs[0])}" for role, gs in sorted(declared.items(), key=lambda kv: ROLES.index(kv[0]))
    )
    return f"layout from the traces' process groups ({said}), checked against the messages and stages"


def _stage_places(actions: pd.DataFrame, pipelines: list[list[int]]) -> dict[int, frozenset[int]]:
    """rank -> the stages it runs (its place in its chain where stages are numbered by rank)."""
    if actions.empty:
        return {}
    if bool((actions["stage"] == actions["rank"]).all()):
        return {r: frozenset({i}) for chain in pipelines for i, r in enumerate(chain)}
    pairs = actions[["rank", "stage"]].drop_duplicates()
    out: dict[int, set[int]] = {}
    for rank, stage in zip(pairs["rank"].tolist(), pairs["stage"].tolist()):
        out.setdefault(int(rank), set()).add(int(stage))
    return {r: frozenset(s) for r, s in out.items()}


def _contradiction(
    declared: dict[str, list[tuple[int, ...]]], messages: pd.DataFrame, stages: dict[int, frozenset[int]]
) -> str | None:
    """What in the trace says the declared groups are wrong (None: nothing)."""
    pp = declared.get("pp")
    if pp is not None and not messages.empty:
        group_of = {r: i for i, g in enumerate(pp) for r in g}
        pairs = set(zip(messages["src_rank"].tolist(), messages["dst_rank"].tolist()))
        for src, dst in sorted(pairs):
            if group_of.get(int(src), -1) != group_of.get(int(dst), -2):
                return f"ranks {src} and {dst} exchange messages but are in no pipeline group together"
    for role in ("tp", "dp", "cp"):
        for members in declared.get(role, []):
            runs = {stages[r] for r in members if r in stages}
            if len(runs) > 1:
                return f"the {role.upper()} group {list(members)} runs different stages"
    return None


def _inferred(
    ranks: list[int],
    pipelines: list[list[int]],
    actions: pd.DataFrame,
    collectives: pd.DataFrame,
    strides: pd.DataFrame,
) -> tuple[dict[str, list[tuple[int, ...]]], str]:
    """Role -> groups from the traffic (module doc), and how they were found."""
    chains = [sorted(c) for c in pipelines if c]
    if len(chains) < 2 or len({len(c) for c in chains}) != 1:
        return {"pp": [tuple(ranks)]}, "layout from the messages: one pipeline"
    same_place = [tuple(sorted(chain[i] for chain in chains)) for i in range(len(chains[0]))]
    inside = collectives_inside_actions(collectives, actions)
    per_rank = collectives.loc[inside.to_numpy(), "rank"].value_counts() if len(collectives) else pd.Series(dtype=int)
    n_actions = actions.groupby("rank").size() if not actions.empty else pd.Series(dtype=int)
    sharded = [r for r in ranks if n_actions.get(r, 0) and per_rank.get(r, 0) >= _PER_ACTION * n_actions.get(r, 0)]
    pp = [tuple(c) for c in chains]
    split = _split_by_strides(same_place, strides, actions) if len(strides) else None
    if split is not None:
        tp_groups, dp_groups, note = split
        roles = {"pp": pp, **({"tp": tp_groups} if len(tp_groups[0]) > 1 else {})}
        if len(dp_groups[0]) > 1:
            roles["dp"] = dp_groups
        return roles, note
    if len(sharded) == len(ranks):
        note = (
            f"layout from the traffic: {len(chains)} chains of messages whose ranks at each place "
            "all-reduce inside every action: one stage's tensor-parallel shards"
        )
        return {"pp": pp, "tp": same_place}, note
    note = f"layout from the traffic: {len(chains)} chains of messages, no collective inside their actions: data-parallel replicas"
    return {"pp": pp, "dp": same_place}, note


def _split_by_strides(
    same_place: list[tuple[int, ...]], strides: pd.DataFrame, actions: pd.DataFrame
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], str] | None:
    """The ranks at each place split into tensor- and data-parallel groups by how their
    collectives' groups are spaced: the stride of the collectives inside forwards is the
    tensor-parallel group's, any other the data-parallel group's (Megatron's order puts TP
    ranks next to each other, DP ranks TP apart). None where the strides do not tile the
    places."""
    forward = collectives_inside_actions(strides, actions, ("F",)).to_numpy()
    tp_strides = set(strides.loc[forward, "stride"].astype(int).tolist())
    other = set(strides.loc[~forward, "stride"].astype(int).tolist()) - tp_strides
    if len(tp_strides) > 1 or len(other) > 1:
        return None
    size = len(same_place[0])
    s_tp = next(iter(tp_strides), None)
    s_dp = next(iter(other), None)
    if s_tp is not None and s_dp is not None:
        if s_dp % s_tp or not 1 < s_dp // s_tp <= size or size % (s_dp // s_tp):
            return None
        tp = s_dp // s_tp
    elif s_tp is not None:
        tp = size
    else:
        tp = 1
    step_tp = s_tp or 1
    tp_groups = _strided_groups(same_place, step_tp, tp)
    dp_groups = _strided_groups(same_place, s_dp or step_tp * tp, size // tp)
    if tp_groups is None or dp_groups is None:
        return None
    note = (
        f"layout from the traffic: {len(same_place[0])} chains of messages; the collectives' group strides "
        f"(record_param_comms' Global rank stride: {s_tp} inside forwards, {s_dp} outside) split each place "
        f"into TP {tp} x DP {size // tp}"
    )
    return sorted(tp_groups), sorted(dp_groups), note


def _strided_groups(places: list[tuple[int, ...]], stride: int, size: int) -> list[tuple[int, ...]] | None:
    """Each place's ranks in groups of ``size`` spaced ``stride`` apart, from the lowest rank
    not yet grouped; None where a group would leave its place."""
    groups: list[tuple[int, ...]] = []
    for place in places:
        members = set(place)
        for r in place:
            if not any(r in g for g in groups):
                group = tuple(r + i * stride for i in range(size))
                if not set(group) <= members:
                    return None
                groups.append(group)
    return groups


def _built(
    ranks: list[int],
    roles: dict[str, list[tuple[int, ...]]],
    source: str,
    evidence: list[str],
    described: Mapping[tuple[str, tuple[int, ...]], RoleGroup] | None = None,
) -> Layout:
    """The layout of ``roles`` (role -> its groups' ranks); ``described``: the process groups
    the traces name, whose names and descriptions the groups keep."""
    dims = {role: (len(roles[role][0]) if role in roles else 1) for role in ROLES}
    if "pp" not in roles:  # no pipeline group described: the rest of the job is the pipeline
        others = int(np.prod([dims[r] for r in ROLES if r != "pp"]))
        dims["pp"] = max(1, len(ranks) // max(others, 1))
    strides = {}
    for role, groups in roles.items():
        if dims[role] > 1:
            strides[role] = min(int(np.diff(g).min()) for g in groups if len(g) > 1)
    order = "-".join(sorted(strides, key=lambda r: (strides[r], MEGATRON_ORDER.split("-").index(r))))
    position = {role: {r: i for g in groups for i, r in enumerate(g)} for role, groups in roles.items()}

    def place(rank: int) -> tuple[int, ...]:
        return tuple(position.get(role, {}).get(rank, 0) for role in ("pp", "tp", "cp", "ep"))

    dp_index = position.get("dp", {})
    replicas: dict[int, list[int]] = {}
    for rank in ranks:
        replicas.setdefault(dp_index.get(rank, 0) if dims["dp"] > 1 else 0, []).append(rank)
    named = described or {}
    role_groups = [
        named.get((role, g), RoleGroup(role, g))
        for role in ROLES
        for g in roles.get(role, [])
        if dims[role] > 1 or role == "pp"
    ]
    return Layout(
        world=len(ranks),
        dims=dims,
        order=order,
        source=source,
        groups=role_groups,
        replicas=[sorted(rs, key=place) for _, rs in sorted(replicas.items())],
        evidence=evidence,
    )
