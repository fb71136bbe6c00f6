"""``tracekit report RUN_DIR``: load, analyse and write the self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.commands.common import load_options, load_with_progress, rank_options, work_progress

# Runs of at most this many files are read once, every rank's working set kept for the drawing;
# larger ones twice: reduced for the analysis, then the drawn ranks' files for their ops.
ONE_PASS_FILES = 32


def default_name(run_dir: Path) -> str:
    """The run folder's name, or a single trace file's name without its extensions."""
    name = run_dir.resolve().name
    return (name.split(".")[0] if run_dir.is_file() else name) or "run"


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Where to write the report (default: reports/<run folder name>.html).",
)
@rank_options
def command(
    run_dir: Path, output: Path | None, rank_from: str | None, rank_map: str | None, progress: bool | None
) -> None:
    """Write an HTML report of where a pipeline-parallel run sat idle, and why.

    One self-contained file that opens offline in any browser: what is wrong with the run
    and what to try, an interactive timeline per step (ranks as rows, actions by kind,
    messages, idle time shaded by cause, the critical path), each rank's busy and idle time
    by cause, the bubble against theory, blame per stage and per link, and the run's files,
    schedule and versions.

    \b
    Examples:
      tracekit report sample_traces/1f1b_slow_stage2
      tracekit report run/ -o out/run.html
    """
    from tracekit.analyze import analyze
    from tracekit.commands.outputs import run_output
    from tracekit.ingest import discover
    from tracekit.loading import with_drawn_ops
    from tracekit.render.html import drawn_ranks, render_report

    target = run_output(output or Path("reports") / f"{default_name(run_dir)}.html", "-o", run_dir)
    # The report draws a GPU rank's kernels and the host ops of a run without a pipeline. A
    # small run keeps every such rank's working set; a large one is analysed from its ranks'
    # reduce, and only the ranks drawn (a few replicas) are read again for their ops.
    options = load_options(rank_from, rank_map)
    small = len(discover(run_dir, options.iteration, rank_from)) <= ONE_PASS_FILES
    run = load_with_progress(run_dir, rank_from, rank_map, progress, reduce_device=not small)
    say = work_progress(progress)
    analysis = analyze(run, whatif=True, progress=say)
    if run.host_busy is not None:  # reduced ranks whose ops are drawn
        drawn = drawn_ranks(analysis)
        if say:
            say(f"reading the ops of the {len(drawn)} rank(s) drawn")
        with_drawn_ops(run, run_dir, options, drawn)
    if say:
        say("rendering the report")
    data = render_report(analysis).encode()
    target.write(data)
    click.echo(target.wrote(f"{len(data) / 1e6:.1f} MB"), err=True)
