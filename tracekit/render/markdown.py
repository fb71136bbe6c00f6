"""``tracekit check --markdown FILE``: the gate result as GitHub-flavoured Markdown, for a
pull-request comment or the job summary (``$GITHUB_STEP_SUMMARY``)."""
from __future__ import annotations

from tracekit.analyze.compare import pct
from tracekit.gate.checks import GateResult


def render(result: GateResult) -> str:
    """A heading that says pass or fail, each failure's line, then every check in a table."""
    m = result.measures
    if result.passed:
        head = f"### ✅ tracekit check passed ({len(result.checks)} checks)"
    else:
        head = f"### ❌ tracekit check failed: {len(result.failures)} of {len(result.checks)} checks regressed"
    context = f"`{m.source}` · {m.schedule_label} · bubble ratio {pct(m.bubble_ratio)}"
    if result.config.baseline:
        context += f" · baseline `{result.config.baseline}`"
    out = [head, "", context, ""]
    for check in result.failures:
        out.append(f"- **{_cell(check.name)}** {pct(check.value)} > {_cell(check.rule)}"
                   + (f": {_cell(check.note)}" if check.note else ""))
    if result.failures:
        out.append("")
    out += ["<details><summary>all checks</summary>", "",
            "| check | measured | limit | rule | result |", "|---|---:|---:|---|---|"]
    for check in result.checks:
        out.append(f"| {_cell(check.name)} | {pct(check.value)} | {pct(check.limit)} | {_cell(check.rule)} | "
                   f"{'pass' if check.passed else '**FAIL**'} |")
    out += ["", "</details>"]
    if result.notes:
        out += ["", *(f"> {note}  " for note in result.notes)]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
