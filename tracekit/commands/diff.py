"""``tracekit diff RUN_A RUN_B``: what changed between two runs, the change that matters most first."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracekit.commands.common import TracekitCommand, load_with_progress, rank_options
from tracekit.errors import TracekitError

if TYPE_CHECKING:
    from tracekit.analyze.compare import Comparison

# Blame rows shown on the console (all of them are in --json).
_BLAME_ROWS = 5


@click.command("diff", cls=TracekitCommand)
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--markdown",
    "markdown_path",
    metavar="FILE",
    help="Also write the comparison as Markdown (for a pull-request comment) to FILE; "
    "- prints it instead of the console text.",
)
@rank_options
def command(
    run_a: Path,
    run_b: Path,
    as_json: bool,
    markdown_path: str | None,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
) -> None:
    """What changed from RUN_A to RUN_B, per cause and per rank, largest change first.

    Both runs are analysed as tracekit analyze does. The first line names the change that
    matters most: the cause whose share of the step window moved most, with the rank,
    stage or link that carries it. Then the bubble ratio and step time, every cause's
    share of the step window, every rank's bubble ratio and the stage / link blame, each
    list sorted by the size of the change; a rank whose own compute grew leads the ranks
    (the others wait on it).

    The runs may come from different formats (PyTorch profiler, Nsight Systems) and even
    different schedules or pipeline sizes: shares of the step window compare across
    them (tracekit says when the schedules differ); per-rank figures need the same
    ranks, per-stage blame the same schedule.

    \b
    Examples:
      tracekit diff runs/before runs/after
      tracekit diff runs/1f1b runs/interleaved --json > diff.json
      tracekit diff runs/main runs/pr-123 --markdown - > comment.md
    """
    from tracekit.analyze import analyze
    from tracekit.analyze.compare import compare, measure
    from tracekit.commands.outputs import run_output
    from tracekit.render import diff_markdown

    to_stdout = markdown_path == "-"
    if to_stdout and as_json:
        raise TracekitError("--json and --markdown - both print to stdout; give --markdown a file name")
    markdown_target = None
    if markdown_path and not to_stdout:
        # checked against both runs' files before either is loaded
        markdown_target = [run_output(Path(markdown_path), "--markdown", run) for run in (run_a, run_b)][-1]

    measures = [measure(analyze(load_with_progress(path, rank_from, rank_map, progress))) for path in (run_a, run_b)]
    comparison = compare(*measures)
    if markdown_target:
        markdown_target.write(diff_markdown.render(comparison).encode())
        click.echo(markdown_target.wrote(), err=True)
    if as_json:
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=1) + "\n")
    elif to_stdout:
        sys.stdout.write(diff_markdown.render(comparison))
    else:
        click.echo(_console(comparison))


def _console(c: Comparison) -> str:
    from tracekit.render.console import table
    from tracekit.text import for_terminal
    from tracekit.vocab import CAUSE_NAMES, ms, pct, points, signed_ms

    out = [*(for_terminal(line) for line in c.incomplete()), c.headline(), ""]
    for label, m in (("A", c.a), ("B", c.b)):
        out.append(
            f"  {label}: {for_terminal(m.source)}  ({', '.join(m.formats)}; {m.schedule_label}; {m.n_steps} step(s))"
        )
    out += [f"  note: {for_terminal(n)}" for n in c.notes]
    step_rel = f", {c.step_change_pct:+.1f}%" if c.step_change_pct is not None else ""
    out += [
        "",
        f"bubble ratio  {pct(c.a.bubble_ratio)} -> {pct(c.b.bubble_ratio)}  ({points(c.bubble_delta)})",
        f"step time     {ms(c.a.step_ns)} ms -> {ms(c.b.step_ns)} ms  ({signed_ms(c.step_delta_ns)} ms{step_rel})",
    ]
    if c.causes:
        rows = [[CAUSE_NAMES[ch.key], pct(ch.a), pct(ch.b), points(ch.delta)] for ch in c.causes]
        out += [
            "",
            "by cause (share of the step window), largest change first:",
            table(["cause", "A", "B", "change"], rows),
        ]
    if c.ranks:
        headers = ["rank", "A", "B", "change"] + (["compute/step"] if c.compute else [])
        headers += ["largest cause change"] if c.rank_causes else []
        rows = []
        for ch in c.ranks:
            assert ch.rank is not None  # a rank's change names it
            row = [str(ch.rank), pct(ch.a), pct(ch.b), points(ch.delta)]
            compute = c.compute_change(ch.rank)
            if compute is not None:
                row.append(f"{signed_ms(compute.delta)} ms")
            top = c.top_cause_change(ch.rank)
            if top is not None:
                row.append(f"{top[0]} {points(top[1])}")
            rows.append(row)
        out += ["", f"by rank (bubble ratio), {c.rank_order()}:", table(headers, rows)]
    blame = c.blame()
    if blame:
        rows = [[ch.key, ms(ch.a), ms(ch.b), signed_ms(ch.delta)] for ch in blame[:_BLAME_ROWS]]
        out += [
            "",
            "blame (idle ms per step, summed over ranks), largest change first:",
            table(["stage / link", "A", "B", "change"], rows),
        ]
    return "\n".join(out)
