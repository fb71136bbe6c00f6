"""``tracekit baseline RUN_DIR -o FILE``: keep a run's bubble ratios for ``tracekit check``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracekit.commands.common import TracekitCommand, load_with_progress, rank_options


@click.command("baseline", cls=TracekitCommand)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="The baseline file to write (JSON), e.g. baselines/train.json.",
)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Record a run with ranks missing, on the ranks present (default: refuse it, exit 2).",
)
@rank_options
def command(
    run_dir: Path,
    output: Path,
    allow_incomplete: bool,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
) -> None:
    """Record a good run's bubble ratios as the baseline later runs are checked against.

    The file (JSON) holds the run's bubble ratio, each rank's, and each cause's share of
    the step window ({causes}), its mean
    step time, with the schedule (name, p, v, m) and the tracekit and schema versions.
    Commit it; then tracekit check NEW_RUN --baseline FILE fails when NEW_RUN is worse by
    more than the tolerance (the step time too, with --step-tolerance), and refuses a run
    of another schedule.

    \b
    Examples:
      tracekit baseline runs/nightly -o baselines/nightly.json
      tracekit check runs/pr-123 --baseline baselines/nightly.json --tolerance 0.05
    """
    from tracekit.analyze import analyze
    from tracekit.analyze.compare import measure
    from tracekit.vocab import pct
    from tracekit.commands.outputs import run_output
    from tracekit.gate.baseline import to_document
    from tracekit.gate.checks import refuse_incomplete

    target = run_output(output, "-o", run_dir)
    run = load_with_progress(run_dir, rank_from, rank_map, progress)
    measures = measure(analyze(run))
    if not allow_incomplete:
        refuse_incomplete(measures, "baseline")
    target.write((json.dumps(to_document(measures), indent=1) + "\n").encode())
    causes = "per-cause shares" if measures.cause_share else "no per-cause shares (not a pipeline run)"
    click.echo(
        target.wrote(
            f"{measures.schedule_label}, bubble ratio {pct(measures.bubble_ratio)}, "
            f"{len(measures.rank_bubble)} ranks, {causes}"
        ),
        err=True,
    )
