"""Console section of a split search (:mod:`tracekit.analyze.split`): the layer costs, the
recommended layer ranges per stage and the other candidates, each with its replayed bubble
and step time."""

from __future__ import annotations

from tracekit.analyze.framework_config import Advice
from tracekit.analyze.split import SplitCandidate, SplitReport, ranges
from tracekit.render.framework import config_block
from tracekit.text import for_terminal
from tracekit.vocab import in_ms


def _row(c: SplitCandidate, measured_step_ns: float) -> str:
    p = c.prediction
    role = c.role + (f" (= {', '.join(c.matches)})" if c.matches else "")
    return (
        f"    {role:28} {','.join(str(n) for n in c.split):>14}  {p.bubble_ratio:6.1%} ±{p.bubble_sd:.1%}  "
        f"{in_ms(p.step_ns):>10} ±{p.step_sd / 1e6:.1f}  {p.against(measured_step_ns):+7.1%}  "
        f"slowest stage {in_ms(c.slowest_stage_ns)}"
    )


def render_split(report: SplitReport, measured_step_ns: float, advice: Advice | None = None) -> str:
    """The split section; ``advice``: each best and each given split also in the config lines
    of the framework that ran."""
    layers = report.layers
    lines = [
        "",
        f"  stage split from per-layer costs: {layers.found()}",
        "    layer F / B ms: "
        + "  ".join(f"{c.layer}:{c.forward_ns / 1e6:.1f}/{c.backward_ns / 1e6:.1f}" for c in layers.layers),
    ]
    for search in report.searches:
        best = search.recommended
        lines += [
            "",
            f"  best split for {search.schedule} v={search.v} m={search.m}: {','.join(str(n) for n in best.split)} "
            f"-> predicted bubble {best.prediction.bubble_ratio:.1%}, step {in_ms(best.prediction.step_ns)} "
            f"({best.prediction.against(measured_step_ns):+.1%} against the measured step)",
        ]
        for stage, (text, ns) in enumerate(zip(ranges(best.split), best.stage_ns)):
            lines.append(f"    stage {stage}: layers {text:8} F+B {in_ms(ns)}")
        lines += config_block(advice, best.prediction.label, "    ")
        lines.append(f"    {'split':28} {'layers/stage':>14}  {'bubble':>13}  {'step time':>16}  {'vs meas':>7}")
        lines += [_row(c, measured_step_ns) for c in search.candidates]
    if report.given:
        lines += ["", "  given splits:"]
        for c in report.given:
            p = c.prediction
            lines.append(_row(c, measured_step_ns) + f"  [{p.schedule} v={p.v} m={p.m}: {' | '.join(ranges(c.split))}]")
            lines += config_block(advice, p.label, "      ")
    lines += ["", "  split: " + report.assumptions[0]]
    lines += [f"         {a}" for a in report.assumptions[1:]]
    return "\n".join(for_terminal(line) for line in lines)
