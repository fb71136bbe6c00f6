"""``tracekit check --markdown FILE``: the gate result as GitHub-flavoured Markdown, for a
pull-request comment or the job summary (``$GITHUB_STEP_SUMMARY``).

Text from outside (the run's path, the baseline's, a config file's name in a rule) is made
inert on the way in: a code span that no backtick inside can close, or text with each
character escaped that could start Markdown or HTML where it stands, so that a name cannot
become a link, an image or raw HTML.
"""

from __future__ import annotations

from tracekit.vocab import pct
from tracekit.gate.checks import GateResult
from tracekit.text import for_markdown_code, for_markdown_text


def render(result: GateResult) -> str:
    """A heading that says pass or fail, each failure's line, then every check in a table."""
    m = result.measures
    if result.passed:
        head = f"### ✅ tracekit check passed ({len(result.checks)} checks)"
    else:
        head = f"### ❌ tracekit check failed: {len(result.failures)} of {len(result.checks)} checks regressed"
    context = f"{for_markdown_code(m.source)} · {m.schedule_label} · bubble ratio {pct(m.bubble_ratio)}"
    if m.n_steps:
        context += f" · step {m.step_ns / 1e6:.1f} ms"
    if result.config.baseline:
        context += f" · baseline {for_markdown_code(str(result.config.baseline))}"
    out = [head, "", context, ""]
    for check in result.failures:
        out.append(
            f"- **{_cell(check.name)}** {check.shown(check.value)} > {_cell(check.rule)}"
            + (f": {_cell(check.note)}" if check.note else "")
        )
    if result.failures:
        out.append("")
    out += [
        "<details><summary>all checks</summary>",
        "",
        "| check | measured | limit | rule | result |",
        "|---|---:|---:|---|---|",
    ]
    for check in result.checks:
        out.append(
            f"| {_cell(check.name)} | {check.shown(check.value)} | {check.shown(check.limit)} | {_cell(check.rule)} | "
            f"{'pass' if check.passed else '**FAIL**'} |"
        )
    out += ["", "</details>"]
    if result.notes:
        out += ["", *(f"> {for_markdown_text(note)}  " for note in result.notes)]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """Text for a table cell or after other text on a line: inert, and with ``|`` escaped it
    cannot split a cell."""
    return for_markdown_text(text, line_start=False)
