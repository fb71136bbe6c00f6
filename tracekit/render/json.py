"""The JSON document (``tracekit analyze --json``): a versioned schema, described by
``tracekit/schemas/analysis.schema.json``. Times are integer nanoseconds; ratios are 0..1.

Its version is :data:`tracekit.schemas.ANALYSIS_SCHEMA_VERSION` (bump it there).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tracekit.model.groups import split_by
from tracekit.schemas import ANALYSIS_SCHEMA_VERSION
from tracekit.schemas.analysis import (
    AnalysisDocument,
    DeviceDoc,
    DevicePairDoc,
    DeviceRankDoc,
    HostViewDoc,
    RankRow,
    StepDoc,
)
from tracekit.version import __version__
from tracekit.vocab import IDLE_CAUSES

if TYPE_CHECKING:  # the package needs pandas; writing a cached document needs neither
    import pandas as pd

    from tracekit.analyze import Analysis


def _ratio(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), 6)


def to_document(analysis: Analysis) -> AnalysisDocument:
    """The whole analysis as plain JSON-able data."""
    run = analysis.run
    doc: AnalysisDocument = {
        "schema_version": ANALYSIS_SCHEMA_VERSION,
        "tracekit_version": __version__,
        "source": run.source,
        "files": [f.describe() for f in run.files],
        "warnings": analysis.warnings,
        "completeness": run.completeness.to_dict() if run.completeness else None,
        "pipeline": analysis.is_pipeline,
        "timeline": run.timeline,
        "labels": {"table": run.labels, "actions_from": run.actions_from, "matched": dict(run.label_counts)},
        "schedule": run.schedule.to_dict() if run.schedule else None,
        "layout": run.layout.to_dict() if run.layout else None,
        "capture": _capture_summary(run.capture),
        "summary": {
            "bubble_ratio": _ratio(analysis.summary.bubble_ratio),
            "window_ns": analysis.summary.window_ns,
            "busy_ns": analysis.summary.busy_ns,
            "idle_ns": analysis.summary.idle_ns,
            "n_ranks": analysis.summary.n_ranks,
            "n_steps": analysis.n_steps,
            "n_actions": int(len(run.actions)),
            "n_messages": int(len(run.messages)),
        },
        "theory": None
        if analysis.theory is None
        else {
            "schedule": analysis.theory.schedule,
            "formula": analysis.theory.formula,
            "bubble_ratio": _ratio(analysis.theory.bubble_ratio),
            "note": analysis.theory.note,
            "balanced_replay_bubble_ratio": _ratio(analysis.balanced_replay_ratio),
            "durations_ns": dict(analysis.durations_ns),
        },
        "findings": [f.to_dict() for f in analysis.findings],
        "ranks": [],
        "steps": [],
        "blame": {"stages": [], "links": []},
        "slices": analysis.slices.to_dict() if analysis.slices is not None else None,
        "rollup": analysis.replicas.to_dict() if analysis.replicas is not None else None,
        "dimensions": analysis.dimensions.to_dict(analysis.bubbles) if analysis.dimensions is not None else None,
    }
    doc["host_view"] = _host_view(analysis)
    doc["device"] = _device(analysis)
    attribution = analysis.attribution
    cause_columns = [c.column for c in IDLE_CAUSES]
    rank_causes = attribution.rank_causes_ns(analysis.summary.per_rank) if attribution else {}
    for rank, info in analysis.summary.per_rank.items():
        entry: RankRow = {
            "rank": rank,
            "window_ns": info.window_ns,
            "busy_ns": info.busy_ns,
            "idle_ns": info.idle_ns,
            "bubble_ratio": _ratio(info.bubble_ratio),
        }
        if rank_causes:
            entry["causes"] = {c.column: rank_causes[rank][c.key] for c in IDLE_CAUSES}
        doc["ranks"].append(entry)
    by_step = {s.step: s for s in attribution.steps} if attribution else {}
    # Each column read once as Python values, each step's rows (in table order) split out at
    # once: a groupby and two itertuples a step cost ~1 ms a step.
    bubbles = analysis.bubbles
    fields = ("rank", "window_ns", "busy_ns", "idle_ns", "bubble_ratio", "window_start_ns", "window_end_ns")
    column = {name: bubbles[name].tolist() for name in fields}
    steps = bubbles["step"].to_numpy()
    for step, at in split_by(steps, np.arange(len(steps))).items():
        rows = at.tolist()
        att = by_step.get(int(step))
        step_doc: StepDoc = {
            "step": int(step),
            "window_start_ns": int(min(column["window_start_ns"][i] for i in rows)),
            "window_end_ns": int(max(column["window_end_ns"][i] for i in rows)),
            "ranks": [],
        }
        # rank -> its causes, read once (a .loc per rank costs ~0.2 ms)
        att_rows = None
        if att is not None:
            causes = [att.table[c].tolist() for c in cause_columns]
            att_rows = {int(r): [c[i] for c in causes] for i, r in enumerate(att.table["rank"].tolist())}
        for i in rows:
            rank = int(column["rank"][i])
            rank_doc: RankRow = {
                "rank": rank,
                "window_ns": int(column["window_ns"][i]),
                "busy_ns": int(column["busy_ns"][i]),
                "idle_ns": int(column["idle_ns"][i]),
                "bubble_ratio": _ratio(column["bubble_ratio"][i]),
            }
            if att is not None and att_rows is not None and rank in att_rows:
                rank_doc["causes"] = {k: int(v) for k, v in zip(cause_columns, att_rows[rank])}
                rank_doc["signed_shapley_ns"] = {k: round(v, 1) for k, v in att.signed_shapley[rank].items()}
            step_doc["ranks"].append(rank_doc)
        if att is not None:
            step_doc["replay"] = {
                "measured_makespan_ns": att.measured_makespan_ns,
                "replay_makespan_ns": att.replay_makespan_ns,
                "residual_ns": att.residual_ns,
                "ideal_makespan_ns": att.ideal_makespan_ns,
            }
            step_doc["critical_path"] = att.critical_path[::-1]
        doc["steps"].append(step_doc)
    if attribution:
        stages = attribution.stage_blame
        if len(stages):
            grouped = stages.groupby("stage")["imbalance_ns"].sum().sort_values(ascending=False)
            doc["blame"]["stages"] = [
                {
                    "stage": int(s),
                    "imbalance_ns": int(v),
                    "rank": int(run.schedule.stage_to_rank.get(int(s), -1)) if run.schedule else -1,
                    "ranks": run.schedule.ranks_of_stage(int(s)) if run.schedule else [],
                }
                for s, v in zip(grouped.index.tolist(), grouped.tolist())
            ]
        links = attribution.link_blame
        if len(links):
            grouped = links.groupby(["src_rank", "dst_rank"])["comm_ns"].sum().sort_values(ascending=False)
            doc["blame"]["links"] = [
                {"src_rank": int(s), "dst_rank": int(d), "comm_ns": int(v)}
                for (s, d), v in zip(grouped.index.tolist(), grouped.tolist())
            ]
    return doc


def _host_view(analysis: Analysis) -> HostViewDoc | None:
    """The host-side figures of a run measured on the device (what CPU op spans say)."""
    view = analysis.host_view
    if view is None:
        return None
    return {
        "timeline": "host",
        "bubble_ratio": _ratio(view.bubble_ratio),
        "ranks": [
            {
                "rank": r,
                "window_ns": v.window_ns,
                "busy_ns": v.busy_ns,
                "idle_ns": v.idle_ns,
                "bubble_ratio": _ratio(v.bubble_ratio),
            }
            for r, v in view.per_rank.items()
        ],
    }


def _device(analysis: Analysis) -> DeviceDoc | None:
    """Device-timeline figures: launch waits, step-end work, P2P wait vs transfer."""
    figures = analysis.device
    if figures is None:
        return None
    per_rank = figures.per_rank()
    windows = analysis.summary.per_rank
    ranks: list[DeviceRankDoc] = []
    for rank, row in zip(per_rank.index.tolist(), per_rank.to_dict("records")):
        window = windows[int(rank)].window_ns if int(rank) in windows else 0
        ranks.append(
            {
                "rank": int(rank),
                "launch_wait_ns": int(row["launch_wait_ns"]),
                "step_end_ns": int(row["step_end_ns"]),
                "p2p_wait_ns": int(row["p2p_wait_ns"]),
                "p2p_transfer_ns": int(row["p2p_transfer_ns"]),
                "collective_idle_ns": int(row["collective_idle_ns"]),
                "launch_wait_share": _ratio(row["launch_wait_ns"] / window) if window else None,
                "host_ahead_ns": int(figures.host_ahead_ns.get(int(rank), 0)),
                "before_profile_ns": int(figures.before_profile_ns.get(int(rank), 0)),
            }
        )

    def rows(table: pd.DataFrame) -> list[DevicePairDoc]:
        # a table of model.run.DEVICE_PAIR_COLUMNS, each row those keys
        return [
            cast("DevicePairDoc", {str(k): (v if isinstance(v, str) else int(v)) for k, v in row.items()})
            for row in table.to_dict("records")
        ]

    return {
        "host_ahead_max_ns": figures.host_ahead_max_ns,
        "ranks": ranks,
        "p2p_pairs": rows(figures.pairs),
        "collective_pairs": rows(analysis.run.collective_pairs),
        "n_ops": int(sum(analysis.run.device_summary.n_ops.values())),
    }


def _capture_summary(capture: dict[str, Any] | None) -> dict[str, Any] | None:
    if not capture:
        return None
    keys = (
        "command",
        "framework",
        "torch_version",
        "deepspeed_version",
        "megatron_core_version",
        "schedule",
        "p",
        "v",
        "m",
        "steps",
        "compute",
        "faults",
        "created",
    )
    return {k: capture[k] for k in keys if k in capture}
