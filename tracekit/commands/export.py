"""``tracekit export RUN_DIR -o merged.json.gz``: every rank on one timeline, for Perfetto."""
from __future__ import annotations

from pathlib import Path

import click

from tracekit.commands.common import load_with_progress, rank_options
from tracekit.text import for_terminal


@click.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The merged trace to write; gzip-compressed when the name ends in .gz.")
@rank_options
def command(run_dir: Path, output: Path, rank_from: str | None, rank_map: str | None,
            progress: bool | None) -> None:
    """Merge a run's ranks into one Chrome trace, with the idle time drawn by cause.

    Open the file in https://ui.perfetto.dev or chrome://tracing. Each rank is a process
    with four threads: compute (the pipeline actions, named like "F s2 mb3"; click one for
    its stage, microbatch, duration and source event), bubbles (the idle time of each step
    window, as slices named by cause: warmup, drain, schedule_gaps, imbalance, comm,
    overhead), p2p (send and receive ops) and steps. Arrows run from the action that
    produced each message to the action that consumed it. All ranks share one clock, in
    time since the run's first event.

    The file is for viewing; tracekit analyze reads the original traces. It is written
    whole or not at all, and never over one of the run's own files.

    \b
    Examples:
      tracekit export run/ -o merged.json.gz
      tracekit export run/ -o /tmp/run.json       # uncompressed
    """
    from tracekit.analyze import analyze
    from tracekit.commands.outputs import run_output
    from tracekit.render.chrome_trace import encode_chrome_trace, to_chrome_trace

    target = run_output(output, "-o", run_dir)
    run = load_with_progress(run_dir, rank_from, rank_map, progress)
    document = to_chrome_trace(analyze(run))
    target.write(encode_chrome_trace(document, compressed=output.name.endswith(".gz")))
    info = document["otherData"]
    for warning in info["warnings"]:
        click.echo(f"tracekit: warning: {for_terminal(warning)}", err=True)
    counts = info["counts"]
    click.echo(target.wrote(f"{counts['ranks']} ranks, {counts['actions']} actions, {counts['flows']} message "
                            f"arrows, {counts['idle_intervals']} idle slices; open it in https://ui.perfetto.dev"),
               err=True)
