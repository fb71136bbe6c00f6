"""Console table of a what-if (:mod:`tracekit.analyze.whatif`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit.render.framework import config_block, framework_line
from tracekit.text import for_terminal
from tracekit.vocab import format_bytes, in_ms
from tracekit.version import __version__

if TYPE_CHECKING:
    from tracekit.analyze.framework_config import Advice
    from tracekit.analyze.recompute_memory import RecomputeMemory
    from tracekit.analyze.whatif import Prediction, Search, WhatIf


def render(result: WhatIf, advice: Advice | None = None) -> str:
    """The what-if table; ``advice`` (tracekit.analyze.framework_config.Advice): the fastest
    row also in its framework's config lines."""
    if result.search is not None:
        return render_search(result, result.search, advice)
    m = result.model
    # the activations column only where they are sized (a profile_memory trace, --activation-bytes)
    sized = result.activation is not None
    lines = [
        f"tracekit {__version__} what-if: {result.source}",
        f"  measured: {m.schedule} p={m.p} v={m.v} m={m.m}, {len(m.graphs)} step(s), "
        f"{m.n_actions} actions, {m.n_messages} messages",
        *framework_line(advice),
        *memory_header(result),
        "",
        f"  {'':34} {'bubble':>15} {'step time':>20} {'vs measured':>12} {'theory':>8}"
        + (f" {'activations':>12}" if sized else ""),
    ]

    def row(label: str, bubble: str, step: str, change: str, theory: str, p: Prediction | None = None) -> str:
        text = f"  {label:34} {bubble:>15} {step:>20} {change:>12} {theory:>8}"
        if sized and p is not None:
            text += f" {'' if p.activation_bytes is None else format_bytes(p.activation_bytes):>12}"
            text += "  over budget" if p.over_budget else ""
        return text

    lines.append(row("measured", f"{result.measured_bubble:.1%}", in_ms(result.measured_step_ns), "", ""))
    model = result.as_measured
    lines.append(
        row(
            "model of the measured run",
            f"{model.bubble_ratio:.1%} ±{model.bubble_sd:.1%}",
            f"{in_ms(model.step_ns)} ±{model.step_sd / 1e6:.1f}",
            f"{model.against(result.measured_step_ns):+.1%}",
            "",
            model,
        )
    )
    lines.append("")
    for p in result.predictions:
        theory = "" if p.theory is None else f"{p.theory:.1%}"
        lines.append(
            row(
                p.label,
                f"{p.bubble_ratio:.1%} ±{p.bubble_sd:.1%}",
                f"{in_ms(p.step_ns)} ±{p.step_sd / 1e6:.1f}",
                f"{p.against(result.measured_step_ns):+.1%}",
                theory,
                p,
            )
        )
    best = result.fastest
    if best is None and result.memory_budget is not None and result.fastest_of_all is not None:
        lines += ["", f"  nothing fits the memory budget {format_bytes(result.memory_budget)}: every row is over it"]
    if best is not None and result.keep == "global-batch":
        lines += [
            "",
            f"  fastest step (--keep global-batch): {best.label}, {in_ms(best.step_ns)} "
            f"({best.against(result.measured_step_ns):+.1%} against the measured step)",
        ]
    elif best is not None:  # microbatches keep their size: compare time per microbatch
        lines += [
            "",
            f"  most microbatches per second (--keep microbatch): {best.label}, {in_ms(best.microbatch_ns)} a microbatch "
            f"({result.microbatch_against(best):+.1%} against the measured {in_ms(result.measured_microbatch_ns)})",
        ]
    first = result.fastest_of_all
    if best is not None and first is not None and first is not best:
        lines.append(
            f"  (fastest of all, {first.label} at {in_ms(first.step_ns)}, needs "
            f"{format_bytes(first.activation_bytes or 0)}: over the memory budget)"
        )
    if best is not None:
        lines += config_block(advice, best.label)
        if advice is not None and advice.configs and not advice.runs(best.label):
            lines += _fastest_runnable(result, advice)
    if result.recompute_memory is not None:
        lines += recompute_memory_lines(result.recompute_memory)
    for reason in dict.fromkeys(result.skipped):
        lines.append(f"  skipped: {reason}")
    lines += ["", "  how: " + result.assumptions[0]]
    lines += [f"       {a}" for a in result.assumptions[1:]]
    lines.append("       the model's own error is the 'model of the measured run' row against 'measured'")
    # Each entry is one line; the run's path and the reasons a target was skipped quote
    # names from the traces, which must reach the terminal inert.
    return "\n".join(for_terminal(line) for line in lines)


def memory_header(result: WhatIf) -> list[str]:
    """Where the rows' activations were sized from, and the budget (none: no line)."""
    size = result.activation
    if size is None:
        return []
    budget = "" if result.memory_budget is None else f"; budget {format_bytes(result.memory_budget)} per rank"
    return [
        f"  activations: peak (stage, microbatch) pairs in flight on the fullest rank x one microbatch on one "
        f"rank's layers, {format_bytes(size.bytes_per_microbatch)} from {size.source}{budget}"
    ]


def recompute_memory_lines(memory: RecomputeMemory) -> list[str]:
    """``whatif --no-recompute``: each rank's activation memory with recomputation on (as
    measured) and off (:mod:`tracekit.analyze.recompute_memory`), and how it was sized."""

    def size(n: int | None) -> str:
        return "?" if n is None else format_bytes(n)

    lines = [
        "",
        "  activation memory per rank, recomputation on (as measured) and off:",
        f"  {'rank':>6} {'stages':>8} {'in flight':>10} {'on /mb':>10} {'off /mb':>10} "
        f"{'peak on':>10} {'peak off':>10} {'saved':>10}",
    ]
    for r in memory.ranks:
        row = r.to_dict()
        lines.append(
            f"  {r.rank:>6} {','.join(map(str, r.stages)):>8} {r.in_flight:>10} "
            f"{size(r.kept_per_microbatch_bytes):>10} {size(r.activations_per_microbatch_bytes):>10} "
            f"{size(row['peak_recompute_on_bytes']):>10} {size(row['peak_recompute_off_bytes']):>10} "
            f"{size(row['saved_bytes']):>10}"
        )
    lines.append(f"  sized from {memory.source}")  # one line, as the assumptions are
    if memory.unsized:
        lines.append(f"  not sized (?): {memory.unsized}")
    return lines


def _fastest_runnable(result: WhatIf, advice: Advice) -> list[str]:
    """Where the framework cannot run the fastest row: the fastest it can, in its lines."""
    title = advice.framework.title
    best = result.fastest_where(advice.runs)
    if best is None:
        return [f"  {title} runs none of these rows"]
    return [
        f"  fastest step {title} runs: {best.label}, {in_ms(best.step_ns)} "
        f"({best.against(result.measured_step_ns):+.1%} against the measured step)",
        *config_block(advice, best.label),
    ]


def render_search(result: WhatIf, found: Search, advice: Advice | None = None) -> str:
    """``whatif --search``: every replayed (schedule, v, m) with its activation memory, the
    fastest that fits (also in its framework's config lines, with ``advice``), and per
    (schedule, v) the fastest m that fits."""
    m = result.model
    per_mb = found.objective == "time per microbatch"
    lines = [
        f"tracekit {__version__} what-if search: {result.source}",
        f"  measured: {m.schedule} p={m.p} v={m.v} m={m.m}, {len(m.graphs)} step(s), "
        f"{m.n_actions} actions, {m.n_messages} messages",
        f"  memory budget: {format_bytes(found.budget_bytes)} of activations per rank; one microbatch on one "
        f"rank's layers: {format_bytes(found.activation.bytes_per_microbatch)} from {found.activation.source}",
        f"  fastest by {found.objective} (--keep {result.keep}; see how: below)",
        *framework_line(advice),
        "",
        f"  {'':30} {'bubble':>14} {'step time':>18} {'vs meas.':>9} {'msgs/step':>9} {'in flight':>9} "
        f"{'activations':>12}",
    ]

    def row(p: Prediction, mark: str = "") -> str:
        act = "" if p.activation_bytes is None else format_bytes(p.activation_bytes)
        flight = "" if p.in_flight is None else str(p.in_flight)
        msgs = "" if p.messages_per_step is None else str(p.messages_per_step)
        return (
            f"  {p.label:30} {f'{p.bubble_ratio:.1%} ±{p.bubble_sd:.1%}':>14} "
            f"{f'{in_ms(p.step_ns)} ±{p.step_sd / 1e6:.1f}':>18} {p.against(result.measured_step_ns):>+9.1%} "
            f"{msgs:>9} {flight:>9} {act:>12}{mark}"
        )

    lines.append(f"  {'measured':30} {result.measured_bubble:>14.1%} {in_ms(result.measured_step_ns):>18}")

    def mark(p: Prediction) -> str:
        return "  over budget" if found.over_budget(p) else ""

    lines.append(row(result.as_measured, mark(result.as_measured)))
    lines.append("")
    for p in result.predictions:
        lines.append(row(p, mark(p)))
    lines += ["", f"  per v (the fastest m that fits; median message latency {in_ms(found.message_latency_ns)}):"]
    for p in found.per_v:
        fits = found.fits(p)
        cost = f"{in_ms(found.cost(p))} a microbatch" if per_mb else f"step {in_ms(p.step_ns)}"
        lines.append(
            f"    {p.schedule} v={p.v}: m={p.m}, bubble {p.bubble_ratio:.1%}, {p.messages_per_step} messages a step, "
            f"{cost}" + ("" if fits else f", needs {format_bytes(p.activation_bytes or 0)}: nothing fits")
        )
    lines.append("")
    if found.best is None:
        lines.append(f"  nothing fits {format_bytes(found.budget_bytes)}: every row above is over the budget")
    else:
        best = found.best
        fastest = found.fastest
        lines.append(
            f"  fastest under the budget: {best.label}, {in_ms(best.step_ns)} a step "
            f"({best.against(result.measured_step_ns):+.1%} against the measured step), "
            f"{format_bytes(best.activation_bytes or 0)} of activations"
        )
        if fastest is not None and fastest is not best:
            lines.append(
                f"  (fastest of all, {fastest.label} at {in_ms(fastest.step_ns)}, needs "
                f"{format_bytes(fastest.activation_bytes or 0)})"
            )
        lines += config_block(advice, best.label)
    for reason in dict.fromkeys(result.skipped):
        lines.append(f"  skipped: {reason}")
    lines += ["", "  how: " + result.assumptions[0]]
    lines += [f"       {a}" for a in result.assumptions[1:]]
    return "\n".join(for_terminal(line) for line in lines)
