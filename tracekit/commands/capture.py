"""``tracekit capture``: record a real pipeline-parallel training run on this machine."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from tracekit.capture.config import (
    COMPUTE_MODES,
    LAYER_KINDS,
    DESIGNS,
    FRAMEWORKS,
    SCHEDULES,
    CaptureConfig,
    parse_layers_per_stage,
    schedule_by_name,
)
from tracekit.commands.common import TracekitCommand
from tracekit.errors import CaptureError
from tracekit.text import for_terminal


def _schedule(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return schedule_by_name(value) if value is not None else value


@click.command("capture", cls=TracekitCommand, renamed={"--ranks": "--pipeline-ranks"})
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder to write rank<R>.json.gz and capture.json into.",
)
@click.option(
    "--schedule",
    default="1F1B",
    show_default=True,
    callback=_schedule,
    help="Pipeline schedule: " + ", ".join(SCHEDULES) + ".",
)
@click.option(
    "--framework",
    default="torch",
    show_default=True,
    type=click.Choice(FRAMEWORKS),
    help="What runs the pipeline: torch (torch.distributed.pipelining), deepspeed "
    "(PipelineEngine, 1F1B) or megatron (Megatron-core schedules: 1F1B, Interleaved1F1B). "
    "deepspeed and megatron must be installed.",
)
@click.option(
    "-p",
    "--pipeline-ranks",
    "ranks",
    default=4,
    show_default=True,
    type=int,
    help="Pipeline stages (ranks per pipeline). The processes started are p x --tensor-parallel x --data-parallel.",
)
@click.option("-m", "--microbatches", default=8, show_default=True, type=int, help="Microbatches per step.")
@click.option(
    "-v",
    "--stages-per-rank",
    default=None,
    type=int,
    help="Stages (model chunks) per rank. Default: 1 for GPipe/1F1B, 2 otherwise.",
)
@click.option(
    "--steps", default=3, show_default=True, type=int, help="Profiled training steps (two unprofiled steps run first)."
)
@click.option(
    "--compute",
    default="emulated",
    show_default=True,
    type=click.Choice(COMPUTE_MODES),
    help="emulated: real matmuls plus fixed per-layer sleeps; real: plain matmuls.",
)
@click.option(
    "--layer-ms",
    default=3.0,
    show_default=True,
    type=float,
    help="Emulated forward cost of one layer in ms (B = 2x, I = W = 1x).",
)
@click.option(
    "--layers",
    default=16,
    show_default=True,
    type=int,
    help="Linear layers in the model (split evenly over p*v stages unless --layers-per-stage).",
)
@click.option(
    "--layer-kind",
    default="linear",
    show_default=True,
    type=click.Choice(LAYER_KINDS),
    help="What one layer is, at the same emulated costs: linear (a Linear and a ReLU); sleep-linear (a "
    "Linear whose input and weight each pass one autograd Function, TracekitSleep, and a ReLU); "
    "transformer (a pre-norm block: LayerNorm, qkv, attention over the rows, projection, LayerNorm, "
    "4x MLP with GELU; four Linears a layer). torch's schedules, emulated compute.",
)
@click.option(
    "--layers-per-stage",
    default=None,
    metavar="N,N,...",
    help="An uneven split: layers of each stage in stage order, one count per stage (p*v), "
    "summing to --layers, e.g. 6,4,3,3 (what `tracekit whatif --balanced` recommends).",
)
@click.option("--hidden", default=None, type=int, help="Hidden size. Default: 256 emulated, 1024 real.")
@click.option("--microbatch-size", default=8, show_default=True, type=int, help="Rows per microbatch.")
@click.option(
    "--slow-stage",
    default=None,
    type=int,
    help="Inject imbalance: multiply this stage's per-layer cost by --slow-factor.",
)
@click.option(
    "--slow-factor", default=2.0, show_default=True, type=float, help="Factor for --slow-stage or --slow-replica."
)
@click.option(
    "--p2p-delay-ms",
    default=0.0,
    show_default=True,
    type=float,
    help="Inject link latency: every send leaves this many ms after it is posted.",
)
@click.option(
    "--layer-labels",
    is_flag=True,
    help="Leave hand-written per-layer ranges (linear3(F), linear3(B)) inside a whole-step '1F1B' "
    "range, as hand-instrumented models do (1F1B, emulated compute).",
)
@click.option(
    "--profile-memory",
    is_flag=True,
    help="torch.profiler(profile_memory=True): a [memory] event on every allocation and free, so "
    "whatif --search can size one microbatch's activations (larger traces).",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    type=click.Choice(["cpu", "cuda"]),
    help="Where the stages compute. cuda: every rank on GPU 0 with --compute real, the profiler "
    "records the GPU's kernels too; P2P stays on gloo through the host (NCCL refuses two ranks "
    "on one GPU), so each stage copies its input to the GPU and its output back.",
)
@click.option(
    "--with-stack",
    is_flag=True,
    help="torch.profiler(with_stack=True): python_function frames in the trace (larger; with "
    "--framework megatron they name every action: Megatron's forward_step / backward_step).",
)
@click.option(
    "--tensor-parallel",
    default=1,
    show_default=True,
    type=int,
    help="TP ranks per pipeline stage: each stage's layers split Megatron-style (column- then "
    "row-parallel), with all-reduces on the TP group inside every forward and backward.",
)
@click.option(
    "--data-parallel",
    default=1,
    show_default=True,
    type=int,
    help="Replicas of the whole pipeline; gradients all-reduced on the DP group, launched from "
    "the last microbatch's backward and waited on before the optimizer. Ranks are numbered in "
    "Megatron's order tp-dp-pp.",
)
@click.option(
    "--slow-replica",
    default=None,
    type=int,
    help="Inject a slower host: multiply every emulated cost of this data-parallel replica by --slow-factor.",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Activation recomputation: torch.utils.checkpoint(use_reentrant=False) around each "
    "stage's layers, so every backward re-runs its forward first.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--attention-share",
    default=None,
    type=float,
    help="TeraPipe: share of a layer's mean cost that is attention over the prefix; slice i "
    "costs (1-s) + 2s(i+0.5)/m of it. Default 0.5.",
)
@click.option(
    "--profiler",
    default="torch",
    show_default=True,
    type=click.Choice(["torch", "nsys"]),
    help="torch: torch.profiler, one rank<R>.json.gz per rank. nsys: Nsight Systems "
    "(`nsys profile -t nvtx,osrt`), one scrubbed nsys_report.sqlite for all ranks.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Delete the traces of an earlier capture in --out first (default: refuse to touch them).",
)
@click.pass_context
def command(
    ctx: click.Context,
    out: str,
    schedule: str,
    framework: str,
    ranks: int,
    microbatches: int,
    stages_per_rank: int | None,
    steps: int,
    compute: str,
    layer_ms: float,
    layers: int,
    layer_kind: str,
    layers_per_stage: str | None,
    hidden: int | None,
    microbatch_size: int,
    slow_stage: int | None,
    slow_factor: float,
    p2p_delay_ms: float,
    layer_labels: bool,
    profile_memory: bool,
    device: str,
    with_stack: bool,
    tensor_parallel: int,
    data_parallel: int,
    slow_replica: int | None,
    recompute: bool,
    seed: int,
    attention_share: float | None,
    profiler: str,
    replace: bool,
) -> None:
    """Record a real pipeline-parallel training run (needs torch).

    \b
    Runs torch.distributed.pipelining on p local processes (gloo over 127.0.0.1),
    profiles every rank with torch.profiler, and writes one gzip Chrome trace per rank
    plus capture.json (what ran, how, with which injected faults). With
    --tensor-parallel / --data-parallel, -p stays the pipeline's stages and
    p x TP x DP processes run (a 3-D job, Megatron's rank order tp-dp-pp).

    \b
    Examples:
      tracekit capture -o run/ --schedule 1F1B
      tracekit capture -o zbv/ --schedule ZBVZeroBubble -p 4 -m 8
      tracekit capture -o slow/ --slow-stage 2 --slow-factor 2
      tracekit capture -o lat/ --p2p-delay-ms 5
      tracekit capture -o uneven/ --layers-per-stage 6,4,3,3
      tracekit capture -o 2bw/ --schedule PipeDream2BW   # 1F1B, no flush, 2 weight versions
      tracekit capture -o tera/ --schedule TeraPipe      # token slices, later ones cost more
      tracekit capture -o nsys_run/ --profiler nsys     # needs Nsight Systems' nsys
      tracekit capture -o gpu/ --device cuda --compute real --with-stack   # one GPU
      tracekit capture -o tp/ --tensor-parallel 2 -p 2    # 4 processes: 2 stages x TP 2
      tracekit capture -o dp/ --data-parallel 2 -p 2 --slow-replica 1 --slow-factor 1.1
      tracekit capture -o rc/ --recompute                 # checkpointed stages
      tracekit capture -o tf/ --layer-kind transformer --with-stack   # named blocks
    """
    cfg = CaptureConfig(
        schedule=schedule,
        framework=framework,
        ranks=ranks,
        microbatches=microbatches,
        stages_per_rank=stages_per_rank,
        steps=steps,
        compute=compute,
        layer_ms=layer_ms,
        layers=layers,
        layer_kind=layer_kind,
        layers_per_stage=parse_layers_per_stage(layers_per_stage),
        hidden=hidden,
        microbatch_size=microbatch_size,
        slow_stage=slow_stage,
        slow_factor=slow_factor,
        p2p_delay_ms=p2p_delay_ms,
        layer_labels=layer_labels,
        profile_memory=profile_memory,
        device=device,
        with_stack=with_stack,
        seed=seed,
        attention_share=attention_share,
        tensor_parallel=tensor_parallel,
        data_parallel=data_parallel,
        slow_replica=slow_replica,
        recompute=recompute,
    )
    cfg.validate()  # one-line CaptureError before torch is imported
    if profiler == "nsys" and cfg.schedule in DESIGNS:
        raise CaptureError(f"--profiler nsys runs torch's schedules only; capture {cfg.schedule} with --profiler torch")
    if profile_memory and profiler == "nsys":
        raise CaptureError("--profile-memory is torch.profiler's; drop --profiler nsys")
    if profiler == "nsys" and (cfg.is_3d or recompute):
        raise CaptureError(
            "--tensor-parallel, --data-parallel and --recompute are torch.profiler captures; drop --profiler nsys"
        )
    if profiler == "nsys" and (with_stack or device != "cpu"):
        raise CaptureError("--with-stack and --device cuda are torch.profiler captures; drop --profiler nsys")
    if not replace:
        _refuse_earlier_capture(Path(out))
    cfg.command = _command_line(ctx, out, cfg)
    if framework != "torch":
        from tracekit.capture.frameworks import run_framework_capture

        folder = run_framework_capture(cfg, out, profiler)
    elif profiler == "nsys":
        from tracekit.capture.nsys import run_nsys_capture

        folder = run_nsys_capture(cfg, out)
    else:
        from tracekit.capture.runner import run_capture

        folder = run_capture(cfg, out)
    click.echo(for_terminal(folder))


def _refuse_earlier_capture(out: Path) -> None:
    """A capture replaces a folder's traces: never those of a run the user did not name for it."""
    if not out.is_dir():
        return
    earlier = sorted({*out.glob("rank*.json*"), *out.glob("nsys_report.*"), *out.glob("capture.json")})
    if earlier:
        names = ", ".join(p.name for p in earlier[:3]) + (" ..." if len(earlier) > 3 else "")
        raise CaptureError(
            f"--out {out} already holds a capture ({names}); pick an empty folder, or pass "
            "--replace to delete those files first"
        )


def _command_line(ctx: click.Context, out: str, cfg: CaptureConfig) -> str:
    """The options the user gave, as a command line (defaults left out)."""
    from click.core import ParameterSource

    parts = ["tracekit", "capture", "-o", out]
    flags = {
        "schedule": "--schedule",
        "framework": "--framework",
        "ranks": "-p",
        "microbatches": "-m",
        "stages_per_rank": "-v",
        "steps": "--steps",
        "compute": "--compute",
        "layer_ms": "--layer-ms",
        "layers": "--layers",
        "layer_kind": "--layer-kind",
        "layers_per_stage": "--layers-per-stage",
        "hidden": "--hidden",
        "microbatch_size": "--microbatch-size",
        "slow_stage": "--slow-stage",
        "slow_factor": "--slow-factor",
        "p2p_delay_ms": "--p2p-delay-ms",
        "layer_labels": "--layer-labels",
        "profile_memory": "--profile-memory",
        "device": "--device",
        "with_stack": "--with-stack",
        "tensor_parallel": "--tensor-parallel",
        "data_parallel": "--data-parallel",
        "slow_replica": "--slow-replica",
        "recompute": "--recompute",
        "seed": "--seed",
        "attention_share": "--attention-share",
        "profiler": "--profiler",
    }
    for name, flag in flags.items():
        if ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None):
            continue
        value = ctx.params[name]
        if isinstance(value, bool):
            parts += [flag] if value else []
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        parts += [flag, str(value)]
    return shlex.join(parts)
