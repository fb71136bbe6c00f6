"""``tracekit diff --markdown FILE``: a comparison of two runs as GitHub-flavoured Markdown,
for a pull-request comment.

The same figures as the console: the change that matters most as the heading, then the
bubble ratio and step time of both runs, every cause's share of the step window, and
(folded, they are long) each rank's bubble ratio and the stage / link blame. Text from
outside (the runs' paths, the notes that quote them) is made inert as in
:mod:`tracekit.render.markdown`: a run path cannot become a link, an image or raw HTML.
"""

from __future__ import annotations

from tracekit.analyze.compare import Comparison
from tracekit.vocab import CAUSE_NAMES, ms, pct, points, signed_ms
from tracekit.text import for_markdown_code, for_markdown_text

# Blame rows shown (all of them are in --json), as on the console.
BLAME_ROWS = 5


def render(c: Comparison) -> str:
    """The comparison of run A with run B as one Markdown document."""
    out = [f"### tracekit diff: {_text(c.headline())}", ""]
    out += [f"> **{_text(line)}**  " for line in c.incomplete()]  # after "**": no block opens there
    if c.incomplete():
        out.append("")
    for label, m in (("A", c.a), ("B", c.b)):
        out.append(
            f"- **{label}**: {for_markdown_code(m.source)} · {_text(', '.join(m.formats))} · "
            f"{_text(m.schedule_label)} · {m.n_steps} step(s)"
        )
    out.append("")
    if c.notes:
        out += [*(f"> {for_markdown_text(note)}  " for note in c.notes), ""]
    step_rel = f" ({c.step_change_pct:+.1f}%)" if c.step_change_pct is not None else ""
    out += [
        "| | A | B | change |",
        "|---|---:|---:|---:|",
        f"| bubble ratio | {pct(c.a.bubble_ratio)} | {pct(c.b.bubble_ratio)} | {points(c.bubble_delta)} |",
        f"| step time | {ms(c.a.step_ns)} ms | {ms(c.b.step_ns)} ms | {signed_ms(c.step_delta_ns)} ms{step_rel} |",
    ]
    if c.causes:
        out += [
            "",
            "**By cause** (share of the step window), largest change first:",
            "",
            "| cause | A | B | change |",
            "|---|---:|---:|---:|",
        ]
        out += [f"| {_text(CAUSE_NAMES[ch.key])} | {pct(ch.a)} | {pct(ch.b)} | {points(ch.delta)} |" for ch in c.causes]
    if c.ranks:
        order = f", {c.rank_order()}" if c.compute_grew else ""
        out += [
            "",
            f"<details><summary>by rank (bubble ratio){order}</summary>",
            "",
            "| rank | A | B | change |"
            + (" compute/step |" if c.compute else "")
            + (" largest cause change |" if c.rank_causes else ""),
            "|---:|---:|---:|---:|" + ("---:|" if c.compute else "") + ("---|" if c.rank_causes else ""),
        ]
        for ch in c.ranks:
            row = f"| {ch.rank} | {pct(ch.a)} | {pct(ch.b)} | {points(ch.delta)} |"
            compute = c.compute_change(ch.rank) if ch.rank is not None else None
            if compute is not None:
                row += f" {signed_ms(compute.delta)} ms |"
            top = c.top_cause_change(ch.rank) if ch.rank is not None else None
            if top is not None:
                row += f" {_text(top[0])} {points(top[1])} |"
            elif c.rank_causes:
                row += " |"
            out.append(row)
        out += ["", "</details>"]
    blame = c.blame()
    if blame:
        out += [
            "",
            "<details><summary>blame (idle ms per step, summed over ranks)</summary>",
            "",
            "| stage / link | A | B | change |",
            "|---|---:|---:|---:|",
        ]
        out += [f"| {_text(ch.key)} | {ms(ch.a)} | {ms(ch.b)} | {signed_ms(ch.delta)} |" for ch in blame[:BLAME_ROWS]]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _text(text: str) -> str:
    """Inert Markdown text after other text on its line or in a table cell; ``|`` escaped
    too, so that it cannot split a cell."""
    return for_markdown_text(text, line_start=False)
