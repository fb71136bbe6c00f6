"""What the HTML report's page shows besides its figures: the headline facts, the findings
and notes, and the tables (per rank, blame per stage and link, critical path, what-if, the
run's files and capture), as strings ready for the template."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tracekit.analyze import Analysis
from tracekit.analyze.report_figures import (
    collective_idle,
    link_figures,
    rank_causes_ns,
    slowest_critical_path,
    stage_figures,
)
from tracekit.analyze.whatif import Prediction
from tracekit.render.html.charts import LEGEND_NAMES
from tracekit.version import __version__
from tracekit.vocab import CATEGORIES, pct

if TYPE_CHECKING:
    from tracekit.model.events import TraceFile

# Tables longer than this are folded (<details>) so the page stays readable.
FOLD_ROWS = 32


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f}"


def page_context(analysis: Analysis, notes: list[str]) -> dict[str, Any]:
    run = analysis.run
    findings = analysis.findings
    sched = run.schedule
    summary = analysis.summary
    theory = analysis.theory
    # a run without a pipeline has no bubble: its idle share is the device's (or host's) idle
    ratio_label = "bubble" if analysis.is_pipeline else "idle share"
    facts = [(f"{ratio_label} (measured)", pct(summary.bubble_ratio))]
    collective = collective_idle(analysis)
    if not analysis.is_pipeline and analysis.device is not None:
        facts.append(
            (
                "busy counts",
                "compute kernels, copies and sets; a collective kernel (all_reduce, all_to_all, ...) is idle "
                "time spent waiting for peers or moving data"
                + (f": {_ms(collective.total_ns)} ms of the idle, all ranks" if collective.per_rank else ""),
            )
        )
    if theory is not None:
        facts.append(("theory", f"{pct(theory.bubble_ratio)}  {theory.formula}"))
    if analysis.balanced_replay_ratio is not None:
        facts.append(("balanced replay", pct(analysis.balanced_replay_ratio)))
    if sched is not None:
        facts.append(
            (
                "schedule",
                f"{sched.name}  p={sched.p} v={sched.v} m={sched.m}"
                + (f"  x {sched.replicas} replicas" if sched.replicas > 1 else ""),
            )
        )
    if analysis.device is not None:
        facts.append(
            ("timeline", f"device (kernels); host runs ahead by up to {_ms(analysis.device.host_ahead_max_ns)} ms")
        )
        if analysis.host_view is not None:
            facts.append(("host-side spans would say", pct(analysis.host_view.bubble_ratio)))
    else:
        facts.append(("timeline", "host (CPU op spans)"))
    facts += [
        ("ranks", str(summary.n_ranks)),
        ("steps", str(analysis.n_steps)),
        ("actions", str(len(run.actions))),
        ("messages", str(len(run.messages))),
    ]
    return {
        "source": run.source,
        "version": __version__,
        "findings": findings,
        "top": findings[0] if findings else None,
        "facts": facts,
        "notes": notes,
        "rank_rows": _rank_rows(analysis, collective.per_rank if not analysis.is_pipeline else {}),
        "ratio_label": ratio_label,
        "cause_headers": [LEGEND_NAMES[c] for c in CATEGORIES]
        if analysis.attribution is not None and len(analysis.attribution.table)
        else (["of idle: in collectives"] if collective.per_rank and not analysis.is_pipeline else []),
        "stage_rows": _stage_rows(analysis),
        "link_rows": _link_rows(analysis),
        "critical": _critical_rows(analysis),
        "files": [f.describe() for f in run.files],
        "schedule": sched.to_dict() if sched else None,
        "theory": theory,
        "capture": _capture_rows(run.capture),
        "profiler": _profiler_rows(run.files),
        "warnings": analysis.warnings,
        "fold_rows": FOLD_ROWS,
        "pipeline": analysis.is_pipeline,
        "whatif": _whatif_rows(analysis),
        "whatif_note": analysis.whatif.note if analysis.whatif is not None else "",
        "incomplete": run.completeness.message() if run.completeness is not None else "",
        "replica_rows": _replica_rows(analysis),
    }


def _replica_rows(analysis: Analysis) -> list[list[str]]:
    """One row per stage over the replicas (the roll-up's figures), or none for one replica;
    no replica is named the worst or slowest where all are equal."""
    rollup = analysis.replicas
    if rollup is None or rollup.n_replicas < 2:
        return []
    return [
        [
            ",".join(map(str, p.stages)),
            pct(p.bubble_ratio.min),
            pct(p.bubble_ratio.median),
            pct(p.bubble_ratio.max),
            "-" if p.bubble_ratio.min == p.bubble_ratio.max else str(p.worst_replica),
            _ms(p.idle_per_step_ns.median),
            _ms(p.busy_per_step_ns.min),
            _ms(p.busy_per_step_ns.median),
            _ms(p.busy_per_step_ns.max),
            "-" if p.busy_per_step_ns.min == p.busy_per_step_ns.max else str(p.slowest_replica),
            LEGEND_NAMES.get(p.top_cause, "") if p.top_cause else "",
        ]
        for p in rollup.places
    ]


def _whatif_rows(analysis: Analysis) -> dict[str, Any] | None:
    """The rows of the analysis's what-if table, or None where it has none: ``best`` (shown
    unfolded: the fastest configuration and the best split of the layers) and ``rows`` (every
    prediction, the best split among them)."""
    report = analysis.whatif
    result = report.result if report is not None else None
    if report is None or result is None:
        return None
    measured = result.measured_step_ns

    def row(p: Prediction) -> list[str]:
        return [
            p.label,
            f"{pct(p.bubble_ratio)} ±{p.bubble_sd:.1%}",
            f"{_ms(p.step_ns)} ±{p.step_sd / 1e6:.1f}",
            f"{p.against(measured):+.1%}",
            pct(p.theory) if p.theory is not None else "",
        ]

    return {
        "measured": [pct(result.measured_bubble), _ms(measured)],
        "model": row(result.as_measured),
        "best": [row(p) for p in report.best],
        "rows": [row(p) for p in report.rows],
        "replays": result.samples,
        "split_note": report.split_note,
    }


def _rank_rows(analysis: Analysis, collective: dict[int, int]) -> list[list[str]]:
    """Per rank: busy, idle, its share, then the idle causes (attributed runs) or the idle
    spent in collectives (``collective``: per rank, a run without a pipeline)."""
    causes = rank_causes_ns(analysis)
    rows = []
    for rank, info in analysis.summary.per_rank.items():
        row = [str(rank), _ms(info.busy_ns), _ms(info.idle_ns), pct(info.bubble_ratio)]
        if causes:
            row += [_ms(causes[rank][c]) for c in CATEGORIES]
        elif collective:
            row.append(_ms(collective.get(rank, 0)))
        rows.append(row)
    return rows


def _stage_rows(analysis: Analysis) -> list[list[str]]:
    return [
        [
            str(s.stage),
            "?" if s.rank is None else str(s.rank),
            _ms(s.compute_ns),
            f"{s.vs_median:.2f}x" if s.vs_median is not None else "n/a",
            _ms(s.blamed_ns),
            pct(s.idle_share),
        ]
        for s in stage_figures(analysis)
    ]


def _link_rows(analysis: Analysis) -> list[list[str]]:
    return [
        [
            f"{link.src_rank} -> {link.dst_rank}",
            str(link.n_messages),
            _ms(link.latency_ns),
            _ms(link.post_delay_ns),
            _ms(link.blamed_ns),
            pct(link.idle_share),
        ]
        for link in link_figures(analysis)
    ]


def _critical_rows(analysis: Analysis) -> dict[str, Any] | None:
    critical = slowest_critical_path(analysis)
    if critical is None:
        return None
    rows = [
        [
            f"{p['kind']}{p['stage']}.{p['microbatch']}",
            str(p["rank"]),
            _ms(p["compute_ns"]),
            p.get("via", ""),
            p.get("link", ""),
            _ms(p.get("comm_ns", 0)),
            _ms(p.get("overhead_ns", 0)),
        ]
        for p in critical.path
    ]
    return {
        "step": critical.step,
        "makespan": _ms(critical.makespan_ns),
        "rows": rows,
        "compute": _ms(critical.compute_ns),
        "comm": _ms(critical.comm_ns),
    }


def _capture_rows(capture: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not capture:
        return []
    rows: list[tuple[str, str]] = []
    for key in (
        "command",
        "tracekit_version",
        "torch_version",
        "python_version",
        "platform",
        "schedule_class",
        "backend",
        "created",
    ):
        if key in capture:
            rows.append((key, str(capture[key])))
    compute = capture.get("compute") or {}
    if isinstance(compute, dict) and compute:
        rows.append(("compute", ", ".join(f"{k}={compute[k]}" for k in ("mode", "layer_ms", "layers") if k in compute)))
        if "how" in compute:
            rows.append(("compute, how", str(compute["how"])))
    faults = capture.get("faults") or {}
    if isinstance(faults, dict) and faults:
        rows.append(("faults", as_text(faults.get("how", faults))))
    return rows


def _profiler_rows(files: Iterable[TraceFile]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for f in files:
        for key, value in (f.profiler or {}).items():
            seen.setdefault(str(key), as_text(value))
    return sorted(seen.items())


def as_text(value: object) -> str:
    """A metadata value as a person reads it: a mapping as ``key=value, ...`` (nsys's counts
    per process), a list comma separated, anything else as itself; never Python's repr."""
    if isinstance(value, dict):
        return ", ".join(f"{key}={as_text(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(as_text(item) for item in value)
    return str(value)
