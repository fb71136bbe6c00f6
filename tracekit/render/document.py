"""The analysis document every document renderer reads (built by
:func:`tracekit.render.json.to_document`, or read back from the document cache), and the
figures derived from it that its schema does not store: the sums the console shows.
Computed here, beside the document's type, so that a renderer only formats; and importing no
analysis code, so that rendering a stored document stays quick.
"""

from __future__ import annotations

import json
from typing import TypedDict

from tracekit.schemas.analysis import AnalysisDocument, DevicePairDoc, DeviceRankDoc, DimensionsDoc, PathStepDoc
from tracekit.vocab import IDLE_CAUSES


def cause_totals(doc: AnalysisDocument) -> dict[str, int]:
    """Each cause's idle (by key) summed over every rank and step, in the causes' order; empty
    where the run was not attributed (``--no-attribution``, an incomplete run)."""
    if not any("causes" in r for r in doc["ranks"]):
        return {}
    return {c.key: sum(r.get("causes", {}).get(c.column, 0) for r in doc["ranks"]) for c in IDLE_CAUSES}


def idle_by_cause(doc: AnalysisDocument) -> list[tuple[str, int, float]]:
    """(cause key, its idle ns, its percentage of the run's idle), largest first, the causes
    with idle only."""
    idle = doc["summary"]["idle_ns"] or 1
    by_size = sorted(cause_totals(doc).items(), key=lambda kv: -kv[1])
    return [(cause, value, 100 * value / idle) for cause, value in by_size if value > 0]


def device_totals(doc: AnalysisDocument) -> dict[str, float]:
    """A device timeline's sums over ranks and kernel pairs: the work launched before the
    profile began, the work after the pipeline's window per step, and the time SendRecv
    kernels of collectives and of P2P spent waiting for the peer and moving data."""
    device = doc.get("device")
    ranks: list[DeviceRankDoc] = device["ranks"] if device else []
    collective: list[DevicePairDoc] = (device.get("collective_pairs") or []) if device else []
    pairs: list[DevicePairDoc] = device["p2p_pairs"] if device else []
    n_steps = max(doc["summary"]["n_steps"] or 1, 1)
    return {
        "before_profile_ns": sum(r.get("before_profile_ns", 0) for r in ranks),
        "step_end_per_step_ns": sum(r["step_end_ns"] for r in ranks) / n_steps,
        "collective_wait_ns": sum(p["wait_ns"] for p in collective),
        "collective_transfer_ns": sum(p["transfer_ns"] for p in collective),
        "p2p_wait_ns": sum(p["wait_ns"] for p in pairs),
        "p2p_transfer_ns": sum(p["transfer_ns"] for p in pairs),
    }


def overlap_per_rank_ns(dimensions: DimensionsDoc) -> float:
    """Time TP and PP kernels of a 3-D parallel job ran at once, per rank."""
    links = dimensions.get("shared_links")
    return sum(links["overlap_ns"].values() if links else []) / max(len(dimensions["ranks"]), 1)


class ReplayTotals(TypedDict):
    n_steps: int  # steps replayed
    worst_residual_ns: int  # the largest measured-minus-replayed step time, either sign
    step: int  # the last replayed step, whose critical path this is
    critical_path: list[PathStepDoc]
    path_compute_ns: int
    path_comm_ns: int


def replay_totals(doc: AnalysisDocument) -> ReplayTotals | None:
    """The replay's fidelity over the replayed steps (their count, the largest residual) and
    the last one's critical path with its compute and comm; None where nothing was replayed."""
    steps = [st for st in doc["steps"] if "replay" in st]
    if not steps:
        return None
    path = steps[-1].get("critical_path", [])
    return {
        "n_steps": len(steps),
        "worst_residual_ns": max(abs(st["replay"]["residual_ns"]) for st in steps),
        "step": steps[-1]["step"],
        "critical_path": path,
        "path_compute_ns": sum(p["compute_ns"] for p in path),
        "path_comm_ns": sum(p.get("comm_ns", 0) for p in path),
    }


class JsonRenderer:
    """The document as ``analyze --json`` and ``-o`` write it: indented by one space (here,
    beside the document's type: a cached analysis is written without the analysis code)."""

    name = "json"
    reads = "document"

    def render(self, doc: AnalysisDocument) -> str:
        return json.dumps(doc, indent=1)
