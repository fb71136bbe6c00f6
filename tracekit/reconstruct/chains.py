"""Stages and microbatches of unlabelled actions, from the chains their messages form.

Segmented actions (no labels: native 1F1B, Megatron-core, DeepSpeed), and those of a label
table that names no stage (Megatron's ``forward_step`` / ``backward_step`` frames), know only
their rank and their order. A forward's output travels to the next stage's forward, so each
microbatch's forwards form a chain through the pipeline: the forward that received
nothing (on the first rank) is stage 0, and each forward fed by another is one stage
further along, with the same microbatch. With one stage per rank the chain only confirms
stage = rank. With a virtual pipeline (Megatron's interleaved schedule: rank r holds
stages r, r + p, ...) the chain comes back to the first rank from the last one, and the
forwards it feeds there are stage p, 2p, ...: read by rank alone such a run would look
like 1F1B with v times the microbatches.

A backward belongs to the forward whose autograd sequence numbers it consumed (the
segmentation's ``microbatch`` of a backward is its forward's index on the rank, and so is a
frame table's: ``actions._tie_backwards``), so it takes that forward's stage and microbatch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def restage_from_chains(actions: pd.DataFrame, messages: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Actions with stage and microbatch read from their forward chains, and a note for the
    evidence; the actions unchanged (and None) where the chains do not give one consistent
    placement (each stage on one rank, every forward placed)."""
    if actions.empty or messages.empty:
        return actions, None
    fwd = messages[
        (messages["direction"] == "fwd") & (messages["consumer_action"] >= 0) & (messages["producer_action"] >= 0)
    ]
    kind = actions.set_index("action_id")["kind"]
    fwd = fwd[
        (kind.reindex(fwd["consumer_action"]).to_numpy() == "F")
        & (kind.reindex(fwd["producer_action"]).to_numpy() == "F")
    ]
    fed_by = dict(zip(fwd["consumer_action"].tolist(), fwd["producer_action"].tolist()))
    stage: dict[int, int] = {}
    mb: dict[int, int] = {}
    forwards = actions[actions["kind"] == "F"].sort_values(["step", "start_ns"])
    for _step, group in forwards.groupby("step", sort=False):
        first_rank_seen: dict[int, int] = {}
        for aid, rank in zip(group["action_id"].tolist(), group["rank"].tolist()):
            if aid not in fed_by:  # a chain's head: microbatches count up in its order
                stage[aid] = 0
                mb[aid] = first_rank_seen.get(rank, 0)
                first_rank_seen[rank] = mb[aid] + 1
    # Along the chains. Not in time order: on a GPU the host launches a forward before its
    # input has arrived, so a consumer's host span may start before its producer's.
    pending = [aid for aid in forwards["action_id"].tolist() if aid in fed_by]
    while pending:
        left = []
        for aid in pending:
            producer = fed_by[aid]
            if producer in stage:
                stage[aid] = stage[producer] + 1
                mb[aid] = mb[producer]
            else:
                left.append(aid)
        if len(left) == len(pending):
            break  # a chain whose head is no forward: no placement from chains
        pending = left
    if len(stage) != len(forwards):
        return actions, None
    placed = forwards.assign(stage=forwards["action_id"].map(stage), microbatch=forwards["action_id"].map(mb))
    ranks_of_stage = placed.groupby("stage")["rank"].nunique()
    if (ranks_of_stage != 1).any() or placed.groupby(["step", "stage"])["microbatch"].apply(
        lambda s: s.duplicated().any()
    ).any():
        return actions, None
    if placed.groupby(["step", "rank"])["stage"].nunique().max() <= 1 and (placed["stage"] == placed["rank"]).all():
        return actions, None  # one stage per rank: the rank already says it
    # A backward's segmentation microbatch is its forward's index on (rank, step).
    placed = placed.assign(index=placed.groupby(["rank", "step"]).cumcount())
    by_index = {
        (int(r), int(s), int(i)): (int(st), int(m))
        for r, s, i, st, m in placed[["rank", "step", "index", "stage", "microbatch"]].itertuples(index=False)
    }
    out = actions.copy()
    out.loc[placed.index, ["stage", "microbatch"]] = placed[["stage", "microbatch"]].to_numpy()
    backward = out.index[out["kind"] != "F"]
    new = [
        by_index.get((int(r), int(s), int(i)))
        for r, s, i in out.loc[backward, ["rank", "step", "microbatch"]].itertuples(index=False)
    ]
    if any(x is None for x in new):
        return actions, None
    out.loc[backward, ["stage", "microbatch"]] = np.array(new, dtype=np.int64)
    n_stages = int(placed["stage"].max()) + 1
    p = int(placed["rank"].nunique())
    return out, (
        f"stages read from the forward chains: activations leave the last rank for the first, "
        f"{n_stages} stages on {p} ranks"
    )
