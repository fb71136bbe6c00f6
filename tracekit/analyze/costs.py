"""What-if's cost model: a measured run's costs as samples, and changes to its links.

The measured run gives a cost model, in samples rather than averages (a pipeline's step is a
max over many paths, so the spread of the costs matters, not just their typical value):

- **compute**: for each rank and kind (F, B, I, W), one microbatch's compute on that rank,
  i.e. each measured action's duration times the measured v (a rank's layers split evenly
  over its chunks). Each pool also has a **fixed share** (see :func:`op_fixed_ns`): the part
  of its compute outside the work ops (the small ops and the gaps between ops), which does
  not shrink with a smaller microbatch (``--keep global-batch``). Where the run split its
  backwards, B is drawn as I + W less the fixed part that I and W both paid (each walks the
  layers' autograd graph; a whole backward walks it once). The zero-bubble targets' I and W
  (ZB-H1, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV): as measured where the run split
  its backwards, else each half of a measured B's work ops plus all of its fixed part (an
  assumption, said in the output; on the project's samples a split backward costs ~5% more
  than a whole one, and halves of B missed that); stage 0 on its own either way, since torch
  leaves its I empty and runs the whole backward in W (see ``_split_costs``).
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

:func:`parse_link_latency` and :func:`with_links` change every message latency (``--link-latency``,
``--overlap-p2p``). The predictions that draw from the model are :mod:`tracekit.analyze.whatif`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.replay import StepGraph, step_graphs
from tracekit.errors import TracekitError
from tracekit.model.groups import SortedGroups, pair_codes
from tracekit.model.run import FIXED_COLUMN, Run

# A message pool: (src rank, dst rank), or (src, dst, "fused") for messages into the second
# half of a fused label (see _fused)
LinkKey = tuple[int, int] | tuple[int, int, str]


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
    # (rank, kind) -> the share of that pool's compute that is fixed per op rather than per
    # row (see op_fixed_ns): it does not shrink when --keep global-batch shrinks a microbatch
    fixed_share: dict[tuple[int, str], float] = field(default_factory=dict)

    def m_scaled(self, key: tuple[int, str], scale: float) -> float:
        """What a draw from ``key``'s pool is multiplied by when a microbatch's rows are
        scaled by ``scale``: its per-row part scales, its fixed part stays."""
        share = self.fixed_share.get(key, 0.0)
        return share + (1.0 - share) * scale

    def all_overhead(self) -> np.ndarray:
        return np.concatenate([*self.overhead.values(), *self.fused_overhead.values()])


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
            f"{run.source}: incomplete run: {run.completeness.gaps_text()}; what-if "
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
    labels = run.actions.set_index("action_id")[["label", "label_start_ns"]]
    fused_of_graph = [_fused(labels, g) for g in graphs]
    held = held_back_ns(run)
    # Every step's actions and message edges at once, in step and then table order: each
    # pool's samples in the order a walk over the steps appends them, its keys in the order
    # it meets them.
    rank, stage, dur, ovh = (_joined(graphs, a) for a in ("rank", "stage", "dur", "ovh"))
    kinds = np.concatenate([np.asarray(g.kind, dtype=object) for g in graphs]) if graphs else np.zeros(0, dtype=object)
    fused = np.concatenate(fused_of_graph).astype(bool) if graphs else np.zeros(0, dtype=bool)
    per_kind = _pools([rank, kinds], dur * sched.v)
    fixed_of = op_fixed_ns(run)
    ids = _joined(graphs, "action_id")
    fixed = np.minimum(fixed_of.reindex(ids).fillna(0).to_numpy(dtype=np.int64), dur)
    fixed_kind = _pools([rank, kinds], fixed * sched.v)
    overhead = {r: v for (r,), v in _pools([rank[~fused]], ovh[~fused]).items()}
    fused_overhead = {r: v for (r,), v in _pools([rank[fused]], ovh[fused]).items()}
    per_stage = _pools([stage, kinds], dur)
    later = np.isin(kinds, ("I", "W")) & (stage > 0)  # I and W of stages past the first
    later_iw = {key: v.tolist() for key, v in _pools([rank[later], kinds[later]], dur[later] * sched.v).items()}
    src, dst = _joined(graphs, "edge_src", shift=True), _joined(graphs, "edge_dst", shift=True)
    lat, xfer, msg = (_joined(graphs, a) for a in ("edge_lat", "edge_xfer", "edge_msg"))
    sent = msg >= 0
    src, dst, lat, xfer, msg = src[sent], dst[sent], lat[sent], xfer[sent], msg[sent]
    held_ns = np.zeros(len(msg), dtype=np.int64)
    if held:
        at = pd.Index(list(held)).get_indexer(pd.Index(msg))
        held_ns[at >= 0] = np.array(list(held.values()), dtype=np.int64)[at[at >= 0]]
    # into the second half of a fused label: its own pool (see _fused)
    link = [rank[src], rank[dst], fused[dst]]
    latency = {_link_key(key): v for key, v in _pools(link, np.maximum(0, lat - held_ns)).items()}
    transfer = {_link_key(key): v for key, v in _pools(link, xfer).items()}
    # Generated orders place stages on the first replica's ranks (the others repeat it).
    ranks = sorted(sched.pipelines[0]) if sched.pipelines else sorted(set(overhead) | set(fused_overhead))
    for r in ranks:  # a rank whose every action continues a fused label: use those
        if r not in overhead and r in fused_overhead:
            overhead[r] = fused_overhead[r].copy()
    work: dict[tuple[int, str], np.ndarray] = {}
    rng = np.random.default_rng(0)
    for (r, k), samples in per_kind.items():
        work[(r, k)] = samples
    share = {key: _share(fixed_kind[key], samples) for key, samples in per_kind.items()}
    for r in ranks:
        if (r, "B") not in work and (r, "I") in work and (r, "W") in work:
            # I and W paired at random; each walked its layers' autograd graph and paid the
            # walk's fixed part (see _split_costs): a whole backward pays it once, the mean
            # of the pair's two
            i_s, w_s = work[(r, "I")], work[(r, "W")]
            n = max(len(i_s), len(w_s))
            i_at, w_at = rng.integers(0, len(i_s), n), rng.integers(0, len(w_s), n)
            paid = fixed_kind[(r, "I")][i_at] + fixed_kind[(r, "W")][w_at]
            once = paid // 2
            work[(r, "B")] = i_s[i_at] + w_s[w_at] - once
            share[(r, "B")] = _share(paid - once, work[(r, "B")])
        for kind, name in (("F", "forward"), ("B", "backward")):
            if (r, kind) not in work:
                raise TracekitError(f"{run.source}: rank {r} has no {name} actions; what-if needs both on every rank")
    stage_work = {k: np.array(v, dtype=np.int64) for k, v in per_stage.items()}
    split = any(k in ("I", "W") for _, k in per_kind)
    iw_source = _split_costs(work, later_iw, stage_work, ranks, sched.v, split, share)
    all_latency = _all_of(latency)
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
        latency=latency,
        all_latency=all_latency,
        held_back=len(held),
        graphs=graphs,
        transfer={k: v for k, v in transfer.items() if v.any()},
        all_transfer=_all_of(transfer),
        n_actions=sum(len(g.action_id) for g in graphs),
        n_messages=int(sum((g.edge_msg >= 0).sum() for g in graphs)),
        split_backward=split,
        iw_source=iw_source,
        fixed_share=share,
    )


def _share(fixed: np.ndarray, samples: np.ndarray) -> float:
    """The fixed part's share of a pool's compute (0 where the pool computes nothing)."""
    total = float(np.sum(samples))
    return min(1.0, float(np.sum(fixed)) / total) if total > 0 else 0.0


def op_fixed_ns(run: Run) -> pd.Series:
    """action_id -> ns of the action's span that is fixed per op rather than per row (the
    action column ``fixed_ns``: :mod:`tracekit.reconstruct.fixed_part`). 0 for every action
    of a device trace (its compute is its kernels' busy time) and where the column is absent
    (actions made by hand): all of such an action scales with the rows."""
    acts = run.actions
    ids = acts["action_id"].to_numpy(dtype=np.int64)
    if "busy_ns" in acts or FIXED_COLUMN not in acts:
        return pd.Series(0, index=ids, dtype=np.int64)
    return pd.Series(acts[FIXED_COLUMN].fillna(0).to_numpy(dtype=np.int64), index=ids)


def _joined(graphs: list[StepGraph], attr: str, shift: bool = False) -> np.ndarray:
    """One int64 array of a per-action (or per-edge) array of every graph, in order;
    ``shift``: action positions, moved to the joined actions."""
    parts, offset = [], 0
    for g in graphs:
        parts.append(np.asarray(getattr(g, attr), dtype=np.int64) + (offset if shift else 0))
        offset += len(g.rank)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _pools(columns: list[np.ndarray], values: np.ndarray) -> dict[tuple[Any, ...], np.ndarray]:
    """``values`` pooled by key (a column per key part): the keys in the order first met, each
    pool's values in order, as appending each row's value to its key's list would."""
    if not len(values):
        return {}
    codes = np.zeros(len(values), dtype=np.int64)
    for column in columns:  # one int per distinct key: the parts' codes in mixed radix
        part, distinct = pd.factorize(np.asarray(column), sort=False)
        codes = codes * len(distinct) + part
    codes = pd.factorize(codes, sort=False)[0]  # numbered in the order first met
    first = np.unique(codes, return_index=True)[1]
    keys = list(zip(*(np.asarray(c)[first].tolist() for c in columns)))
    order = np.argsort(codes, kind="stable")
    pools = np.split(np.asarray(values, dtype=np.int64)[order], np.cumsum(np.bincount(codes))[:-1])
    return dict(zip(keys, pools))


def _all_of(pools: dict[LinkKey, np.ndarray]) -> np.ndarray:
    """The samples of every plain link's pool (not the fused ones), in pool order; [0] if none."""
    plain = [v for k, v in pools.items() if len(k) == 2]
    return np.concatenate(plain) if plain and sum(map(len, plain)) else np.zeros(1, dtype=np.int64)


def _link_key(key: tuple[Any, ...]) -> LinkKey:
    """(src rank, dst rank), with "fused" where the message feeds a fused label's second half."""
    src, dst, fused = key
    return (int(src), int(dst), "fused") if fused else (int(src), int(dst))


def _split_costs(
    work: dict[tuple[int, str], np.ndarray],
    later_iw: dict[tuple[int, str], list[int]],
    stage_work: dict[tuple[int, str], np.ndarray],
    ranks: list[int],
    v: int,
    split: bool,
    share: dict[tuple[int, str], float],
) -> str:
    """Fill ``work`` with the input-grad (I) and weight-grad (W) pools the zero-bubble targets
    draw from, and say where they came from.

    torch splits the first stage's backward unlike the others: the model's input needs no
    gradient, so stage 0's I computes nothing and its W is the whole backward (seen in every
    split sample: I ~0.05 ms, W ~ B). So stage 0 has pools of its own, (first rank, "I0"/"W0"),
    and (rank, "I"/"W") hold the other stages' samples. Measured where the run split its
    backwards; otherwise each estimated from a measured B: half of its work ops each, plus the
    whole of its fixed part (``share``: see op_fixed_ns) each, since I and W each walk the
    layers' autograd graph (on the project's samples I + W of a chunk is 14.3 ms against
    13.6 ms for its whole backward, whose fixed part is 0.9 ms); stage 0's I as 0 and its W
    as B. ``share`` gains the estimated pools' fixed shares."""
    first = ranks[0]
    if split and (0, "I") in stage_work and (0, "W") in stage_work:
        work[(first, "I0")] = stage_work[(0, "I")] * v
        work[(first, "W0")] = stage_work[(0, "W")] * v
    else:
        work[(first, "I0")] = np.zeros(1, dtype=np.int64)
        work[(first, "W0")] = work[(first, "B")]
    share[(first, "I0")] = 0.0
    share[(first, "W0")] = share.get((first, "W") if split else (first, "B"), 0.0)
    estimated = []
    for r in ranks:
        for kind in ("I", "W"):
            if split and (r, kind) in later_iw:
                work[(r, kind)] = np.array(later_iw[(r, kind)], dtype=np.int64)
            else:  # not measured past stage 0 on this rank (or at all): from a backward
                b_share = share.get((r, "B"), 0.0)
                work[(r, kind)] = np.rint(work[(r, "B")] * (1.0 + b_share) / 2).astype(np.int64)
                share[(r, kind)] = 2 * b_share / (1.0 + b_share)
                estimated.append(r)
    if not split:
        return (
            "I and W not measured (this run's backwards are whole): each half of B's work ops plus all of "
            "its fixed part (its small ops and the gaps between them: each of I and W walks the layers' "
            "autograd graph), except stage 0's, whose I torch leaves empty: I = 0, W = B there"
        )
    if estimated:
        missing = ", ".join(str(r) for r in sorted(set(estimated)))
        return (
            f"I and W as measured; rank {missing} split no stage past the first: half of B's work ops "
            "plus all of its fixed part each there"
        )
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
    send_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["src_file_id"], msgs["src_source_index"]]))
    recv_tid = tid.reindex(pd.MultiIndex.from_arrays([msgs["dst_file_id"], msgs["dst_source_index"]]))
    # The producer's end, in int ns (-1 in ``at``: no such action, never held back).
    at = pd.Index(run.actions["action_id"]).get_indexer(msgs["producer_action"])
    produced = run.actions["end_ns"].to_numpy(dtype=np.int64)[np.maximum(at, 0)]
    post = msgs["send_post_ns"].to_numpy(dtype=np.int64)
    # Threads as codes, the same thread the same code on both sides; an unknown one never
    # matches. Every message's sender thread searched among the receives' completions at once.
    threads, _ = pd.factorize(pd.concat([send_tid, recv_tid], ignore_index=True), use_na_sentinel=True)
    send_thread, recv_thread = threads[: len(msgs)], threads[len(msgs) :]
    mine = recv_thread >= 0
    done_thread, sender = pair_codes(
        msgs["dst_rank"].to_numpy(dtype=np.int64)[mine],
        recv_thread[mine],
        (msgs["src_rank"].to_numpy(np.int64), send_thread),
    )
    times = msgs["recv_done_ns"].to_numpy(dtype=np.int64)[mine]
    order = np.lexsort((times, done_thread))
    completions = SortedGroups(done_thread[order], times[order])
    rows = np.flatnonzero((send_thread >= 0) & (at >= 0) & (post > produced))
    end = produced[rows]
    between = completions.position(sender[rows], post[rows], "right") > completions.position(sender[rows], end, "right")
    rows, end = rows[between], end[between]
    return dict(zip(msgs["msg_id"].to_numpy(dtype=np.int64)[rows].tolist(), (post[rows] - end).tolist()))


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


# The kinds whose samples hold a backward's recomputation (the input-grad half of a split one).
_RECOMPUTING_KINDS = ("B", "I", "I0")


def without_recompute(model: CostModel, per_backward: dict[int, int], stage_ranks: dict[int, list[int]]) -> CostModel:
    """The cost model with each rank's backwards (or input-grad halves) short of the
    recomputation they ran (``per_backward``: rank -> mean ns in one of its backwards;
    ``stage_ranks``: the ranks of each stage, whose mean a stage's samples lose)."""

    def less(samples: np.ndarray, ns: int) -> np.ndarray:
        shorter: np.ndarray = np.maximum(samples - ns, 0)
        return shorter

    work = {
        key: less(x, per_backward.get(key[0], 0)) if key[1] in _RECOMPUTING_KINDS else x
        for key, x in model.work.items()
    }
    stage_work = {}
    for key, x in model.stage_work.items():
        ranks = stage_ranks.get(key[0], [])
        ns = int(np.mean([per_backward.get(r, 0) for r in ranks])) if ranks else 0
        stage_work[key] = less(x, ns) if key[1] in _RECOMPUTING_KINDS else x
    return replace(model, work=work, stage_work=stage_work)
