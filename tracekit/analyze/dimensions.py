"""Figures per parallel dimension around the pipeline: tensor-parallel collectives inside the
actions, data-parallel gradient collectives beside them, and busy with and without the former.

- **TP**: collectives an action launched and waits for (Megatron's
  megatron/core/tensor_parallel/mappings.py all-reduces inside every forward and backward).
  They are the action's work, so busy counts them; ``tp_ns`` is their time and ``tp_alone_ns``
  the part of it no compute ran beside (what busy loses when counted as compute only).
- **DP**: gradient collectives (all-reduce or reduce-scatter of the gradients), launched after
  the backward or from its hooks (torch DDP, Megatron's ``overlap_grad_reduce``), on their own
  stream; no action waits for them. ``dp_ns`` is their time, ``dp_exposed_ns`` the part after
  the rank's pipeline window (what the step waits for at its end), the rest overlapped the
  pipeline's drain; ``dp_after_own_ns`` the part after the rank's own last action (what it
  waits for before its optimizer, a fast replica's wait for a slow one included).

On the device the kernels say it (``DeviceSummary`` table ``collectives``: which are gradient
collectives is decided there, see :mod:`tracekit.model.device`). On a host-only run (gloo on
CPU) the host ops of collectives do (:func:`tracekit.reconstruct.layout.collective_ops`), each
from its post to its completion (:func:`_host_collectives`). Collectives that are neither
tensor-parallel nor, in a job with data-parallel replicas, gradient collectives (a lone
pipeline's loss all-reduce) are no dimension's.

Recomputation (:mod:`tracekit.reconstruct.recompute`): per rank and step, on the device the
kernels a recomputation launched, on the host its spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.analyze.shares import share
from tracekit.analyze.grouping import ranks_by_stage
from tracekit.model.groups import group_ids, holding, pair_codes
from tracekit.model.intervals import covered_lengths, merge_intervals, union_lengths
from tracekit.model.names import GLOO_COLLECTIVE, TP_REGION
from tracekit.model.run import Run
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.layout import collective_ops, collectives_inside_actions
from tracekit.reconstruct.recompute import recompute_spans
from tracekit.reconstruct.steps import step_of

if TYPE_CHECKING:
    from tracekit.schemas.analysis import (
        DimensionRankDoc,
        DimensionsDoc,
        DimensionStageDoc,
        SharedLinkDoc,
        SharedLinksDoc,
    )

DIMENSION_COLUMNS = [
    "rank",
    "step",
    "tp_ns",
    "tp_alone_ns",
    "dp_ns",
    "dp_exposed_ns",
    "dp_after_own_ns",
    "recompute_ns",
]


@dataclass(frozen=True)
class LinkTransfers:
    """One link's (src rank -> dst rank) transfers with and without a TP collective running
    on either end, and the median of each (0 where there are none)."""

    src_rank: int
    dst_rank: int
    n_overlapped: int
    n_alone: int
    median_overlapped_ns: int
    median_alone_ns: int

    @property
    def slowdown(self) -> float:
        """As :attr:`SharedLinks.slowdown`, on this link alone (1.0 where a side has none)."""
        if not self.n_overlapped or not self.n_alone or self.median_alone_ns <= 0:
            return 1.0
        return self.median_overlapped_ns / self.median_alone_ns

    def to_dict(self) -> SharedLinkDoc:
        return {
            "src_rank": self.src_rank,
            "dst_rank": self.dst_rank,
            "n_transfers_overlapped": self.n_overlapped,
            "n_transfers_alone": self.n_alone,
            "median_transfer_overlapped_ns": self.median_overlapped_ns,
            "median_transfer_alone_ns": self.median_alone_ns,
            "slowdown": round(self.slowdown, 4),
        }


@dataclass(frozen=True)
class SharedLinks:
    """TP collectives and PP transfers of the same ranks at the same time (GPU runs): how long
    a rank's TP collective kernels and its P2P kernels overlapped, and the pipeline's
    transfers with and without a TP collective running on either end (the seeds' concern:
    TP all-reduce and virtual-pipeline P2P contending for one network)."""

    overlap_ns: dict[int, int]  # per rank
    n_overlapped: int  # P2P transfers during which a TP collective ran on either end
    n_alone: int
    median_overlapped_ns: int
    median_alone_ns: int
    # per link, most transfers overlapped first (by src, dst rank where tied)
    links: tuple[LinkTransfers, ...] = ()

    @property
    def slowdown(self) -> float:
        """Median transfer while a TP collective ran over the median without one (1.0: none)."""
        if not self.n_overlapped or not self.n_alone or self.median_alone_ns <= 0:
            return 1.0
        return self.median_overlapped_ns / self.median_alone_ns

    def to_dict(self) -> SharedLinksDoc:
        return {
            "overlap_ns": {str(r): v for r, v in sorted(self.overlap_ns.items())},
            "n_transfers_overlapped": self.n_overlapped,
            "n_transfers_alone": self.n_alone,
            "median_transfer_overlapped_ns": self.median_overlapped_ns,
            "median_transfer_alone_ns": self.median_alone_ns,
            "slowdown": round(self.slowdown, 4),
            "links": [link.to_dict() for link in self.links],
        }


@dataclass
class DimensionFigures:
    """Per rank and step (``per_step``: DIMENSION_COLUMNS), from ``source`` ("kernels" or
    "host ops")."""

    per_step: pd.DataFrame
    source: str
    stage_ranks: dict[int, list[int]] = field(default_factory=dict)  # stage -> the ranks that run it
    shared_links: SharedLinks | None = None  # GPU runs with TP collectives and P2P kernels

    def per_rank(self, bubbles: pd.DataFrame) -> pd.DataFrame:
        """Summed over steps, with each rank's busy, idle and window, busy counted as compute
        only and both bubble ratios."""
        sums = self.per_step.groupby("rank")[DIMENSION_COLUMNS[2:]].sum()
        measured = bubbles.groupby("rank")[["window_ns", "busy_ns", "idle_ns"]].sum()
        out = measured.join(sums, how="left").fillna(0).astype(np.int64)
        out["busy_compute_only_ns"] = out["busy_ns"] - out["tp_alone_ns"]
        return out

    def to_dict(self, bubbles: pd.DataFrame) -> DimensionsDoc:
        per_rank = self.per_rank(bubbles)
        rows: list[DimensionRankDoc] = []
        for rank, r in zip(per_rank.index.tolist(), per_rank.to_dict("records")):
            window = max(int(r["window_ns"]), 1)
            rows.append(
                {
                    "rank": int(rank),
                    "tp_ns": int(r["tp_ns"]),
                    "tp_share_of_busy": round(share(int(r["tp_ns"]), max(int(r["busy_ns"]), 1), "TP share"), 6),
                    "dp_ns": int(r["dp_ns"]),
                    "dp_exposed_ns": int(r["dp_exposed_ns"]),
                    "dp_overlapped_ns": int(r["dp_ns"] - r["dp_exposed_ns"]),
                    "dp_after_own_ns": int(r["dp_after_own_ns"]),
                    "busy_ns": int(r["busy_ns"]),
                    "busy_compute_only_ns": int(r["busy_compute_only_ns"]),
                    "bubble_ratio": round(int(r["idle_ns"]) / window, 6),
                    "bubble_ratio_compute_only": round((window - int(r["busy_compute_only_ns"])) / window, 6),
                    "recompute_ns": int(r["recompute_ns"]),
                    "recompute_share_of_busy": round(
                        share(int(r["recompute_ns"]), max(int(r["busy_ns"]), 1), "recompute share"), 6
                    ),
                }
            )
        stages: list[DimensionStageDoc] = []
        for stage, ranks in sorted(self.stage_ranks.items()):
            mine = per_rank.loc[[r for r in ranks if r in per_rank.index]]
            busy = max(int(mine["busy_ns"].sum()), 1)
            stages.append(
                {
                    "stage": stage,
                    "ranks": list(ranks),
                    "recompute_ns": int(mine["recompute_ns"].sum()),
                    "recompute_share_of_busy": round(
                        share(int(mine["recompute_ns"].sum()), busy, "recompute share"), 6
                    ),
                }
            )
        total = self.per_step[DIMENSION_COLUMNS[2:]].sum()
        busy, window = int(bubbles["busy_ns"].sum()), max(int(bubbles["window_ns"].sum()), 1)
        only = busy - int(total["tp_alone_ns"])
        cells = max(len(self.per_step), 1)  # rank-steps
        return {
            "source": self.source,
            "tp_ns": int(total["tp_ns"]),
            "tp_share_of_busy": round(share(int(total["tp_ns"]), max(busy, 1), "TP share"), 6),
            "dp_ns": int(total["dp_ns"]),
            "dp_exposed_ns": int(total["dp_exposed_ns"]),
            "recompute_ns": int(total["recompute_ns"]),
            "recompute_share_of_busy": round(share(int(total["recompute_ns"]), max(busy, 1), "recompute share"), 6),
            "per_rank_step_ns": {
                c: int(total[c]) // cells
                for c in ("tp_ns", "dp_ns", "dp_exposed_ns", "dp_after_own_ns", "recompute_ns")
            },
            "stages": stages,
            "shared_links": self.shared_links.to_dict() if self.shared_links is not None else None,
            "bubble_ratio_compute_only": round((window - only) / window, 6),
            "ranks": rows,
        }


def dimension_figures(run: Run, bubbles: pd.DataFrame) -> DimensionFigures | None:
    """The figures of a run with collectives (None where it has none). Each figure is a union
    of time (gradient buckets in flight together count once)."""
    if bubbles.empty:
        return None
    windows = bubbles[["rank", "step", "window_start_ns", "window_end_ns"]].astype(np.int64).reset_index(drop=True)
    on_device = run.timeline == "device"
    if on_device:
        table = run.device_summary.tables["collectives"]
        frame = pd.DataFrame({c: table[c] for c in ("rank", "step", "start_ns", "end_ns", "gradient", "alone_ns")})
        frame["tp"] = frame["gradient"] == 0
        redone = pd.DataFrame(
            {c: run.device_summary.tables["recompute"][c] for c in ("rank", "step", "start_ns", "end_ns")}
        )
        source = "kernels"
    else:
        host = _host_collectives(run)
        frame = host if host is not None else _no_collectives()
        spans = pd.DataFrame(recompute_spans(EventArrays.of(run.events)))
        redone = spans.assign(step=step_of(spans["rank"].to_numpy(), spans["start_ns"].to_numpy(), run.steps))
        redone = redone[["rank", "step", "start_ns", "end_ns"]]
        source = "host ops"
    cell = windows.reset_index().rename(columns={"index": "cell"})
    merged = frame.merge(cell, on=["rank", "step"], how="inner")
    n = len(windows)
    group = merged["cell"].to_numpy(np.int64)
    start, end = merged["start_ns"].to_numpy(np.int64), merged["end_ns"].to_numpy(np.int64)
    tp = merged["tp"].to_numpy(bool)
    # the rest are gradient collectives where the job has data-parallel replicas; a pipeline
    # alone has other collectives outside its actions (DeepSpeed's loss all-reduce and
    # broadcast), which are no dimension's
    dp = ~tp & (run.layout is not None and run.layout.size("dp") > 1)
    everywhere = np.full(n, np.iinfo(np.int64).min), np.full(n, np.iinfo(np.int64).max)
    after = windows["window_end_ns"].to_numpy(np.int64), everywhere[1]
    out = windows[["rank", "step"]].copy()
    out["tp_ns"] = union_lengths(group[tp], start[tp], end[tp], *everywhere)
    alone = np.zeros(n, dtype=np.int64)
    np.add.at(alone, group[tp], merged["alone_ns"].to_numpy(np.int64)[tp])
    out["tp_alone_ns"] = alone
    out["dp_ns"] = union_lengths(group[dp], start[dp], end[dp], *everywhere)
    out["dp_exposed_ns"] = union_lengths(group[dp], start[dp], end[dp], *after)
    # after the rank's own last action: what it waits for before its optimizer (a fast
    # replica's wait for a slow one lies inside the step's window, so not in dp_exposed)
    own = run.actions.groupby(["rank", "step"], as_index=False)["end_ns"].max()
    own_ends = windows.merge(own, on=["rank", "step"], how="left")["end_ns"]
    own_end = own_ends.fillna(windows["window_end_ns"]).to_numpy(np.int64)
    out["dp_after_own_ns"] = union_lengths(group[dp], start[dp], end[dp], own_end, everywhere[1])
    again = redone.merge(cell, on=["rank", "step"], how="inner")
    out["recompute_ns"] = union_lengths(
        again["cell"].to_numpy(np.int64),
        again["start_ns"].to_numpy(np.int64),
        again["end_ns"].to_numpy(np.int64),
        *everywhere,
    )
    if not out[DIMENSION_COLUMNS[2:]].to_numpy().any():
        return None
    links = _shared_links(run, frame[frame["tp"]]) if on_device and bool(frame["tp"].any()) else None
    return DimensionFigures(out[DIMENSION_COLUMNS].reset_index(drop=True), source, ranks_by_stage(run.actions), links)


def _shared_links(run: Run, tp: pd.DataFrame) -> SharedLinks | None:
    """:class:`SharedLinks` from the device tables: TP kernels (``tp``: rank, start_ns,
    end_ns), each rank's P2P kernels and each message's transfer (the last ``transfer_ns`` of
    its receive kernel)."""
    kernels = run.device_summary["p2p_kernels"]
    if not len(kernels["rank"]):
        return None
    overlap: dict[int, int] = {}
    lo_of: dict[int, np.ndarray] = {}
    hi_of: dict[int, np.ndarray] = {}
    tp_rank = tp["rank"].to_numpy(np.int64)
    for rank in np.unique(tp_rank).tolist():
        rows = tp_rank == rank
        lo, hi = merge_intervals(tp["start_ns"].to_numpy(np.int64)[rows], tp["end_ns"].to_numpy(np.int64)[rows])
        lo_of[rank], hi_of[rank] = lo, hi
        mine = kernels["rank"] == rank
        p_lo, p_hi = merge_intervals(kernels["start_ns"][mine], kernels["end_ns"][mine])
        overlap[rank] = int(covered_lengths(p_lo, p_hi, lo, hi).sum())
    pairs = run.device_pairs
    pairs = pairs[(pairs["transfer_ns"] > 0) & (pairs["recv_end_ns"] >= 0)]
    if pairs.empty:
        return SharedLinks(overlap, 0, 0, 0, 0)
    end = pairs["recv_end_ns"].to_numpy(np.int64)
    start = end - pairs["transfer_ns"].to_numpy(np.int64)
    during = np.zeros(len(pairs), dtype=bool)
    for side in ("src_rank", "dst_rank"):
        ranks = pairs[side].to_numpy(np.int64)
        for rank in np.unique(ranks).tolist():
            if rank in lo_of:
                at = ranks == rank
                during[at] |= covered_lengths(start[at], end[at], lo_of[rank], hi_of[rank]) > 0
    transfer = pairs["transfer_ns"].to_numpy(np.int64)
    src, dst = pairs["src_rank"].to_numpy(np.int64), pairs["dst_rank"].to_numpy(np.int64)
    links = []
    for link in np.unique(group_ids(src, dst), return_index=True)[1].tolist():
        mine = (src == src[link]) & (dst == dst[link])
        links.append(
            LinkTransfers(
                int(src[link]),
                int(dst[link]),
                int((mine & during).sum()),
                int((mine & ~during).sum()),
                _median(transfer[mine & during]),
                _median(transfer[mine & ~during]),
            )
        )
    links.sort(key=lambda link: -link.n_overlapped)
    return SharedLinks(
        overlap,
        int(during.sum()),
        int((~during).sum()),
        _median(transfer[during]),
        _median(transfer[~during]),
        tuple(links),
    )


def _median(ns: np.ndarray) -> int:
    """The median of ``ns`` as whole ns (0 for none)."""
    return int(np.median(ns)) if len(ns) else 0


def _no_collectives() -> pd.DataFrame:
    none = np.zeros(0, dtype=np.int64)
    return pd.DataFrame(
        {"rank": none, "step": none, "start_ns": none, "end_ns": none, "tp": none.astype(bool), "alone_ns": none}
    )


def _host_collectives(run: Run) -> pd.DataFrame | None:
    """A host-only run's collectives, each from its post to its completion: gloo's ``c10d``
    op only posts the work, which a worker thread of its process group does under a
    ``gloo:<collective>`` range (ProcessGroupGloo's RECORD_FUNCTION in its work's run): the
    k-th such range of a class does the rank's k-th collective of that class where the counts
    agree. A collective waited on inside Megatron's TP mapping Function (model.names.TP_REGION)
    is done when the Function is. Classes: one started inside an action is tensor-parallel
    where the layout has tensor parallelism (inside a mapping Function, where the rank has
    any), else a gradient collective; a worker thread is the TP group's where its ranges
    start inside mapping Functions."""
    ops = collective_ops(run.events)
    if ops.empty:
        return None
    regions = _regions(run.events)
    region_end, in_region = _region_ends(ops, regions)
    op_rank = ops["rank"].to_numpy(np.int64)
    has_regions = np.isin(op_rank, op_rank[in_region])
    inside = collectives_inside_actions(ops, run.actions).to_numpy()
    tensor = run.layout is not None and run.layout.size("tp") > 1
    tp = inside & tensor & (in_region | ~has_regions)
    done = np.maximum(ops["end_ns"].to_numpy(np.int64), region_end)
    work = _gloo_work(run.events, regions)
    starts = ops["start_ns"].to_numpy(np.int64)
    for rank in np.unique(op_rank).tolist():
        ranges = work[work["rank"] == rank]
        for kind in (True, False):
            rows = np.flatnonzero((op_rank == rank) & (tp == kind))
            ends = ranges.loc[ranges["tp"] == kind, "end_ns"].to_numpy(np.int64)
            if not len(ends) or len(ends) != len(rows):
                continue
            order = rows[np.argsort(starts[rows], kind="stable")]
            done[order] = np.maximum(done[order], ends)
    length = done - starts
    return ops.assign(
        end_ns=done,
        step=step_of(op_rank, starts, run.steps),
        tp=tp,
        alone_ns=np.where(tp, length, 0),  # a host waits for it: no compute beside it
    )


def _regions(events: pd.DataFrame) -> pd.DataFrame:
    """Megatron's TP mapping Functions on the host (rank, tid, start_ns, end_ns)."""
    names = events["name"].astype(str)
    found = events[names.str.match(TP_REGION) & ~events["on_gpu"].astype(bool)]
    return found[["rank", "tid", "start_ns", "end_ns"]].sort_values(["rank", "start_ns"], kind="stable")


def _region_ends(ops: pd.DataFrame, regions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per host collective op, the end of the TP mapping Function holding it on its thread
    (its own end where none does), and whether one does."""
    region_rank, region_tid, starts_at, ends = (
        regions[c].to_numpy(np.int64) for c in ("rank", "tid", "start_ns", "end_ns")
    )
    op_thread, region_thread = pair_codes(
        ops["rank"].to_numpy(np.int64), ops["tid"].to_numpy(np.int64), (region_rank, region_tid)
    )
    held = holding(region_thread, starts_at, ends, op_thread, ops["start_ns"].to_numpy(np.int64))
    out = ops["end_ns"].to_numpy(np.int64).copy()
    out[held >= 0] = np.maximum(out[held >= 0], ends[held[held >= 0]])
    return out, held >= 0


def _gloo_work(events: pd.DataFrame, regions: pd.DataFrame) -> pd.DataFrame:
    """gloo's collective work ranges (rank, end_ns, tp) in the order they started; ``tp``: on a
    worker thread most of whose ranges start inside a TP mapping Function of the rank."""
    names = events["name"].astype(str)
    hit = names.str.match(GLOO_COLLECTIVE) & (events["cat"].astype(str) == "user_annotation")
    found = events.loc[hit, ["rank", "tid", "start_ns", "end_ns"]].sort_values(["rank", "start_ns"], kind="stable")
    rank, tid, start = (found[c].to_numpy(np.int64) for c in ("rank", "tid", "start_ns"))
    region_rank, region_start, region_end = (regions[c].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
    started_in = holding(region_rank, region_start, region_end, rank, start) >= 0
    # a thread most of whose ranges start inside mapping Functions (a gradient bucket's work
    # may start while the host happens to be in one)
    thread = group_ids(rank, tid)
    share_in = np.bincount(thread, weights=started_in) / np.maximum(np.bincount(thread), 1)
    return found.assign(tp=share_in[thread] >= 0.5)[["rank", "end_ns", "tp"]]


def recompute_per_backward(run: Run) -> dict[int, int]:
    """Per rank, the mean recomputation inside one of its backwards (or input-grad halves),
    ns: on the device the union of the kernels recomputations launched, on the host their
    spans; ranks that recompute nothing are left out."""
    if run.timeline == "device":
        table = run.device_summary["recompute"]
        rank, start, end = table["rank"], table["start_ns"], table["end_ns"]
        total = {}
        for r in np.unique(rank).tolist():
            lo, hi = merge_intervals(start[rank == r], end[rank == r])
            total[r] = int((hi - lo).sum())
    else:
        spans = recompute_spans(EventArrays.of(run.events))
        total = {}
        for r, ns in zip(spans["rank"].tolist(), (spans["end_ns"] - spans["start_ns"]).tolist()):
            total[r] = total.get(r, 0) + int(ns)
    actions = run.actions[(run.actions["step"] >= 0) & run.actions["kind"].isin(("B", "I"))]
    counts = actions.groupby("rank").size()
    return {r: ns // int(counts[r]) for r, ns in total.items() if ns > 0 and r in counts.index and counts[r] > 0}
