"""Analyses: pure functions over a reconstructed :class:`Run`, gathered in :func:`analyze`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from tracekit.analyze.attribution import Attribution, attribute
from tracekit.analyze.bubbles import (
    RankSummary,
    RunSummary,
    bubble_table,
    measure_continuous,
    measure_pipeline,
    measure_plain,
    summarise,
)
from tracekit.analyze.device import (
    DeviceFigures,
    device_figures,
    measure_device_pipeline,
    measure_device_plain,
)
from tracekit.analyze.diagnosis import Finding, diagnose, replica_findings, with_replica_findings
from tracekit.analyze.dimensions import DimensionFigures, dimension_figures
from tracekit.analyze.replicas import ReplicaRollup, rollup
from tracekit.analyze.shares import ShareError, share
from tracekit.analyze.slices import SliceCosts, slice_costs
from tracekit.analyze.theory import Theory, flush_free_bubble, sliced_bubble, theoretical_bubble
from tracekit.errors import TracekitError
from tracekit.model.run import Run, add_warning, compute_ns
from tracekit.reconstruct.event_arrays import LAUNCH_CATEGORY
from tracekit.reconstruct.schedule import TERAPIPE_NAME

if TYPE_CHECKING:  # loaded where a report asks for its what-if (split search and all): not on analyze's path
    from tracekit.analyze.report_whatif import ReportWhatIf

# Replay residual (|measured - replayed makespan|) above this share of the step is flagged.
FIDELITY_WARN_SHARE = 0.01


@dataclass
class Analysis:
    """Everything tracekit computes about one run, ready for the renderers: they only
    render it, and compute nothing of their own."""

    run: Run
    bubbles: pd.DataFrame  # rank, step, window, busy, idle, ratio
    summary: RunSummary  # run and per-rank totals of the bubble table
    durations_ns: dict[str, int] = field(default_factory=dict)  # typical t_F, t_B, t_I, t_W
    theory: Theory | None = None
    balanced_replay_ratio: float | None = None
    attribution: Attribution | None = None
    device: DeviceFigures | None = None  # device-timeline figures (GPU runs read on the device)
    host_view: RunSummary | None = None  # summarise() of the host-side spans, where they differ
    slices: SliceCosts | None = None  # per-microbatch cost and its idle (microbatch ids per step)
    findings: list[Finding] = field(default_factory=list)  # what is wrong and what to try, ranked
    whatif: ReportWhatIf | None = None  # the report's what-if table (asked for with whatif=True)
    replicas: ReplicaRollup | None = None  # the ranks per place over data-parallel replicas, and patterns
    # TP collectives inside actions, DP gradient collectives, busy without TP (3-D parallel jobs)
    dimensions: DimensionFigures | None = None
    # What the analysis itself warns of (a replay far from the measured step, a step's notes),
    # each once and none the run says already: the run's warnings are the run's (see warnings)
    own_warnings: list[str] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """What the outputs warn of: the run's warnings, then the analysis' own."""
        return [*self.run.warnings, *self.own_warnings]

    def warn(self, message: str) -> None:
        """Warn of ``message`` where neither the run nor the analysis has yet."""
        if message not in self.run.warnings:
            add_warning(self.own_warnings, message)

    @property
    def timeline(self) -> str:
        return self.run.timeline

    @property
    def is_pipeline(self) -> bool:
        return self.run.is_pipeline

    @property
    def n_steps(self) -> int:
        """The steps measured (on any rank)."""
        return int(self.bubbles["step"].nunique()) if len(self.bubbles) else 0


def typical_durations(actions: pd.DataFrame) -> dict[str, int]:
    """Median compute time of each action kind (one microbatch, one stage)."""
    durations = compute_ns(actions)
    return {str(k): int(v) for k, v in durations.groupby(actions["kind"]).median().items()}


def analyze(
    run: Run, attribution: bool = True, whatif: bool = False, progress: Callable[[str], None] | None = None
) -> Analysis:
    """Measure bubbles, compare with theory, attribute idle time and diagnose the run.

    ``whatif``: also predict the default what-if table of the HTML report (replays other
    schedules and m; on a pipeline with attribution only). A run with ranks missing is
    measured on the ranks present only: no closed form and no replay, which both need the
    whole pipeline. Raises :class:`TracekitError` for a run with no work to measure, and
    where a share would fall outside [0, 1]. ``progress`` is told each long part's name as
    it starts (the replays of each step, the diagnosis, the report's what-if)."""
    try:
        result = _analyze(run, attribution, progress)
        if result.is_pipeline:  # TP, DP and recomputation: None where a run has none of them
            result.dimensions = dimension_figures(run, result.bubbles)
        result.replicas = rollup(result)
        if progress:
            progress("diagnosing")
        result.findings = with_replica_findings(diagnose(result), replica_findings(result))
    except ShareError as err:
        raise ShareError(f"{run.source}: {err}") from None
    if whatif and result.is_pipeline and result.attribution is not None:
        from tracekit.analyze.report_whatif import report_what_if

        result.whatif = report_what_if(run, list(result.attribution.graphs.values()), result.bubbles, progress)
    return result


def _host_spans(actions: pd.DataFrame) -> pd.DataFrame:
    return actions.assign(start_ns=actions["host_start_ns"], end_ns=actions["host_end_ns"])


def _analyze(run: Run, attribution: bool, progress: Callable[[str], None] | None = None) -> Analysis:
    on_device = run.timeline == "device"
    if not run.is_pipeline:
        bubbles = measure_device_plain(run.device_summary) if on_device else _host_plain(run, run.events)
        summary = summarise(bubbles)
        if not summary.busy_ns:
            raise TracekitError(
                f"{run.source}: no work recorded: {_events_read(run)} event(s) and no op, kernel or "
                "annotation inside any step window; nothing to measure (profile a window with training "
                "steps in it)"
            )
        result = Analysis(run=run, bubbles=bubbles, summary=summary)
        if on_device:
            result.device = device_figures(run, bubbles)
            host = _host_plain(run, run.events[(run.events["cat"] != LAUNCH_CATEGORY).to_numpy()])
            result.host_view = summarise(host) if len(host) else None
        return result
    sched = run.schedule
    assert sched is not None  # is_pipeline: a schedule and its actions
    actions = run.actions[run.actions["step"] >= 0]
    if actions.empty:
        raise TracekitError(
            f"{run.source}: every pipeline action lies outside the profiled steps (ProfilerStep#N): "
            "nothing to measure; profile whole steps"
        )
    if sched.flush_free and not on_device:
        bubbles = measure_continuous(actions, run.steps)  # per-rank windows: steps do not overlap
    else:
        bubbles = measure_device_pipeline(actions, run.device_summary) if on_device else measure_pipeline(actions)
    result = Analysis(run=run, bubbles=bubbles, summary=summarise(bubbles), durations_ns=typical_durations(actions))
    if on_device:
        result.device = device_figures(run, bubbles)
        result.host_view = summarise(measure_pipeline(_host_spans(actions)))
    completeness = run.completeness
    if completeness is not None and not completeness.every_rank:
        result.theory = Theory(
            sched.name,
            "",
            None,
            "not computed: the run has ranks missing ("
            f"{completeness.missing_text()}), and the closed form and the replay need "
            "the whole pipeline",
        )
        return result
    d = result.durations_ns
    t_f = d.get("F", 1)
    t_b = d.get("B", d.get("I", 0) + d.get("W", 0)) or 2 * t_f
    t_w = d.get("W")
    if "I" in d and "W" in d and "B" not in d:
        t_b = d["I"] + d["W"]
    if sched.flush_free:
        first_stage = actions[actions["stage"] == actions["stage"].min()]
        fill_recorded = bool((first_stage["microbatch"] == 0).any())
        result.theory = flush_free_bubble(sched.name, sched.p, sched.m, int(actions["step"].nunique()), fill_recorded)
    else:
        result.theory = theoretical_bubble(sched.name, sched.p, sched.v, sched.m, t_f, t_b, t_w)
    if attribution:
        result.attribution = attribute(run, bubbles, progress)
        steps = result.attribution.steps
        ideal_window = sum(s.ideal_makespan_ns * len(s.ideal_idle_ns) for s in steps)
        if ideal_window:
            ideal_idle = sum(sum(s.ideal_idle_ns.values()) for s in steps)
            result.balanced_replay_ratio = share(ideal_idle, ideal_window, "the balanced replay's bubble ratio")
        for s in result.attribution.steps:
            if s.measured_makespan_ns and abs(s.residual_ns) > FIDELITY_WARN_SHARE * s.measured_makespan_ns:
                result.warn(
                    f"step {s.step}: replay differs from the measured step by "
                    f"{s.residual_ns / 1e6:.2f} ms ({s.residual_ns / s.measured_makespan_ns:.1%}); "
                    "attribution there is less certain"
                )
            for note in s.notes:
                result.warn(f"step {s.step}: {note}")
    if not sched.flush_free:
        result.slices = slice_costs(actions, result.attribution.graphs if result.attribution else None)
        if result.slices is not None and sched.name == TERAPIPE_NAME and sched.p == sched.n_stages:
            result.theory = sliced_bubble(sched.name, sched.p, result.slices.forward_ns, result.slices.backward_ns)
    return result


def _host_plain(run: Run, events: pd.DataFrame) -> pd.DataFrame:
    """:func:`measure_plain` of ``events`` (the run's host rows), or the rows the processes
    that parsed its ranks measured the same way (``run.host_busy``: its events are not held)."""
    return bubble_table(run.host_busy) if run.host_busy is not None else measure_plain(events, run.steps)


def _events_read(run: Run) -> int:
    """How many events the run's files held (ranks reduced where parsed send few of them)."""
    return sum(f.n_events_raw for f in run.files) or len(run.events)


__all__ = ["Analysis", "RankSummary", "RunSummary", "analyze", "typical_durations"]
