"""Console table of a what-if (:mod:`tracekit.analyze.whatif`)."""

from __future__ import annotations

from tracekit.text import for_terminal
from tracekit.version import __version__


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def render(result) -> str:
    m = result.model
    lines = [
        f"tracekit {__version__} what-if: {result.source}",
        f"  measured: {m.schedule} p={m.p} v={m.v} m={m.m}, {len(m.graphs)} step(s), "
        f"{m.n_actions} actions, {m.n_messages} messages",
        "",
        f"  {'':34} {'bubble':>15} {'step time':>20} {'vs measured':>12} {'theory':>8}",
    ]

    def row(label: str, bubble: str, step: str, change: str, theory: str) -> str:
        return f"  {label:34} {bubble:>15} {step:>20} {change:>12} {theory:>8}"

    lines.append(row("measured", f"{result.measured_bubble:.1%}", _ms(result.measured_step_ns), "", ""))
    model = result.as_measured
    lines.append(
        row(
            "model of the measured run",
            f"{model.bubble_ratio:.1%} ±{model.bubble_sd:.1%}",
            f"{_ms(model.step_ns)} ±{model.step_sd / 1e6:.1f}",
            f"{model.step_ns / result.measured_step_ns - 1:+.1%}",
            "",
        )
    )
    lines.append("")
    for p in result.predictions:
        theory = "" if p.theory is None else f"{p.theory:.1%}"
        lines.append(
            row(
                p.label,
                f"{p.bubble_ratio:.1%} ±{p.bubble_sd:.1%}",
                f"{_ms(p.step_ns)} ±{p.step_sd / 1e6:.1f}",
                f"{p.step_ns / result.measured_step_ns - 1:+.1%}",
                theory,
            )
        )
    if result.predictions and result.keep == "global-batch":
        best = min(result.predictions, key=lambda p: p.step_ns)
        lines += [
            "",
            f"  fastest step: {best.label}, {_ms(best.step_ns)} "
            f"({best.step_ns / result.measured_step_ns - 1:+.1%} against the measured step)",
        ]
    elif result.predictions:  # microbatches keep their size: compare time per microbatch
        best = min(result.predictions, key=lambda p: p.step_ns / p.m)
        per_mb = result.measured_step_ns / m.m
        lines += [
            "",
            f"  most microbatches per second: {best.label}, {_ms(best.step_ns / best.m)} a microbatch "
            f"({best.step_ns / best.m / per_mb - 1:+.1%} against the measured {_ms(per_mb)})",
        ]
    for reason in dict.fromkeys(result.skipped):
        lines.append(f"  skipped: {reason}")
    lines += ["", "  how: " + result.assumptions[0]]
    lines += [f"       {a}" for a in result.assumptions[1:]]
    lines.append("       the model's own error is the 'model of the measured run' row against 'measured'")
    # Each entry is one line; the run's path and the reasons a target was skipped quote
    # names from the traces, which must reach the terminal inert.
    return "\n".join(for_terminal(line) for line in lines)
