"""``tracekit report RUN_DIR``: load, analyse and write the self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.commands.common import TracekitCommand, load_to_draw, rank_options, work_progress


def default_name(run_dir: Path) -> str:
    """The run folder's name, or a single trace file's name without its extensions."""
    name = run_dir.resolve().name
    return (name.split(".")[0] if run_dir.is_file() else name) or "run"


@click.command("report", cls=TracekitCommand)
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
    from tracekit.render.html import render_report

    target = run_output(output or Path("reports") / f"{default_name(run_dir)}.html", "-o", run_dir)
    # The report draws a GPU rank's kernels and the host ops of a run without a pipeline:
    # the loader keeps them (every rank's working set of a small run, those ops of a large one).
    run = load_to_draw(run_dir, rank_from, rank_map, progress)
    say = work_progress(progress)
    analysis = analyze(run, whatif=True, progress=say)
    if say:
        say("rendering the report")
    data = render_report(analysis).encode()
    target.write(data)
    click.echo(target.wrote(f"{len(data) / 1e6:.1f} MB"), err=True)
