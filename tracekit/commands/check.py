"""``tracekit check RUN_DIR``: exit 1 when the run's bubbles break a limit or regress from a baseline."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from tracekit.commands.common import TracekitCommand, load_with_progress, rank_options
from tracekit.errors import TracekitError
from tracekit.text import for_terminal


@click.command("check", cls=TracekitCommand)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--max-bubble", metavar="SHARE", help="Fail when the run's bubble ratio is above SHARE (e.g. 0.35).")
@click.option("--max-rank-bubble", metavar="SHARE", help="Fail when any rank's bubble ratio is above SHARE.")
@click.option(
    "--max-cause",
    metavar="CAUSE=SHARE",
    multiple=True,
    help="Fail when a cause's share of the step window is above SHARE, e.g. comm=0.10. Repeatable.",
)
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    help="Fail when the run is worse than this baseline file (from tracekit baseline) by more than the tolerance.",
)
@click.option(
    "--tolerance",
    metavar="POINTS",
    help="How far above the baseline a ratio may go, absolute (0.02 = 2 points; default 0.02).",
)
@click.option(
    "--cause-tolerance",
    metavar="CAUSE=POINTS",
    multiple=True,
    help="The tolerance for one cause, e.g. overhead=0.05. Repeatable.",
)
@click.option(
    "--max-step-ms",
    metavar="MS",
    help="Fail when the mean step time (the step window, slowest rank) is above MS milliseconds.",
)
@click.option(
    "--step-tolerance",
    metavar="PCT",
    help="With --baseline: fail when the mean step time is above the baseline's by more than PCT, "
    "relative (5% or 0.05). Default: step time not compared with the baseline.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="Read [tool.tracekit.check] from this file instead of the closest pyproject.toml.",
)
@click.option("--no-config", is_flag=True, help="Ignore [tool.tracekit.check] in pyproject.toml.")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    help="Also write JUnit XML (one test case per check) to this file.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(path_type=Path),
    help="Also write a Markdown summary (for a PR comment) to this file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (failure lines go to stderr).")
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Check a run with ranks missing on the ranks present (default: refuse it, exit 2).",
)
@rank_options
def command(
    run_dir: Path,
    max_bubble: str | None,
    max_rank_bubble: str | None,
    max_cause: tuple[str, ...],
    baseline: Path | None,
    tolerance: str | None,
    cause_tolerance: tuple[str, ...],
    max_step_ms: str | None,
    step_tolerance: str | None,
    config_file: Path | None,
    no_config: bool,
    junit_path: Path | None,
    markdown_path: Path | None,
    as_json: bool,
    allow_incomplete: bool,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
) -> None:
    """Fail a CI build when a pipeline's bubbles regress.

    Measures RUN_DIR as tracekit analyze does, then holds it to limits (a ratio is idle
    time over the step window; a cause's share is its idle over the window, so the
    shares add up to the bubble ratio) and/or to a baseline file made with tracekit
    baseline, within a tolerance in absolute points. Limits come from the flags and from
    [tool.tracekit.check] in the closest pyproject.toml (flags win):

    \b
      [tool.tracekit.check]
      max-bubble = 0.35
      baseline = "baselines/train.json"
      tolerance = 0.05
      max-step-ms = 520          # mean step time, milliseconds
      step-tolerance = "10%"     # step time vs the baseline's, relative
      [tool.tracekit.check.max-cause]
      comm = 0.10

    Causes: {causes}.

    Step time is compared with a baseline only with --step-tolerance: it depends on the
    GPU and the node's load, which the baseline does not record.

    \b
    Exit status: 0 every check passed, 1 a check failed (one line per failure says
    which and by how much), 2 the input or the options are unusable (no such run, bad
    baseline file, baseline of another schedule, a rank's trace missing without
    --allow-incomplete, an output file that cannot be written).
    If $GITHUB_STEP_SUMMARY is set, the Markdown summary is appended to it.

    \b
    Examples:
      tracekit check run/ --max-bubble 0.35 --max-cause comm=0.10
      tracekit baseline run/ -o baselines/train.json      # once, on a good run
      tracekit check run/ --baseline baselines/train.json --tolerance 0.05 --junit check.xml
      tracekit check run/ --baseline baselines/train.json --step-tolerance 10% --max-step-ms 600
    """
    from tracekit.analyze import analyze
    from tracekit.analyze.compare import measure
    from tracekit.commands.outputs import distinct, run_output
    from tracekit.gate import evaluate, find_config, load_config, with_flags
    from tracekit.gate.baseline import read_baseline
    from tracekit.gate.checks import GateResult
    from tracekit.gate.config import CheckConfig
    from tracekit.render.protocol import RENDERERS, bytes_of, text_of

    if config_file and no_config:
        raise TracekitError("--config and --no-config contradict each other; give one")
    found = None if no_config else (config_file or find_config(Path.cwd()))
    config = with_flags(
        load_config(found) if found else CheckConfig(),
        max_bubble=max_bubble,
        max_rank_bubble=max_rank_bubble,
        max_cause=max_cause,
        baseline=baseline,
        tolerance=tolerance,
        cause_tolerance=cause_tolerance,
        allow_incomplete=allow_incomplete,
        max_step_ms=max_step_ms,
        step_tolerance=step_tolerance,
    )
    # every usage error before the (slow) load
    config.require_checks()
    baseline_measures = read_baseline(config.baseline) if config.baseline else None
    # the files this check reads are inputs too
    inputs = {
        path: what
        for path, what in (
            (config.baseline, "the baseline this check reads"),
            (found, "the configuration this check reads"),
        )
        if path
    }
    junit_target = run_output(junit_path, "--junit", run_dir, inputs) if junit_path else None
    markdown_target = run_output(markdown_path, "--markdown", run_dir, inputs) if markdown_path else None
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    summary_target = run_output(summary_path, "$GITHUB_STEP_SUMMARY", run_dir, inputs) if summary_path else None
    distinct(junit_target, markdown_target, summary_target)

    run = load_with_progress(run_dir, rank_from, rank_map, progress)
    result: GateResult = evaluate(measure(analyze(run)), config, baseline_measures)

    if junit_target:
        junit_target.write(bytes_of(RENDERERS["junit"]().render(result)))
        click.echo(junit_target.wrote(), err=True)
    text = text_of(RENDERERS["markdown"]().render(result))
    if markdown_target:
        markdown_target.write(text.encode())
        click.echo(markdown_target.wrote(), err=True)
    if summary_target:
        # GitHub Actions shows what a step appends to $GITHUB_STEP_SUMMARY on the run's page.
        summary_target.append((text + "\n").encode())
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        for check in result.failures:
            click.echo(for_terminal(check.line()), err=True)
    else:
        click.echo(for_terminal(result.summary()))
        for line in result.lines():
            click.echo(f"  {for_terminal(line)}")
    sys.exit(result.exit_code)
