"""The checks of ``tracekit check``: each limit or baseline figure against the run's measures.

A check passes when the measured figure is at most its limit: the fixed limit for
``max-*`` settings, the baseline's figure plus the tolerance for a baseline (absolute
points for a share, a fraction of the baseline's step for the step time). Only rises fail; a fall past the tolerance passes with a hint to refresh the
baseline, so that the gate keeps what was won.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracekit.analyze.compare import Measures, schedule_key
from tracekit.errors import TracekitError
from tracekit.gate.baseline import read_baseline
from tracekit.gate.config import CheckConfig, Limit
from tracekit.version import __version__
from tracekit.vocab import in_ms, pct, points

# Ratios are stored to 6 decimals: equal to the limit within that is at the limit.
_EPSILON = 1e-6

PASSED, REGRESSED = 0, 1


@dataclass
class Check:
    id: str  # stable, for scripts and JUnit: "baseline.cause.comm", "rank2.bubble_ratio"
    name: str  # for people: "comm share of the step window"
    value: float
    limit: float
    rule: str  # "max 35.0% (--max-bubble)", "baseline 32.9% + 5.0 points (--tolerance)"
    baseline: float | None = None
    note: str = ""
    unit: str = "share"  # "share" (of the step window, 0..1) or "ns" (the step time)

    @property
    def passed(self) -> bool:
        return self.value <= self.limit + _EPSILON

    def shown(self, value: float) -> str:
        """One of this check's figures as people read it: ``30.2%`` or ``474.4 ms``."""
        return in_ms(value) if self.unit == "ns" else pct(value)

    def line(self) -> str:
        """One line that says what was checked and, for a failure, by how much it failed."""
        status, op = ("ok  ", "<=") if self.passed else ("FAIL", ">")
        text = f"{status} {self.name} {self.shown(self.value)} {op} {self.rule}"
        return f"{text}: {self.note}" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        digits = 0 if self.unit == "ns" else 6
        return {
            "id": self.id,
            "name": self.name,
            "unit": self.unit,
            "passed": self.passed,
            "value": round(self.value, digits),
            "limit": round(self.limit, digits),
            "baseline": None if self.baseline is None else round(self.baseline, digits),
            "rule": self.rule,
            "line": self.line(),
        }


@dataclass
class GateResult:
    measures: Measures
    config: CheckConfig
    checks: list[Check]
    baseline: Measures | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return PASSED if self.passed else REGRESSED

    def summary(self) -> str:
        head = f"tracekit check {self.measures.source} ({self.measures.schedule_label})"
        if self.passed:
            return f"{head}: passed, {len(self.checks)} checks"
        return f"{head}: FAILED, {len(self.failures)} of {len(self.checks)} checks regressed"

    def lines(self) -> list[str]:
        """Failures first, one line each, then the checks that passed, then notes."""
        ordered = self.failures + [c for c in self.checks if c.passed]
        return [c.line() for c in ordered] + [f"note: {n}" for n in self.notes]

    def to_dict(self) -> dict[str, Any]:
        m = self.measures
        return {
            "kind": "tracekit-check",
            "tracekit_version": __version__,
            "source": m.source,
            "schedule": m.schedule,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "config_file": str(self.config.config_file) if self.config.config_file else None,
            "incomplete": m.incomplete or None,
            "baseline": None
            if self.config.baseline is None
            else {"path": str(self.config.baseline), "source": self.baseline.source if self.baseline else None},
            "measures": {
                "bubble_ratio": round(m.bubble_ratio, 6),
                "step_ns": round(m.step_ns),
                "ranks": {str(r): round(v, 6) for r, v in sorted(m.rank_bubble.items())},
                "causes": {c: round(v, 6) for c, v in m.cause_share.items()},
            },
            "checks": [c.to_dict() for c in self.checks],
            "notes": list(self.notes),
        }


def refuse_incomplete(measures: Measures, command: str, also: str = "") -> None:
    """A gate on a run with ranks missing or traces cut short would pass or fail on figures
    of part of a pipeline: one line saying so (``also``: another way to allow it)."""
    if measures.incomplete:
        raise TracekitError(
            f"{measures.source}: incomplete run: {measures.incomplete}; tracekit {command} needs every "
            f"rank's whole trace: add the missing traces (or copy the cut ones again), or pass "
            f"--allow-incomplete{also} to use what is there"
        )


def evaluate(measures: Measures, config: CheckConfig, baseline: Measures | None = None) -> GateResult:
    """Every configured check against ``measures`` (``baseline``: the measures read from
    ``config.baseline``). Raises :class:`TracekitError` when the checks cannot be made:
    nothing configured, ranks missing (unless ``config.allow_incomplete``), no attribution
    for a cause limit, a baseline of another schedule."""
    config.require_checks()
    if not config.allow_incomplete:
        refuse_incomplete(measures, "check", " (or set allow-incomplete = true in [tool.tracekit.check])")
    if config.baseline and baseline is None:
        baseline = read_baseline(config.baseline)
    if config.max_cause and not measures.cause_share:
        why = (
            "a run with ranks missing is not attributed (the replay needs the whole pipeline)"
            if measures.incomplete
            else "this run has no pipeline schedule to attribute it by"
        )
        raise TracekitError(
            f"{measures.source}: cause limits need the idle time attributed, and {why}; drop the --max-cause limits"
        )
    if baseline is not None and baseline.timeline != measures.timeline:
        raise TracekitError(
            f"timeline differs from the baseline: {config.baseline} was measured on the {baseline.timeline}, "
            f"{measures.source} on the {measures.timeline} (the host runs ahead of a GPU: the figures are not "
            f"comparable); check with --timeline {baseline.timeline}, or remake the baseline (tracekit baseline "
            "RUN_DIR -o FILE)"
        )
    notes = []
    if measures.incomplete:
        notes.append(
            f"incomplete run allowed: {measures.incomplete}; checked on the ranks present"
            + (", its schedule not compared with the baseline's" if baseline is not None else "")
        )
    elif baseline is not None and schedule_key(baseline.schedule) != schedule_key(measures.schedule):
        raise TracekitError(
            f"schedule differs from the baseline: {config.baseline} was made from a {baseline.schedule_label} "
            f"run, {measures.source} is {measures.schedule_label}; bubble ratios of different schedules are "
            "not comparable: remake the baseline (tracekit baseline RUN_DIR -o FILE) if the change is intended"
        )
    result = GateResult(measures=measures, config=config, checks=[], baseline=baseline, notes=notes)
    checks = result.checks
    if config.max_bubble:
        checks.append(_against_limit("bubble_ratio", "bubble ratio", measures.bubble_ratio, config.max_bubble))
    if baseline is not None:
        checks.append(
            _against_baseline(
                "baseline.bubble_ratio", "bubble ratio", measures.bubble_ratio, baseline.bubble_ratio, config.tolerance
            )
        )
    _check_step_time(result)
    for rank, ratio in sorted(measures.rank_bubble.items()):
        name = f"rank {rank} bubble ratio"
        if config.max_rank_bubble:
            checks.append(_against_limit(f"rank{rank}.bubble_ratio", name, ratio, config.max_rank_bubble))
        if baseline is not None:
            if rank in baseline.rank_bubble:
                checks.append(
                    _against_baseline(
                        f"baseline.rank{rank}.bubble_ratio", name, ratio, baseline.rank_bubble[rank], config.tolerance
                    )
                )
            else:
                result.notes.append(f"rank {rank} is not in the baseline; not compared")
    for cause, share in measures.cause_share.items():
        name = f"{cause} share of the step window"
        where = _blame(measures, cause)
        if cause in config.max_cause:
            checks.append(_against_limit(f"cause.{cause}", name, share, config.max_cause[cause], where))
        if baseline is not None and cause in baseline.cause_share:
            checks.append(
                _against_baseline(
                    f"baseline.cause.{cause}",
                    name,
                    share,
                    baseline.cause_share[cause],
                    config.tolerance_for(cause),
                    where,
                )
            )
    return result


def _check_step_time(result: GateResult) -> None:
    """The mean step window against --max-step-ms and, with --step-tolerance, the baseline's."""
    measures, config, baseline = result.measures, result.config, result.baseline
    against_baseline = baseline is not None and config.step_tolerance is not None
    if not (config.max_step_ns or against_baseline):
        return
    if measures.n_steps == 0 or measures.step_ns <= 0:
        raise TracekitError(
            f"{measures.source}: no step measured, so no step time to check; drop --max-step-ms and --step-tolerance"
        )
    name = "mean step time"
    if config.max_step_ns:
        limit = config.max_step_ns
        result.checks.append(
            Check(
                "step_time",
                name,
                measures.step_ns,
                limit.value,
                f"max {in_ms(limit.value)} ({limit.origin})",
                unit="ns",
            )
        )
    if not against_baseline:
        return
    assert baseline is not None and config.step_tolerance is not None  # against_baseline says so
    base, tolerance = baseline.step_ns, config.step_tolerance
    if base <= 0:
        raise TracekitError(
            f"baseline {config.baseline}: records no step time; remake it (tracekit baseline "
            f"RUN_DIR -o FILE) or drop the step tolerance ({tolerance.origin})"
        )
    rule = f"baseline {in_ms(base)} + {100 * tolerance.value:.1f}% ({tolerance.origin})"
    check = Check(
        "baseline.step_time", name, measures.step_ns, base * (1 + tolerance.value), rule, baseline=base, unit="ns"
    )
    change = f"{measures.step_ns / 1e6 - base / 1e6:+.1f} ms ({100 * (measures.step_ns / base - 1):+.1f}%)"
    if not check.passed:
        check.note = f"{change} over the baseline"
    elif measures.step_ns < base * (1 - tolerance.value):
        check.note = (
            f"{change}, faster than the baseline by more than the tolerance; refresh it "
            "(tracekit baseline RUN_DIR -o FILE) to keep the gain"
        )
    result.checks.append(check)


def _against_limit(check_id: str, name: str, value: float, limit: Limit, where: str = "") -> Check:
    check = Check(check_id, name, value, limit.value, f"max {pct(limit.value)} ({limit.origin})")
    if not check.passed and where:
        check.note = f"most from {where}"
    return check


def _against_baseline(check_id: str, name: str, value: float, base: float, tolerance: Limit, where: str = "") -> Check:
    source = "default tolerance" if tolerance.origin == "default" else f"tolerance from {tolerance.origin}"
    rule = f"baseline {pct(base)} + {100 * tolerance.value:.1f} points ({source})"
    check = Check(check_id, name, value, base + tolerance.value, rule, baseline=base)
    if not check.passed:
        check.note = f"{points(value - base)} over the baseline" + (f", most from {where}" if where else "")
    elif value < base - tolerance.value - _EPSILON:
        check.note = (
            f"{points(value - base)}, better than the baseline by more than the tolerance; "
            "refresh it (tracekit baseline RUN_DIR -o FILE) to keep the gain"
        )
    return check


def _blame(measures: Measures, cause: str) -> str:
    if cause == "imbalance":
        return measures.top_stage() or ""
    if cause == "comm":
        return measures.top_link() or ""
    return ""
