"""Point-to-point messages: each send matched to its receive across ranks.

gloo (CPU): ``c10d::send`` / ``c10d::recv_`` ops carry peer, tag and size (with
``record_shapes=True``); the ``gloo:recv`` annotation that starts inside a ``c10d::recv_``
ends when the receiver's ``wait()`` returns, i.e. when the data was there for it.
NCCL (``record_param_comms:send`` / ``:recv``) is read the same way from the CPU side.

Sends and receives are paired per (src, dst, tag, step) in posting order, and each message
is tied to the compute action that produced it (last action on the sender that ended
before the send was posted) and the one that consumed it (first action on the receiver
that started after the data was there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pandas as pd

from tracekit.model.groups import SortedGroups, pair_codes
from tracekit.model.run import MESSAGE_COLUMNS
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.labels import p2p_action, p2p_ways
from tracekit.reconstruct.peers import ProcessGroup, Resolved, contradiction, matched_sides, through_groups
from tracekit.reconstruct.p2p_sides import DIRECTIONS, p2p_sides
from tracekit.reconstruct.steps import step_of

# A receive's wait may return a hair after its consumer's first op is recorded as started.
_TOLERANCE_NS = 20_000


def _with_steps(ops: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    return ops.assign(step=step_of(ops["rank"].to_numpy(), ops["start_ns"].to_numpy(), steps))


def _recv_done_times(events: pd.DataFrame, recvs: pd.DataFrame) -> np.ndarray:
    """When each receive's wait returned: the end of its gloo:recv annotation (the first
    one posted inside the ``recv_`` op that no earlier receive of its rank took, the rank's
    receives taken in table order)."""
    done = recvs["end_ns"].to_numpy().copy()
    annotations = events[(events["name"] == "gloo:recv") & ~events["on_gpu"]]
    annotations = annotations.sort_values(["rank", "start_ns"], kind="stable")
    a_rank = annotations["rank"].to_numpy()
    a_end = annotations["end_ns"].to_numpy()
    r_rank = recvs["rank"].to_numpy()
    r_start, r_end = recvs["start_ns"].to_numpy(), recvs["end_ns"].to_numpy()
    # Each receive's candidates: the annotations [lo, hi) of its rank posted inside it. One
    # searchsorted for all ranks, not a slice per receive.
    posted = SortedGroups(a_rank, annotations["start_ns"].to_numpy())
    lo, hi = posted.position(r_rank, r_start, "left"), posted.position(r_rank, r_end, "right")
    # Where no two receives of a rank share a candidate, each takes its first one. A rank
    # where some do (threads receiving at once) takes them one receive after another. Ranks'
    # candidates are disjoint blocks, so in order of lo a range that starts before an earlier
    # one ends shares with a receive of its own rank.
    some = np.flatnonzero(lo < hi)
    by_lo = some[np.lexsort((hi[some], lo[some]))]
    overlapping = by_lo[1:][lo[by_lo[1:]] < np.maximum.accumulate(hi[by_lo])[:-1]]
    in_turn = np.isin(r_rank, r_rank[overlapping])
    alone = some[~in_turn[some]]
    done[alone] = np.maximum(r_end[alone], a_end[lo[alone]])
    used = np.zeros(len(annotations), dtype=bool)
    turns = np.flatnonzero(in_turn)
    for i in turns[np.argsort(r_rank[turns], kind="stable")].tolist():
        for k in range(int(lo[i]), int(hi[i])):
            if not used[k]:
                used[k] = True
                done[i] = max(r_end[i], a_end[k])
                break
    return done


def _suffix_min(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value's minimum with the values after it in its group (``group`` ascending)."""
    distinct = np.unique(values)
    number = np.unique(group, return_inverse=True)[1].astype(np.int64)
    width = len(distinct) + 1
    keys = number * width + np.searchsorted(distinct, values)
    # Walking back, a later group's keys are all above this group's: the minimum restarts.
    low = np.minimum.accumulate(keys[::-1])[::-1]
    return distinct[low - number * width]


def host_p2p_ops(events: pd.DataFrame) -> pd.DataFrame:
    """The host's point-to-point calls, one row per message side (``direction`` send or
    recv), with the peer and size of the ranges folded into each
    (:func:`~.p2p_sides.p2p_sides`), in order of rank, thread and start."""
    sides = p2p_sides(EventArrays.of(events))
    ops = events.iloc[sides.rows]
    return ops.assign(
        direction=np.array(DIRECTIONS, dtype=object)[sides.direction], peer=sides.peer, nbytes=sides.nbytes
    )


def match_messages(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    actions: pd.DataFrame,
    consumer_by_kind: bool = False,
    groups: dict[int, list[ProcessGroup]] | None = None,
    notes: list[str] | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Pair sends with receives; return the messages table and warnings.

    ``notes``: where to put what was found that is no problem (peers a format does not name,
    read from the framework's ranges or the pipeline's shape; sends in flight past the
    profile's end); without it they join the warnings.

    ``groups``: each rank's process groups (``distributedInfo.pg_config``), which the peers
    the metadata names may be ranks of (:mod:`tracekit.reconstruct.peers`).

    ``consumer_by_kind``: an activation's consumer is the receiver's next forward and a
    gradient's its next backward, not just its next action (segmented runs, where every
    action is one forward or one backward: schedules that receive ahead, Megatron's
    ``send_forward_recv_backward``, would otherwise feed a forward's input to a backward).
    Labelled runs keep the next action: a fused ``OVERLAP_F_B`` range sends both an
    activation and a gradient after its backward part, so its kind says nothing."""
    warnings: list[str] = []
    said = warnings if notes is None else notes
    sides = host_p2p_ops(events)
    sends = _with_steps(sides[sides["direction"] == "send"], steps).sort_values("start_ns")
    recvs = _with_steps(sides[sides["direction"] == "recv"], steps).sort_values("start_ns")
    if sends.empty and recvs.empty:
        return pd.DataFrame(columns=MESSAGE_COLUMNS), warnings
    recvs = recvs.assign(done_ns=_recv_done_times(events, recvs))
    sends, recvs = _with_action_labels(sends, events), _with_action_labels(recvs, events)
    sends, recvs, named = _peers_from_ranges(sends, recvs, events)
    if named:
        said.append(
            f"{named} send/recv ops name no peer rank; their peers are read from the framework's "
            "P2P ranges around them (Megatron's p2p_communication functions)"
        )
    groups = groups or {}
    order = _pipeline_order(groups, actions)  # the ranks in pipeline order, if a group lists it
    resolved = _resolve_peers(sends, recvs, actions, groups, order)
    sends, recvs = resolved.sends, resolved.recvs
    if resolved.warning:
        warnings.append(resolved.warning)
    unknown_before = int((sends["peer"] < 0).sum() + (recvs["peer"] < 0).sum())
    if unknown_before:
        sends, recvs = _infer_peers(sends, recvs, actions, order)
        inferred = unknown_before - int((sends["peer"] < 0).sum() + (recvs["peer"] < 0).sum())
        said.append(
            f"{unknown_before} send/recv ops name no peer rank (Kineto without record_shapes=True, "
            f"or Nsight Systems NVTX); {inferred} peers inferred from stage adjacency of the "
            "action they follow or feed"
        )
        if inferred < unknown_before:
            warnings.append(f"{unknown_before - inferred} send/recv ops have no known peer and are not matched")
    # The k-th send from src to dst with a tag in a step pairs with the k-th such receive.
    keys = ["src_rank", "dst_rank", "tag", "step", "k"]
    known_sends = sends[sends["peer"] >= 0].rename(columns={"rank": "src_rank", "peer": "dst_rank"})
    known_recvs = recvs[recvs["peer"] >= 0].rename(columns={"rank": "dst_rank", "peer": "src_rank"})
    if (known_sends["tag"] < 0).any() or (known_recvs["tag"] < 0).any():
        # one side names no tags (Nsight Systems): pair in posting order, tags aside
        known_sends, known_recvs = known_sends.assign(tag=-1), known_recvs.assign(tag=-1)
    known_sends = known_sends.assign(k=known_sends.groupby(keys[:4]).cumcount())
    known_recvs = known_recvs.assign(k=known_recvs.groupby(keys[:4]).cumcount())
    labelled = list(_LABEL_COLUMNS)
    pairs = known_sends[keys + ["start_ns", "nbytes", "file_id", "source_index", *labelled]].merge(
        known_recvs[keys + ["start_ns", "done_ns", "nbytes", "file_id", "source_index", "tid", *labelled]],
        on=keys,
        suffixes=("_s", "_r"),
    )
    pairs = pairs.assign(dst_step=pairs["step"])
    pairs = pd.concat([pairs, _across_steps(known_sends, known_recvs, pairs)], ignore_index=True)
    unmatched_sends = len(known_sends) - len(pairs)
    unmatched_recvs = len(known_recvs) - len(pairs)
    size_mismatch = int(
        ((pairs["nbytes_s"] >= 0) & (pairs["nbytes_r"] >= 0) & (pairs["nbytes_s"] != pairs["nbytes_r"])).sum()
    )
    messages = pd.DataFrame(
        {
            "step": pairs["step"],
            "src_rank": pairs["src_rank"],
            "dst_rank": pairs["dst_rank"],
            "tag": pairs["tag"],
            "nbytes": np.maximum(pairs["nbytes_s"], pairs["nbytes_r"]),
            "send_post_ns": pairs["start_ns_s"],
            "recv_post_ns": pairs["start_ns_r"],
            "recv_done_ns": pairs["done_ns"],
            "src_file_id": pairs["file_id_s"],
            "src_source_index": pairs["source_index_s"],
            "dst_file_id": pairs["file_id_r"],
            "dst_source_index": pairs["source_index_r"],
            "dst_tid": pairs["tid"],
            "dst_step": pairs["dst_step"],
            **{f"src_{c}": pairs[f"{c}_s"] for c in _LABEL_COLUMNS},
            **{f"dst_{c}": pairs[f"{c}_r"] for c in _LABEL_COLUMNS},
        }
    ).astype("int64")
    if unmatched_sends or unmatched_recvs:
        if _in_flight_at_the_edges(known_sends, known_recvs, pairs, steps):
            said.append(
                f"{unmatched_sends} sends of the last step and {unmatched_recvs} receives of the first "
                "have their partners outside the profile (in flight across its edges: a pipeline "
                "without a flush sends into its next step)"
            )
        else:
            warnings.append(
                f"{unmatched_sends} sends and {unmatched_recvs} receives have no partner in the "
                "trace (a rank's trace missing, or the profiling windows differ)"
            )
    if size_mismatch:
        warnings.append(f"{size_mismatch} matched messages differ in size between sender and receiver")
    if messages.empty:
        return pd.DataFrame(columns=MESSAGE_COLUMNS), warnings
    messages = messages.sort_values(["step", "send_post_ns"]).reset_index(drop=True)
    messages["msg_id"] = np.arange(len(messages))
    if consumer_by_kind and order is not None and order != sorted(order):
        # which way a message goes is read from its ranks' places in the pipeline, which its
        # pipeline group lists (the job's rank numbers need not run along it)
        place = {rank: i for i, rank in enumerate(order)}
        placed = messages.assign(src_rank=messages["src_rank"].map(place), dst_rank=messages["dst_rank"].map(place))
        _link_actions(placed, actions.assign(rank=actions["rank"].map(place)), consumer_by_kind)
        for column in ("producer_action", "consumer_action", "direction"):
            messages[column] = placed[column].to_numpy()
    else:
        _link_actions(messages, actions, consumer_by_kind)
    _link_by_labels(messages, actions)
    messages["recv_wait_ns"] = 0
    messages["arrival_ns"] = messages["recv_done_ns"]
    return messages[MESSAGE_COLUMNS + ["dst_tid"]], warnings


# Per message side, what its framework range says (torch pipelining's ``PP:4SEND_F4``): the
# stage, the way (1 forward: an activation, 2 backward: a gradient) and the microbatch of the
# action whose data it carries; -1 where no such range holds the side.
_LABEL_COLUMNS = ("label_stage", "label_way", "label_mb")


def _with_action_labels(sides: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """The sides with :data:`_LABEL_COLUMNS`: the torch pipelining P2P range on the side's
    thread that holds the op's start (ranges of one thread never overlap)."""
    out = {c: np.full(len(sides), -1, dtype=np.int64) for c in _LABEL_COLUMNS}
    if len(sides):
        on_cpu = ~events["on_gpu"].to_numpy(bool)
        named = events["name"].astype(str)
        read = {n: p2p_action(n) for n in named[on_cpu].unique()}
        said = {n: a for n, a in read.items() if a is not None}
        if said:
            ranges = events[on_cpu & named.isin(said).to_numpy()]
            actions = [said[n] for n in ranges["name"].astype(str)]
            stage = np.array([a[0] for a in actions], dtype=np.int64)
            way = np.array([1 if a[1] == "F" else 2 for a in actions], dtype=np.int64)
            mb = np.array([a[2] for a in actions], dtype=np.int64)
            thread, side_thread = pair_codes(
                ranges["rank"].to_numpy(np.int64),
                ranges["tid"].to_numpy(np.int64),
                (sides["rank"].to_numpy(np.int64), sides["tid"].to_numpy(np.int64)),
            )
            start, end = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
            order = np.lexsort((start, thread))  # by thread, then start: as SortedGroups needs
            side_start = sides["start_ns"].to_numpy(np.int64)
            found = SortedGroups(thread[order], start[order]).last_at_most(side_thread, side_start)
            hit = found >= 0
            at = order[found[hit]]
            hit[hit] = end[at] >= side_start[hit]
            at = order[found[hit]]
            for column, values in zip(_LABEL_COLUMNS, (stage, way, mb)):
                out[column][hit] = values[at]
    return sides.assign(**out)


def _in_flight_at_the_edges(sends: pd.DataFrame, recvs: pd.DataFrame, pairs: pd.DataFrame, steps: pd.DataFrame) -> bool:
    """Whether every call left without a partner is a send of its rank's last profiled step
    or a receive of its first: a message in flight across the profile's edge, not a missing
    one (the partner's step was not recorded)."""
    last = steps.groupby("rank")["step"].max().to_dict()
    first = steps.groupby("rank")["step"].min().to_dict()
    for sides, side_key, rank_key, edge in ((sends, "_s", "src_rank", last), (recvs, "_r", "dst_rank", first)):
        paired = set(zip(pairs[f"file_id{side_key}"], pairs[f"source_index{side_key}"]))
        left = [
            (rank, step)
            for rank, step, f, i in zip(sides[rank_key], sides["step"], sides["file_id"], sides["source_index"])
            if (f, i) not in paired
        ]
        if any(step != edge.get(rank) for rank, step in left):
            return False
    return True


def _across_steps(sends: pd.DataFrame, recvs: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Pairs of the sends and receives left over by per-step pairing, where the receive is
    in the sender's next step: a pipeline without a flush (PipeDream-2BW) sends the last
    activations of a step to a rank that has begun its next one. Only tagged messages
    (the tag tells them apart across steps), in posting order per (src, dst, tag)."""
    keys = ["src_rank", "dst_rank", "tag", "step", "k"]
    left_s = sends.merge(pairs[keys], on=keys, how="left", indicator=True)
    left_s = left_s[(left_s["_merge"] == "left_only") & (left_s["tag"] >= 0)].drop(columns="_merge")
    left_r = recvs.merge(pairs[keys], on=keys, how="left", indicator=True)
    left_r = left_r[(left_r["_merge"] == "left_only") & (left_r["tag"] >= 0)].drop(columns="_merge")
    if left_s.empty or left_r.empty:
        return pairs.iloc[0:0]
    by = ["src_rank", "dst_rank", "tag"]
    left_s = left_s.sort_values("start_ns").assign(j=lambda f: f.groupby(by).cumcount())
    left_r = left_r.sort_values("start_ns").assign(j=lambda f: f.groupby(by).cumcount())
    labelled = list(_LABEL_COLUMNS)
    cross = left_s[by + ["j", "step", "k", "start_ns", "nbytes", "file_id", "source_index", *labelled]].merge(
        left_r[by + ["j", "step", "start_ns", "done_ns", "nbytes", "file_id", "source_index", "tid", *labelled]],
        on=by + ["j"],
        suffixes=("_s", "_r"),
    )
    cross = cross[cross["step_r"] == cross["step_s"] + 1]
    return cross.rename(columns={"step_s": "step", "step_r": "dst_step"}).drop(columns="j")


def _peers_from_ranges(
    sends: pd.DataFrame, recvs: pd.DataFrame, events: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Peers of P2P ops that name none, from a framework range around them that says which
    way they go (:func:`tracekit.reconstruct.labels.p2p_ways`): the next or previous rank of
    the pipeline, wrapping around as Megatron's ranks do. A range whose op count differs
    from what its name says is left to inference."""
    if not ((sends["peer"] < 0).any() or (recvs["peer"] < 0).any()):
        return sends, recvs, 0
    annotations = events[(events["cat"] == "user_annotation").to_numpy() & ~events["on_gpu"].to_numpy()]
    ways = {str(n): p2p_ways(str(n)) for n in annotations["name"].unique()}
    ranges = annotations[annotations["name"].map(lambda n: ways.get(str(n)) is not None).to_numpy(dtype=bool)]
    if ranges.empty:
        return sends, recvs, 0
    ranks: list[int] = sorted(set(sends["rank"].tolist()) | set(recvs["rank"].tolist()))
    place = {r: i for i, r in enumerate(ranks)}

    def peer_of(rank: int, way: str) -> int:
        i = place[rank] + (1 if way == "next" else -1)
        return ranks[i % len(ranks)]

    sends, recvs = sends.copy(), recvs.copy()
    named = 0
    ambiguous: list[tuple[int, int, int]] = []  # (side, row, rank) of lone ops either way
    for (rank, tid), group in ranges.groupby(["rank", "tid"]):
        group = group.sort_values("start_ns")
        r_start, r_end = group["start_ns"].to_numpy(), group["end_ns"].to_numpy()
        r_ways = [ways[str(n)] for n in group["name"]]
        for side, table in ((0, sends), (1, recvs)):
            mine = table[(table["rank"] == rank) & (table["tid"] == tid) & (table["peer"] < 0)].sort_values("start_ns")
            if mine.empty:
                continue
            k = np.searchsorted(r_start, mine["start_ns"].to_numpy(), side="right") - 1
            inside = (k >= 0) & (mine["start_ns"].to_numpy() <= r_end[np.maximum(k, 0)])
            for j in np.unique(k[inside]):
                ops = mine.index[inside & (k == j)]
                wanted = r_ways[j][side]
                if len(wanted) == len(ops):
                    table.loc[ops, "peer"] = [peer_of(int(rank), w) for w in wanted]
                    named += len(ops)
                elif len(set(wanted)) == 1 and wanted:
                    table.loc[ops, "peer"] = peer_of(int(rank), wanted[0])
                    named += len(ops)
                elif len(ops) == 1 and len(wanted) == 2:
                    way = _one_of_two(side, place[int(rank)] == len(ranks) - 1)
                    if way is None:
                        ambiguous.append((side, ops[0], int(rank)))
                    else:
                        table.loc[ops, "peer"] = peer_of(int(rank), way)
                        named += 1
    named += _settle_by_counts(ambiguous, sends, recvs, peer_of)
    return sends, recvs, named


def _settle_by_counts(
    ambiguous: list[tuple[int, int, int]],
    sends: pd.DataFrame,
    recvs: pd.DataFrame,
    peer_of: Callable[[int, str], int],
    max_choices: int = 256,
) -> int:
    """Peers of lone ops that could go either way, from the other side: a rank's peer
    posted as many matching ops as it has partners. Of the ways to pick which ops go to the
    next rank, the one whose pairs (in posting order) never deliver before the send was
    posted. Left unknown where the counts or the times do not settle it."""
    from itertools import combinations

    settled = 0
    groups: dict[tuple[int, int, int], list[int]] = {}
    for side, row, rank in ambiguous:
        table = sends if side == 0 else recvs
        groups.setdefault((side, rank, int(cast(int, table.at[row, "step"]))), []).append(row)
    for (side, rank, step), rows in groups.items():
        mine, theirs = (sends, recvs) if side == 0 else (recvs, sends)
        nxt, prv = peer_of(rank, "next"), peer_of(rank, "prev")
        in_step = (mine["rank"] == rank) & (mine["step"] == step)
        counterpart = (theirs["peer"] == rank) & (theirs["step"] == step)
        need = int(((theirs["rank"] == nxt) & counterpart).sum()) - int((in_step & (mine["peer"] == nxt)).sum())
        if not 0 <= need <= len(rows):
            continue
        choices = list(combinations(rows, need))
        if len(choices) > max_choices:
            continue
        # only this rank's ops of the step and the step's counterparts take part in a trial
        mine_step, theirs_step = mine[in_step], theirs[theirs["step"] == step]
        best, best_bad = None, None
        for chosen in choices:
            trial = mine_step.copy()
            trial.loc[list(rows), "peer"] = prv
            trial.loc[list(chosen), "peer"] = nxt
            bad = sum(_acausal(trial, theirs_step, rank, peer, step, side) for peer in {nxt, prv})
            if best_bad is None or bad < best_bad:
                best, best_bad = chosen, bad
        if best is None or best_bad:
            continue
        mine.loc[list(rows), "peer"] = prv
        mine.loc[list(best), "peer"] = nxt
        settled += len(rows)
    return settled


def _acausal(mine: pd.DataFrame, theirs: pd.DataFrame, rank: int, peer: int, step: int, side: int) -> int:
    """Pairs of link rank<->peer in ``step`` (k-th with k-th, in posting order) whose
    receive returned before its send was posted."""
    a = mine[(mine["rank"] == rank) & (mine["peer"] == peer) & (mine["step"] == step)].sort_values("start_ns")
    b = theirs[(theirs["rank"] == peer) & (theirs["peer"] == rank) & (theirs["step"] == step)].sort_values("start_ns")
    n = min(len(a), len(b))
    if side == 0:
        post, done = a["start_ns"].to_numpy()[:n], b["done_ns"].to_numpy()[:n]
    else:
        post, done = b["start_ns"].to_numpy()[:n], a["done_ns"].to_numpy()[:n]
    return int((done < post).sum()) + abs(len(a) - len(b))


def _one_of_two(side: int, last_rank: bool) -> str | None:
    """Which way the one op of a send-both-ways call goes (Megatron's interleaved steady
    state passes None for a tensor with nowhere to go). A middle rank's lone send is an
    activation (next rank): its backwards always have a gradient to send; rank 0's backward
    of stage 0 sends nothing, so its lone send is an activation too. A lone receive off the
    last rank is a gradient (next rank): once the forwards are done no activation comes. On
    the last rank either can be missing (its last stage neither sends activations nor
    receives gradients): None, settled by counts (``side``: 0 send, 1 receive)."""
    if last_rank:
        return None
    return "next"


def _resolve_peers(
    sends: pd.DataFrame,
    recvs: pd.DataFrame,
    actions: pd.DataFrame,
    groups: dict[int, list[ProcessGroup]],
    order: list[int] | None,
) -> Resolved:
    """The peers under which the most calls find a partner (module doc of
    :mod:`tracekit.reconstruct.peers`): the metadata as the job's ranks, as ranks of the
    callers' process groups, or the pipeline's shape alone (``order``: the ranks in pipeline
    order, :func:`_pipeline_order`)."""
    named = bool((sends["peer"] >= 0).any() or (recvs["peer"] >= 0).any())
    if not named or actions.empty:
        return Resolved(sends, recvs, "metadata")
    total = len(sends) + len(recvs)
    best = Resolved(sends, recvs, "metadata")
    best_score = matched_sides(sends, recvs)
    if best_score < total and groups:
        ranks = set(actions["rank"].tolist()) | set(sends["rank"].tolist()) | set(recvs["rank"].tolist())
        grouped = Resolved(through_groups(sends, groups, ranks), through_groups(recvs, groups, ranks), "group ranks")
        score = matched_sides(grouped.sends, grouped.recvs)
        if score > best_score:
            best, best_score = grouped, score
    if best_score < total:
        shaped_s, shaped_r = _infer_peers(sends.assign(peer=-1), recvs.assign(peer=-1), actions, order)
        if matched_sides(shaped_s, shaped_r) > best_score:
            example = contradiction(best.sends, best.recvs, shaped_s, shaped_r)
            return Resolved(
                shaped_s,
                shaped_r,
                "pipeline shape",
                f"the P2P metadata contradicts the trace ({example}; under it {best_score} of {total} calls "
                "find a partner): its peers are ignored and read from the pipeline's shape instead (some "
                "torch versions write the two-rank P2P communicator's ranks, pytorch#153819)",
            )
    # a call to its own rank is no message: its peer is unknown (inferred below if it can be)
    for sides in (best.sends, best.recvs):
        own = (sides["peer"] == sides["rank"]).to_numpy()
        if own.any():
            sides.loc[own, "peer"] = -1
    return best


def _pipeline_order(groups: dict[int, list[ProcessGroup]], actions: pd.DataFrame) -> list[int] | None:
    """The job's ranks in pipeline order, where a pipeline process group holds every rank of
    the run's actions (its group ranks are the stages' order); None where none does."""
    ranks = set(actions["rank"].tolist())
    for group in (g for listed in groups.values() for g in listed):
        if group.is_pipeline and set(group.ranks) == ranks:
            return list(group.ranks)
    return None


def _infer_peers(
    sends: pd.DataFrame, recvs: pd.DataFrame, actions: pd.DataFrame, order: list[int] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fill unknown peers from the pipeline's shape: a send after a forward of stage s goes
    to stage s+1's rank, after a backward to stage s-1's; a receive feeding a forward comes
    from stage s-1, one feeding a backward from stage s+1. ``order``: the ranks in pipeline
    order (a pipeline process group's), where stages are still numbered by rank."""
    stage_is_rank_numbering = bool((actions["stage"] == actions["rank"]).all())
    if order is not None and stage_is_rank_numbering:
        position = {rank: i for i, rank in enumerate(order)}
        actions = actions.assign(stage=actions["rank"].map(position))
    stage_rank = cast(dict[int, int], actions.groupby("stage")["rank"].first().to_dict())
    by_rank: dict[Any, pd.DataFrame] = {r: g.sort_values("start_ns") for r, g in actions.groupby("rank")}
    first, last = (min(stage_rank), max(stage_rank)) if stage_rank else (0, 0)

    def neighbour(action: pd.Series[Any], towards_output: bool) -> int:
        step = 1 if towards_output else -1
        stage = int(action["stage"]) + step
        if stage_is_rank_numbering and stage not in stage_rank:
            # Past either end of a pipeline read by rank, a message still has a peer: the last
            # rank's forward output goes back to the first rank (a virtual pipeline's next
            # chunk), and the first rank's gradient to the last. A one-chunk pipeline never
            # sends there, so such a send or receive is the wrap.
            stage = first if towards_output else last
        peer = stage_rank.get(stage, -1)
        return -1 if peer == action["rank"] else int(peer)

    sends, recvs = sends.copy(), recvs.copy()
    for idx in sends.index[sends["peer"] < 0]:
        rank_actions = by_rank.get(sends.at[idx, "rank"])
        if rank_actions is None:
            continue
        before = rank_actions[rank_actions["end_ns"] <= cast(int, sends.at[idx, "start_ns"]) + _TOLERANCE_NS]
        if len(before):
            producer = before.iloc[-1]
            sends.at[idx, "peer"] = neighbour(producer, producer["kind"] == "F")
    for idx in recvs.index[recvs["peer"] < 0]:
        rank_actions = by_rank.get(recvs.at[idx, "rank"])
        if rank_actions is None:
            continue
        after = rank_actions[rank_actions["start_ns"] >= cast(int, recvs.at[idx, "done_ns"]) - _TOLERANCE_NS]
        if len(after):
            consumer = after.iloc[0]
            recvs.at[idx, "peer"] = neighbour(consumer, consumer["kind"] != "F")
    return sends, recvs


def _link_actions(messages: pd.DataFrame, actions: pd.DataFrame, consumer_by_kind: bool) -> None:
    """Fill producer/consumer action ids and direction: the producer is the last action on
    the sender that ended before the send was posted (its kind gives the direction), the
    consumer the first action on the receiver once the data was there. With
    ``consumer_by_kind`` (segmented runs) both are of the kind the message's way needs.
    "Last" and "first" are in the order of start of the rank's actions in the step."""
    n = len(messages)
    producer = np.full(n, -1, dtype=np.int64)
    consumer = np.full(n, -1, dtype=np.int64)
    direction = np.array(["?"] * n, dtype=object)
    src, dst, step = (messages[c].to_numpy(np.int64) for c in ("src_rank", "dst_rank", "step"))
    dst_step = messages["dst_step"].to_numpy(np.int64) if "dst_step" in messages else step
    posted, done = messages["send_post_ns"].to_numpy(), messages["recv_done_ns"].to_numpy()
    order = _by_rank_step(actions)
    a_rank, a_step = actions["rank"].to_numpy(np.int64)[order], actions["step"].to_numpy(np.int64)[order]
    group, src_group, dst_group = pair_codes(a_rank, a_step, (src, step), (dst, dst_step))
    starts, ends = actions["start_ns"].to_numpy()[order], actions["end_ns"].to_numpy()[order]
    ids, kinds = actions["action_id"].to_numpy()[order], actions["kind"].to_numpy()[order]
    forward, backward = kinds == "F", (kinds == "B") | (kinds == "I")
    # Which actions a message's producer may be: 0 any, 1 forwards, 2 backwards (B or I).
    members = (np.ones(len(order), dtype=bool), forward, backward)
    last_rank = int(actions["rank"].max()) if len(actions) else -1
    wanted = _ways_by_rank(src, dst, last_rank) if consumer_by_kind else np.zeros(n, dtype=np.int64)
    for kind, member in enumerate(members):
        asked, pool = np.flatnonzero(wanted == kind), np.flatnonzero(member)
        if not len(asked):
            continue
        # The last action that ended by then is the last whose minimum end from there on is
        # by then: that minimum never falls along a rank's step, so one search finds it.
        ended = SortedGroups(group[pool], _suffix_min(group[pool], ends[pool]))
        found = ended.last_at_most(src_group[asked], posted[asked] + _TOLERANCE_NS)
        hit = found >= 0
        k = pool[found[hit]]
        producer[asked[hit]] = ids[k]
        direction[asked[hit]] = np.where(forward[k], "fwd", "bwd")
    # An activation feeds a forward, a gradient a backward (B or I), whatever runs first on
    # the receiver (a schedule may receive ahead of its next use).
    wanted[:] = 0
    if consumer_by_kind:
        wanted[direction == "fwd"] = 1
        wanted[direction == "bwd"] = 2
    for kind, member in enumerate(members):
        asked, pool = np.flatnonzero(wanted == kind), np.flatnonzero(member)
        if not len(asked):
            continue
        found = SortedGroups(group[pool], starts[pool]).first_at_least(dst_group[asked], done[asked] - _TOLERANCE_NS)
        hit = found >= 0
        consumer[asked[hit]] = ids[pool[found[hit]]]
    messages["producer_action"] = producer
    messages["consumer_action"] = consumer
    messages["direction"] = direction


def _link_by_labels(messages: pd.DataFrame, actions: pd.DataFrame) -> None:
    """Where a side's framework range names the action whose data it carries
    (``PP:4SEND_F4``, ``PP:3RECV_B0``), that action is the producer or consumer, whatever
    ran last or next: a fused ``OVERLAP_F_B`` range sends its forward's activation after its
    backward part has run, which program order would take as the producer (in place)."""
    if "src_label_way" not in messages or not len(actions):
        return
    producer = messages["producer_action"].to_numpy(np.int64).copy()
    consumer = messages["consumer_action"].to_numpy(np.int64).copy()
    direction = messages["direction"].to_numpy(object).copy()
    grouped = {1: ("F",), 2: ("B", "I")}  # a gradient is the full backward's or the input-grad's
    index: dict[tuple[int, int, int, int, int], int] = {}
    columns = (actions[c].to_numpy() for c in ("rank", "step", "stage", "kind", "microbatch", "action_id"))
    for rank, step, stage, kind, mb, action in zip(*columns):
        for label_way, kinds in grouped.items():
            if kind in kinds:
                index.setdefault((int(rank), int(step), int(stage), label_way, int(mb)), int(action))
    dst_step = messages["dst_step"] if "dst_step" in messages else messages["step"]
    for end, rank, step, out in (
        ("src", messages["src_rank"], messages["step"], producer),
        ("dst", messages["dst_rank"], dst_step, consumer),
    ):
        way = messages[f"{end}_label_way"].to_numpy(np.int64)
        stage = messages[f"{end}_label_stage"].to_numpy(np.int64)
        mb = messages[f"{end}_label_mb"].to_numpy(np.int64)
        for i in np.flatnonzero(way > 0).tolist():
            found = index.get(
                (int(cast(int, rank.iat[i])), int(cast(int, step.iat[i])), int(stage[i]), int(way[i]), int(mb[i]))
            )
            if found is not None:
                out[i] = found
                direction[i] = "fwd" if way[i] == 1 else "bwd"
    messages["producer_action"] = producer
    messages["consumer_action"] = consumer
    messages["direction"] = direction


def _by_rank_step(actions: pd.DataFrame) -> np.ndarray:
    """The actions' positions by rank, step and start: each (rank, step) in the order a sort
    of that group's rows by start gives (pandas sorts one column with numpy's unstable
    quicksort, so actions starting together keep the order it gives them)."""
    rank, step = actions["rank"].to_numpy(np.int64), actions["step"].to_numpy(np.int64)
    start = actions["start_ns"].to_numpy()
    order = np.lexsort((start, step, rank))
    rank, step, start_sorted = rank[order], step[order], start[order]
    same_group = (rank[1:] == rank[:-1]) & (step[1:] == step[:-1])
    bounds = np.flatnonzero(np.concatenate(([True], ~same_group, [True])))
    tied = np.flatnonzero(same_group & (start_sorted[1:] == start_sorted[:-1]))
    for g in np.unique(np.searchsorted(bounds, tied, side="right") - 1).tolist():
        lo, hi = bounds[g], bounds[g + 1]
        rows = np.sort(order[lo:hi])  # the group's rows in table order, as groupby gives them
        order[lo:hi] = rows[np.argsort(start[rows], kind="quicksort")]
    return order


def _ways_by_rank(src: np.ndarray, dst: np.ndarray, last_rank: int) -> np.ndarray:
    """Which way each message of a segmented run goes, where the ranks alone say it: 1 to
    the next rank (or from the last back to the first, a virtual pipeline's wrap)
    activations, 2 to the previous one gradients. 0 where they do not (two ranks: 1 -> 0 is
    either; ranks of a pipeline that are not consecutive numbers): the producer's kind
    decides then.

    A send an engine holds back (DeepSpeed posts some activations after its next action) is
    still its forward's output, not that of whatever ran last before it was posted."""
    ways = np.zeros(len(src), dtype=np.int64)
    if last_rank < 2:
        return ways
    fwd = (dst == src + 1) | ((src == last_rank) & (dst == 0))
    ways[fwd] = 1
    ways[~fwd & ((dst == src - 1) | ((src == 0) & (dst == last_rank)))] = 2
    return ways


def estimate_arrivals(messages: pd.DataFrame, actions: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """When each message's data was at the receiver (``arrival_ns``), and how long the
    receiver was blocked on it (``recv_wait_ns``).

    A receive's wait returns at max(wait call, data there). The wait is called once the
    receiver has finished its previous compute and posted its comm ops (``wait_start``);
    the message leaves when the sender posts it, or when its producer ends if later.
    If it left after the wait began, the receiver waited for the sender and the data came
    when the wait returned. If it left earlier, the data was ready to go before anyone
    asked for it: the part of the wait that remains is the transfer itself (rendezvous
    transports like gloo move data only once the receive is posted), so the message is
    taken to arrive that long after it left. Both cases are one formula:
    ``arrival = leaves + done - max(wait_start, leaves)``.
    """
    if messages.empty:
        return messages[MESSAGE_COLUMNS]
    messages = messages.copy()
    cpu = events[~events["on_gpu"]]
    done = messages["recv_done_ns"].to_numpy(dtype=np.int64)
    dst = messages["dst_rank"].to_numpy(dtype=np.int64)
    dst_tid = messages["dst_tid"].to_numpy(dtype=np.int64)
    # The latest end by the time the wait returned, of the receiver's actions and of its
    # receiving thread's comm ops (only that thread's own comm ops delay its wait; a sender
    # thread's do not): each set sorted by (rank[, thread], end) once, one search for all.
    comm = cpu[cpu["name"].str.startswith(("c10d::", "record_param_comms"))]
    c_rank, c_tid = comm["rank"].to_numpy(np.int64), comm["tid"].to_numpy(np.int64)
    comm_thread, dst_thread = pair_codes(c_rank, c_tid, (dst, dst_tid))
    ready = messages["recv_post_ns"].to_numpy(dtype=np.int64).copy()
    for group, ends, mine in (
        (actions["rank"].to_numpy(np.int64), actions["end_ns"].to_numpy(np.int64), dst),
        (comm_thread, comm["end_ns"].to_numpy(np.int64), dst_thread),
    ):
        order = np.lexsort((ends, group))
        found = SortedGroups(group[order], ends[order]).last_at_most(mine, done)
        hit = found >= 0
        ready[hit] = np.maximum(ready[hit], ends[order][found[hit]])
    wait_start = np.minimum(ready, done)
    # The producer's end (the send's post where it has none); an id twice is its last row.
    ids = pd.Index(actions["action_id"].to_numpy())
    last = ~ids.duplicated(keep="last")
    at = ids[last].get_indexer(messages["producer_action"].to_numpy())
    send_post = messages["send_post_ns"].to_numpy(dtype=np.int64)
    produced = send_post.copy()
    produced[at >= 0] = actions["end_ns"].to_numpy(np.int64)[last][at[at >= 0]]
    leaves = np.minimum(np.maximum(send_post, produced), done)
    messages["recv_wait_ns"] = done - wait_start
    messages["arrival_ns"] = leaves + done - np.maximum(wait_start, leaves)
    return messages[MESSAGE_COLUMNS]
