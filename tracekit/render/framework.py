"""Console lines of a recommendation in its framework's words (:mod:`tracekit.analyze.framework_config`)."""

from __future__ import annotations

from tracekit.analyze.framework_config import Advice


def framework_line(advice: Advice | None) -> list[str]:
    """The header line naming the framework and what says so (nothing without advice)."""
    return [] if advice is None else [f"  framework: {advice.framework.line()}"]


def config_block(advice: Advice | None, label: str, indent: str = "  ") -> list[str]:
    """The config lines of the recommendation ``label``, each on its own line to paste, then
    what the framework's flags cannot express; nothing where there is no advice for it."""
    config = None if advice is None else advice.for_label(label)
    if config is None:
        return []
    out = [f"{indent}as {config.title} config:"]
    for line in config.lines:
        out.append(f"{indent}  {line.text}")
        if line.note:
            out.append(f"{indent}    ({line.note})")
    out += [f"{indent}  ({note})" for note in config.notes]
    out += [f"{indent}  cannot: {reason}" for reason in config.cannot]
    return out
