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
  pipeline's drain.

On the device the kernels say it (``DeviceSummary`` table ``collectives``: which are gradient
collectives is decided there, see :mod:`tracekit.model.device`). On a host-only run (gloo on
CPU) the host ops of collectives do (:func:`tracekit.reconstruct.layout.collective_ops`): one
started inside an action is a tensor-parallel collective where the layout has tensor
parallelism, else a gradient collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyze.shares import share
from tracekit.model.run import Run
from tracekit.reconstruct.layout import collective_ops, collectives_inside_actions

DIMENSION_COLUMNS = ["rank", "step", "tp_ns", "tp_alone_ns", "dp_ns", "dp_exposed_ns"]


@dataclass
class DimensionFigures:
    """Per rank and step (``per_step``: DIMENSION_COLUMNS), from ``source`` ("kernels" or
    "host ops")."""

    per_step: pd.DataFrame
    source: str

    def per_rank(self, bubbles: pd.DataFrame) -> pd.DataFrame:
        """Summed over steps, with each rank's busy, idle and window, busy counted as compute
        only and both bubble ratios."""
        sums = self.per_step.groupby("rank")[DIMENSION_COLUMNS[2:]].sum()
        measured = bubbles.groupby("rank")[["window_ns", "busy_ns", "idle_ns"]].sum()
        out = measured.join(sums, how="left").fillna(0).astype(np.int64)
        out["busy_compute_only_ns"] = out["busy_ns"] - out["tp_alone_ns"]
        return out

    def to_dict(self, bubbles: pd.DataFrame) -> dict[str, Any]:
        rows = []
        for rank, r in self.per_rank(bubbles).iterrows():
            window = max(int(r["window_ns"]), 1)
            rows.append(
                {
                    "rank": int(rank),
                    "tp_ns": int(r["tp_ns"]),
                    "tp_share_of_busy": round(share(int(r["tp_ns"]), max(int(r["busy_ns"]), 1), "TP share"), 6),
                    "dp_ns": int(r["dp_ns"]),
                    "dp_exposed_ns": int(r["dp_exposed_ns"]),
                    "dp_overlapped_ns": int(r["dp_ns"] - r["dp_exposed_ns"]),
                    "busy_ns": int(r["busy_ns"]),
                    "busy_compute_only_ns": int(r["busy_compute_only_ns"]),
                    "bubble_ratio": round(int(r["idle_ns"]) / window, 6),
                    "bubble_ratio_compute_only": round((window - int(r["busy_compute_only_ns"])) / window, 6),
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
            "per_rank_step_ns": {c: int(total[c]) // cells for c in ("tp_ns", "dp_ns", "dp_exposed_ns")},
            "bubble_ratio_compute_only": round((window - only) / window, 6),
            "ranks": rows,
        }


def dimension_figures(run: Run, bubbles: pd.DataFrame) -> DimensionFigures | None:
    """The figures of a run with collectives (None where it has none)."""
    if bubbles.empty:
        return None
    windows = bubbles[["rank", "step", "window_start_ns", "window_end_ns"]].astype(np.int64)
    table = run.device_summary.tables.get("collectives") if run.timeline == "device" else None
    if table is not None and len(table["rank"]):
        frame = pd.DataFrame({c: table[c] for c in ("rank", "step", "start_ns", "end_ns", "gradient", "alone_ns")})
        frame["tp"] = frame["gradient"] == 0
        source = "kernels"
    else:
        ops = collective_ops(run.events)
        if ops.empty:
            return None
        inside = collectives_inside_actions(ops, run.actions).to_numpy()
        tensor = run.layout is not None and run.layout.size("tp") > 1
        frame = ops.assign(
            step=_step_of(ops, windows),
            tp=inside & tensor,
            alone_ns=(ops["end_ns"] - ops["start_ns"]).where(inside & tensor, 0),
        )
        source = "host ops"
    merged = frame.merge(windows, on=["rank", "step"], how="inner")
    length = merged["end_ns"] - merged["start_ns"]
    exposed = (merged["end_ns"] - np.maximum(merged["start_ns"], merged["window_end_ns"])).clip(lower=0)
    tp = merged["tp"].to_numpy(bool)
    per = pd.DataFrame(
        {
            "rank": merged["rank"],
            "step": merged["step"],
            "tp_ns": length.where(tp, 0),
            "tp_alone_ns": merged["alone_ns"].where(tp, 0),
            "dp_ns": length.where(~tp, 0),
            "dp_exposed_ns": exposed.where(~tp, 0),
        }
    )
    summed = per.groupby(["rank", "step"], as_index=False)[DIMENSION_COLUMNS[2:]].sum()
    out = windows[["rank", "step"]].merge(summed, on=["rank", "step"], how="left").fillna(0)
    out[DIMENSION_COLUMNS[2:]] = out[DIMENSION_COLUMNS[2:]].astype(np.int64)
    if not out[DIMENSION_COLUMNS[2:]].to_numpy().any():
        return None
    return DimensionFigures(out[DIMENSION_COLUMNS], source)


def _step_of(ops: pd.DataFrame, windows: pd.DataFrame) -> np.ndarray:
    """Each host op's step: the last of its rank's windows starting at or before it (-1)."""
    out = np.full(len(ops), -1, dtype=np.int64)
    for rank, rows in ops.groupby("rank").indices.items():
        mine = windows[windows["rank"] == rank].sort_values("window_start_ns")
        if mine.empty:
            continue
        k = np.searchsorted(mine["window_start_ns"].to_numpy(), ops["start_ns"].to_numpy()[rows], side="right") - 1
        out[rows] = np.where(k >= 0, mine["step"].to_numpy()[np.maximum(k, 0)], -1)
    return out
