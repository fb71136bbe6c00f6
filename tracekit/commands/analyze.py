"""``tracekit analyze RUN_DIR``: load, reconstruct, measure, attribute, print."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracekit.errors import TracekitError
from tracekit.commands.common import (
    TracekitCommand,
    cached_document,
    load_to_draw,
    load_with_progress,
    rank_options,
    remember_document,
    work_progress,
)


@click.command("analyze", cls=TracekitCommand)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the analysis as JSON (schema: tracekit/schemas/analysis.schema.json).",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the JSON document to this file.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Also write the HTML report to this file.")
@click.option("--no-attribution", is_flag=True, help="Skip the replay-based attribution (measure bubbles only).")
@click.option(
    "--ranks",
    "ranks_shown",
    metavar="all|N",
    help="Rank rows on the console: 'all' for every rank, N for the N worst. Default: every rank of a "
    "small pipeline; with data-parallel replicas or over 16 ranks, one row per stage over the replicas "
    "and the 8 worst ranks.",
)
@rank_options
def command(
    run_dir: Path,
    as_json: bool,
    output: Path | None,
    html_path: Path | None,
    no_attribution: bool,
    ranks_shown: str | None,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool,
) -> None:
    """Where and why a pipeline-parallel run sat idle.

    RUN_DIR is a folder of per-rank traces (PyTorch profiler *.json / *.json.gz, Nsight
    Systems *.sqlite or *.nsys-rep; mixed is fine; in subfolders such as torchtitan's
    profiling/traces/iteration_N/, the highest iteration unless --iteration N) or a single
    trace file. Other files there are skipped with a warning. tracekit finds each rank's
    compute actions and messages, recognises the schedule (GPipe, 1F1B, interleaved,
    zero-bubble, DualPipeV) with its p, v, m, and measures each rank's bubble ratio: idle
    time over the step window (first compute start to last compute end, all ranks).

    Every idle nanosecond is then attributed to a cause by replaying the step's dependency
    graph with one cause removed at a time (exact Shapley values, so order does not matter):

    \b
      warmup / drain   the pipeline filling and emptying (what the schedule forces)
      gaps             steady-state holes of interleaved / zero-bubble schedules
      imbalance        some stage is slower than the others (blamed on the stage)
      comm             messages take time or leave late (blamed on the link src->dst)
      overhead         data was there and the rank was free, yet nothing ran

    \b
    Examples:
      tracekit analyze sample_traces/1f1b
      tracekit analyze run/ --json > analysis.json
      tracekit analyze run/ -o analysis.json --html report.html
    """
    from tracekit.commands.outputs import distinct, run_output
    from tracekit.render.protocol import RENDERERS, bytes_of, text_of

    shown = _ranks_shown(ranks_shown)
    json_target = run_output(output, "-o", run_dir) if output else None
    html_target = run_output(html_path, "--html", run_dir) if html_path else None
    distinct(json_target, html_target)
    options = {"rank_from": rank_from, "rank_map": rank_map, "attribution": not no_attribution}
    # An unchanged run with the same options is answered from the stored document.
    doc = None if html_path else cached_document(run_dir, options)
    if doc is None:
        # Load first: parser processes fork from this one before pandas is imported. The HTML
        # page draws ops (a GPU rank's kernels): loaded as the report loads them.
        load = load_to_draw if html_target else load_with_progress
        run = load(run_dir, rank_from, rank_map, progress)
        from tracekit.analyze import analyze
        from tracekit.render.json import to_document

        say = work_progress(progress)
        analysis = analyze(run, attribution=not no_attribution, whatif=html_target is not None, progress=say)
        doc = to_document(analysis)
        remember_document(run_dir, options, doc)
    as_text = RENDERERS["json"]()
    if json_target:
        json_target.write(bytes_of(as_text.render(doc)))
        click.echo(json_target.wrote(), err=True)
    if html_target:
        html_target.write(bytes_of(RENDERERS["html"]().render(analysis)))
        click.echo(html_target.wrote(), err=True)
    if as_json:
        sys.stdout.write(text_of(as_text.render(doc)) + "\n")
    else:
        click.echo(RENDERERS["console"](ranks=shown).render(doc))


def _ranks_shown(value: str | None) -> str | int:
    """--ranks as the console takes it: "auto", "all" or a count of worst ranks."""
    if value is None:
        return "auto"
    if value.strip().lower() == "all":
        return "all"
    if value.strip().isdigit() and int(value) > 0:
        return int(value)
    raise TracekitError(f"--ranks: expected 'all' or a number of ranks (such as 20), got {value!r}")
