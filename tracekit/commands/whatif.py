"""``tracekit whatif RUN_DIR``: predict another schedule, v or m by replaying measured costs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracekit.commands.common import TracekitCommand, load_with_progress, rank_options, work_progress
from tracekit.model import schedules as traits
from tracekit.model.frameworks import FRAMEWORKS

if TYPE_CHECKING:
    import pandas as pd

    from tracekit.analyze.costs import CostModel
    from tracekit.analyze.framework_config import Advice
    from tracekit.analyze.whatif import WhatIf
    from tracekit.analyze.split import SplitReport
    from tracekit.analyze.memory import ActivationSize
    from tracekit.ingest.kineto_memory import MemoryEvents
    from tracekit.model.run import Run

SCHEDULE_CHOICES = list(traits.names(generated=True))  # every schedule what-if generates


@click.command("whatif", cls=TracekitCommand, renamed={"--ranks": "--pipeline-ranks"})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-s",
    "--schedule",
    "schedules",
    multiple=True,
    type=click.Choice(SCHEDULE_CHOICES),
    help="A schedule to predict (repeat for several): GPipe, 1F1B, Interleaved1F1B; the zero-bubble "
    "family with the backward split into input-grad (I) and weight-grad (W): ZB-H1 (v=1), "
    "InterleavedZeroBubble (v>=2, loop placement), ZBVZeroBubble and DualPipeV (v=2, V placement; "
    "DualPipeV fuses forward/backward pairs, needs m >= 2p). Orders of the zero-bubble family come "
    "from torch's own schedule classes where torch is installed. Default: the first three at the "
    "measured m and twice it (the zero-bubble family on request: importing torch's schedules takes seconds).",
)
@click.option(
    "-p",
    "--pipeline-ranks",
    "ranks",
    type=int,
    metavar="P",
    help="Pipeline ranks of the targets: only the measured p (changing p is out of scope; refused).",
)
@click.option(
    "-v",
    "--chunks",
    "vs",
    multiple=True,
    type=int,
    metavar="V",
    help="Chunks (stages) per rank for Interleaved1F1B and InterleavedZeroBubble (repeatable). "
    "Default: the measured v, or 2.",
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
    help="What stays fixed when m changes: the samples per step (an action's work ops "
    "scale with measured m / new m, its fixed part, the small ops and the gaps between ops, "
    "stays) or the microbatch size (the step does more work).",
)
@click.option(
    "--balanced",
    is_flag=True,
    help="Search the best split of the layers over the p*v stages: the layers as the model has them, "
    "from its module names (nn.Module frames of a with_stack trace, layers.N ranges), else from the "
    "repeating unit of each stage's forward ops, or --layer-costs (the output says which, and how many "
    "layers a stage); dynamic programming for the smallest slowest stage, the best few candidates "
    "replayed; prints layer ranges per stage with the predicted bubble and step time. Where the trace "
    "shows no layers and no --layer-costs is given, the rows re-split so every rank computes the same "
    "instead (said so).",
)
@click.option(
    "--split",
    "splits",
    multiple=True,
    metavar="N,N,...",
    help="Predict a given split: whole layers per stage in stage order, e.g. 5,3,4,4 (repeatable), "
    "on the targets with that many stages (p*v); one that does not add up to the model's layers is refused.",
)
@click.option(
    "--layer-costs",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Per-layer costs instead of the trace\'s: JSON {"layers": [{"forward_ns": N, '
    '"backward_ns": N}, ...]} or CSV layer,forward_ns,backward_ns; one microbatch at the '
    "measured m, in model order.",
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
    "--search",
    "do_search",
    is_flag=True,
    help="Replay a grid of (schedule, v, m) (narrowed by -s/-v/-m) and name the fastest whose activations "
    "fit --memory-budget; per v: bubble, messages per step and step time.",
)
@click.option(
    "--memory-budget",
    metavar="SIZE",
    help="Activation memory per rank (2GiB, 512MB, bytes): rows and splits over it are marked and never the "
    "fastest or recommended one; with --search, the budget the grid is searched under. Needs the activations "
    "sized: a profile_memory trace or --activation-bytes.",
)
@click.option(
    "--activation-bytes",
    metavar="SIZE",
    help="What one microbatch (measured size) leaves on all of one rank's layers; default: from the "
    "profiler's memory events where the trace has them (profile_memory=True), else (--search only) a proxy "
    "from the P2P message sizes, else not sized (the output says which).",
)
@click.option(
    "--link-latency",
    metavar="CHANGE",
    help="Change every measured message latency: x0.5 (scale), +2ms or -1ms (shift; write a negative one as "
    "--link-latency=-1ms), 5ms (set).",
)
@click.option(
    "--overlap-p2p",
    is_flag=True,
    help="P2P fully overlapped with compute: every message free, the order (data dependencies) kept.",
)
@click.option(
    "--no-recompute",
    is_flag=True,
    help="Activation recomputation off: every backward without the forward it ran again (measured per "
    "rank; a run without recomputation is refused), with each rank's activation memory on and off, sized "
    "from the re-run ops' recorded shapes (record_shapes=True).",
)
@click.option(
    "--framework",
    type=click.Choice(list(FRAMEWORKS)),
    help="The framework whose config lines each recommendation is also printed as: Megatron-LM's flags, "
    "torchtitan's config, DeepSpeed's PipelineModule and config keys, torch.distributed.pipelining's classes. "
    "Default: the one the traces show (capture.json, label names, process groups, trace folders).",
)
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
    ranks: int | None,
    vs: tuple[int, ...],
    ms: tuple[int, ...],
    keep: str,
    balanced: bool,
    splits: tuple[str, ...],
    layer_costs: Path | None,
    replays: int,
    seed: int,
    do_search: bool,
    memory_budget: str | None,
    activation_bytes: str | None,
    link_latency: str | None,
    overlap_p2p: bool,
    no_recompute: bool,
    framework: str | None,
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

    Ranks stay as measured (p ranks; loop placement, or V for ZBVZeroBubble and DualPipeV);
    a rank's compute is split evenly over its chunks. Zero-bubble targets take the run's
    input-grad (I) and weight-grad (W) costs where it split its backwards; otherwise each is
    half of the measured backward (stage 0's I empty, as torch runs it), said in the output.

    \b
    Examples:
      tracekit whatif sample_traces/1f1b
      tracekit whatif run/ -s Interleaved1F1B -v 2 -v 4 -m 16
      tracekit whatif run/ -s 1F1B -m 8 -m 16 -m 32 --keep microbatch --json
      tracekit whatif run/ --balanced                  # the best split of the layers
      tracekit whatif run/ --split 5,3,4,4 --split 4,4,4,4
      tracekit whatif run/ -s ZBVZeroBubble -s DualPipeV -m 8 -m 16
      tracekit whatif run/ --search --memory-budget 2GiB --activation-bytes 96MiB
      tracekit whatif run/ --balanced --memory-budget 2GiB   # over it: marked, never recommended
      tracekit whatif run/ --link-latency x0.5         # a link twice as fast
      tracekit whatif run/ --overlap-p2p               # messages hidden behind compute
      tracekit whatif run/ --no-recompute              # activation recomputation off

    With --search the grid is every generated schedule, v in 1, 2, 4, 8 and m at half, once,
    twice and four times the measured m (what -s / -v / -m give instead). Activation memory
    per rank is the most (stage, microbatch) pairs the order holds at once (a forward's
    activations live until its backward, or its W) times one chunk's activations; the output
    says where that size comes from. Without --search, every row and every split is sized the
    same way where the traces recorded profile_memory (or --activation-bytes is given; a split's
    stage holds its own layers' share), and --memory-budget marks those over it: the fastest
    row and the recommended split are the fastest within the budget.
    """
    from tracekit.analyze.memory import activation_size, parse_bytes
    from tracekit.analyze.costs import cost_model, parse_link_latency
    from tracekit.analyze.whatif import check_ranks, requested_targets, search, what_if
    from tracekit.errors import TracekitError
    from tracekit.render.whatif import render

    links = parse_link_latency(link_latency, overlap_p2p)
    budget = None if memory_budget is None else parse_bytes(memory_budget, "--memory-budget")
    user_bytes = None if activation_bytes is None else parse_bytes(activation_bytes, "--activation-bytes")
    if do_search and budget is None:
        raise TracekitError("--search needs --memory-budget SIZE (activation memory per rank, e.g. 2GiB)")
    if no_recompute and (do_search or balanced or splits or layer_costs):
        raise TracekitError(
            "--no-recompute predicts the measured split's schedules: run --search / --balanced / --split apart"
        )
    if do_search and (balanced or splits or layer_costs):
        raise TracekitError(
            "--balanced / --split / --layer-costs and --search: the search keeps the measured split; run them apart"
        )
    # Layer costs are read from the ops inside each action: the working set keeps them, a
    # rank's reduce (the default) keeps only the actions (with each one's fixed part:
    # tracekit.reconstruct.fixed_part).
    rows = "analysis" if (balanced or splits) and layer_costs is None else "reduce"
    run = load_with_progress(run_dir, rank_from, rank_map, progress, rows=rows)
    say = work_progress(progress)
    if say:
        say("what-if: the cost model from the measured steps")
    model = cost_model(run)
    check_ranks(model, ranks)
    recompute = recompute_memory = None
    if no_recompute:
        from tracekit.analyze.dimensions import recompute_per_backward
        from tracekit.analyze.recompute_memory import recompute_memory as size_recompute

        recompute = recompute_per_backward(run)
        if not recompute:
            raise TracekitError(
                f"{run_dir}: --no-recompute: no activation recomputation in these traces (no forward op run "
                "again inside a backward): nothing to switch off"
            )
        recompute_memory = size_recompute(run, _op_inputs(run), recompute)
    if do_search:
        assert budget is not None  # checked above
        size = activation_size(run, user_bytes, None if user_bytes is not None else _memory_events(run))
        result = search(run, budget, size, keep, replays, seed, schedules, vs, ms, links, model)
        advice = _advice(run, model, framework, result, None)
        click.echo(
            json.dumps({**result.to_dict(), "framework": advice.to_dict()}, indent=1)
            if as_json
            else render(result, advice)
        )
        return
    activation = _activation(run, user_bytes, budget)
    # None: what_if's defaults
    targets = requested_targets(model, schedules, vs, ms) if schedules or vs or ms else None
    report, fallback = None, None
    if balanced or splits or layer_costs:
        report, fallback = _split(
            run, model, targets, balanced, splits, layer_costs, keep, replays, seed, activation, budget
        )
    result = what_if(
        run,
        targets,
        keep=keep,
        samples=replays,
        seed=seed,
        balanced=fallback is not None,
        model=model,
        p=ranks,
        links=links,
        progress=say,
        no_recompute=recompute,
        recompute_memory=recompute_memory,
        activation=activation,
        memory_budget=budget,
    )
    if fallback is not None:
        result.assumptions.append(fallback)
    advice = _advice(run, model, framework, result, report)
    if as_json:
        doc = result.to_dict()
        if report is not None:
            doc["split"] = report.to_dict()
        doc["framework"] = advice.to_dict()
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        click.echo(render(result, advice))
        if report is not None:
            from tracekit.render.split import render_split

            click.echo(render_split(report, result.measured_step_ns, advice))


def _split(
    run: Run,
    model: CostModel,
    targets: list[tuple[str, int, int]] | None,
    balanced: bool,
    splits: tuple[str, ...],
    layer_costs: Path | None,
    keep: str,
    replays: int,
    seed: int,
    activation: ActivationSize | None = None,
    budget: int | None = None,
) -> tuple[SplitReport | None, str | None]:
    """The split search and the given splits (a SplitReport), or, for --balanced on a run
    whose layers cannot be read, None and the note that the rank-balanced rows stand in.
    ``activation``: the splits' activations sized from it (``budget``: over it, never recommended)."""
    from tracekit.analyze.layers import layer_costs_from_trace, read_layer_costs
    from tracekit.analyze.split import SPLIT_TARGETS, default_split_target, parse_split, split_report
    from tracekit.analyze.whatif import IDEAL_BALANCE
    from tracekit.errors import TracekitError

    given = [parse_split(text) for text in splits]
    if layer_costs is not None:
        layers = read_layer_costs(layer_costs)
    else:
        try:
            layers = layer_costs_from_trace(run)
        except TracekitError as err:
            if given or not balanced:
                raise
            return None, (
                f"no per-layer costs ({err}); the '{IDEAL_BALANCE}' rows stand in for the best split: "
                "every rank computes the same"
            )
    if targets is None:
        targets = [default_split_target(model)]
    targets = [t for t in targets if t[0] in SPLIT_TARGETS]
    if not targets:
        raise TracekitError(f"--balanced / --split replay {', '.join(SPLIT_TARGETS)}; add one of them with -s")
    layer_bytes = None
    if activation is not None:
        from tracekit.analyze.memory import layer_activation_bytes

        stage_rank = {int(s): int(r) for s, r in zip(model.graphs[0].stage.tolist(), model.graphs[0].rank.tolist())}
        layer_bytes = layer_activation_bytes(activation, len(layers.layers), layers.measured_split, stage_rank)
    report = split_report(
        model,
        layers,
        targets,
        balanced,
        given,
        keep,
        replays,
        seed,
        layer_bytes,
        budget,
        None if activation is None else activation.source,
    )
    return report, None


def _advice(run: Run, model: CostModel, framework: str | None, result: WhatIf, report: SplitReport | None) -> Advice:
    """Each recommendation in the config lines of the framework that ran (``--framework``,
    else detected from the traces)."""
    from tracekit.analyze.framework import detect_framework
    from tracekit.analyze.framework_config import advise, run_facts

    return advise(detect_framework(run, framework), run_facts(run, model.m), result, report)


def _activation(run: Run, user_bytes: int | None, budget: int | None) -> ActivationSize | None:
    """What sizes the rows' activations outside --search: ``--activation-bytes``, else the
    profiler's memory events where the capture recorded them (capture.json's
    profile_memory) or a budget asks for them, else None (not sized); a budget with nothing
    to size against is a one-line error."""
    from tracekit.analyze.memory import MEMORY_EVENTS_NOTE, SOURCE_USER, ActivationSize, activation_size_from_memory
    from tracekit.errors import TracekitError

    if user_bytes is not None:
        return ActivationSize(user_bytes, SOURCE_USER)
    profiler = (run.capture or {}).get("profiler")
    recorded = isinstance(profiler, dict) and profiler.get("profile_memory") is True
    found = activation_size_from_memory(run, _memory_events(run)) if recorded or budget is not None else None
    if found is None and budget is not None:
        raise TracekitError(
            f"{run.source}: --memory-budget: no activation size (no [memory] events in these traces); "
            f"{MEMORY_EVENTS_NOTE}"
        )
    return found


def _op_inputs(run: Run) -> dict[int, pd.DataFrame]:
    """Each Kineto file's host ops with their first input's shape, by rank (read only for
    --no-recompute's activation memory); ranks of other formats get none."""
    import pandas as pd

    from tracekit.ingest.kineto_shapes import OP_COLUMNS, read_op_inputs

    return {
        f.rank: read_op_inputs(f.path) if f.format == "kineto" else pd.DataFrame(columns=OP_COLUMNS) for f in run.files
    }


def _memory_events(run: Run) -> dict[int, MemoryEvents]:
    """Each Kineto file's [memory] events by rank (read only when an activation size is asked for)."""
    from tracekit.ingest.kineto_memory import read_memory_events

    return {f.rank: read_memory_events(f.path) for f in run.files if f.format == "kineto"}
