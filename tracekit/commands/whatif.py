"""``tracekit whatif RUN_DIR``: predict another schedule, v or m by replaying measured costs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tracekit.commands.common import load_with_progress, rank_options, work_progress

SCHEDULE_CHOICES = ["GPipe", "1F1B", "Interleaved1F1B"]


@click.command("whatif")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-s",
    "--schedule",
    "schedules",
    multiple=True,
    type=click.Choice(SCHEDULE_CHOICES),
    help="A schedule to predict (repeat for several). Default: all three.",
)
@click.option(
    "-v",
    "--chunks",
    "vs",
    multiple=True,
    type=int,
    metavar="V",
    help="Chunks (stages) per rank for Interleaved1F1B (repeatable). Default: the measured v, or 2.",
)
@click.option(
    "-m",
    "--microbatches",
    "ms",
    multiple=True,
    type=int,
    metavar="M",
    help="Microbatches per step (repeatable). Default: the measured m and twice it.",
)
@click.option(
    "--keep",
    type=click.Choice(["global-batch", "microbatch"]),
    default="global-batch",
    show_default=True,
    help="What stays fixed when m changes: the samples per step (a microbatch's compute "
    "scales with measured m / new m) or the microbatch size (the step does more work).",
)
@click.option(
    "--balanced",
    is_flag=True,
    help="Also predict each schedule with the layers re-split so every rank computes the same "
    "(the run's total compute kept): what a better stage split would buy.",
)
@click.option(
    "--replays",
    type=click.IntRange(4, 10_000),
    default=32,
    show_default=True,
    help="Replays per prediction, each with freshly drawn costs (mean and spread reported).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draws (same seed, same answer).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the predictions as JSON (schema: tracekit/schemas/whatif.schema.json).",
)
@rank_options
def command(
    run_dir: Path,
    schedules: tuple[str, ...],
    vs: tuple[int, ...],
    ms: tuple[int, ...],
    keep: str,
    balanced: bool,
    replays: int,
    seed: int,
    as_json: bool,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
) -> None:
    """What if this run used another schedule, more chunks per rank or more microbatches?

    tracekit takes the run's measured costs (each rank's compute per microbatch, each
    action's host overhead, each link's message latency: samples, not averages), generates
    the per-rank order of the schedule you ask for, and replays the step's dependency graph
    many times with costs drawn from those samples. It prints the predicted bubble ratio and
    step time with their spread, the closed-form bubble, and the model's own error: the
    measured order replayed the same way, next to what was measured.

    Ranks and placement stay as measured (p ranks, loop placement); a rank's compute is
    split evenly over its chunks. Schedules generated so far: GPipe, 1F1B,
    Interleaved1F1B (zero-bubble and DualPipeV runs can be the measured run, not a target).

    \b
    Examples:
      tracekit whatif sample_traces/1f1b
      tracekit whatif run/ -s Interleaved1F1B -v 2 -v 4 -m 16
      tracekit whatif run/ -s 1F1B -m 8 -m 16 -m 32 --keep microbatch --json
      tracekit whatif run/ -s 1F1B -m 8 --balanced     # what a better stage split buys
    """
    from tracekit.analyze.whatif import cost_model, what_if
    from tracekit.render.whatif import render

    run = load_with_progress(run_dir, rank_from, rank_map, progress)
    say = work_progress(progress)
    if say:
        say("what-if: the cost model from the measured steps")
    model = cost_model(run)
    targets = None
    if schedules or vs or ms:
        # -v alone asks about interleaving; GPipe and 1F1B have one chunk per rank.
        chosen = schedules or (("Interleaved1F1B",) if vs else tuple(SCHEDULE_CHOICES))
        m_values = ms or (model.m, 2 * model.m)
        v_interleaved = vs or ((model.v if model.v >= 2 else 2),)
        targets = [
            (s, v, m) for s in chosen for v in (v_interleaved if s == "Interleaved1F1B" else (1,)) for m in m_values
        ]
    result = what_if(run, targets, keep=keep, samples=replays, seed=seed, balanced=balanced, model=model, progress=say)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
    else:
        click.echo(render(result))
