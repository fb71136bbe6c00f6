"""A what-if recommendation in the words of the framework that runs it.

Each recommendation (a schedule, chunks per rank v, microbatches m, a split of the layers
over the stages) becomes the config lines of the framework that ran the pipeline
(:mod:`tracekit.analyze.framework`), or a line saying what that framework's flags cannot
express. The names are the frameworks' current ones, read from their sources:

- **Megatron-LM** (NVIDIA/Megatron-LM at d98e8a64, ``pretrain_gpt.py`` flags):
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
  ``--pipeline-model-parallel-layout``, ``--num-layers-per-virtual-pipeline-stage`` and
  ``--num-virtual-stages-per-pipeline-rank`` are declared in megatron/training/arguments.py
  (lines 3095, 3099, 3103, 3114, 3116); ``--pipeline-model-parallel-size`` and
  ``--num-layers`` are generated from the config dataclasses' fields
  (megatron/core/model_parallel_config.py:83 ``pipeline_model_parallel_size``,
  megatron/core/transformer/transformer_config.py:65 ``num_layers``), ``--micro-batch-size``
  and ``--global-batch-size`` likewise (megatron/training/config/training_config.py:11, 15),
  by megatron/training/argument_utils.py:95 (``_format_arg_name``: ``--`` and ``_`` to
  ``-``). At most one of the layout and the two virtual-stage flags may be set
  (arguments.py, "Uneven virtual pipeline parallelism"); first/last-stage counts must divide
  by v and the middle ranks share the rest evenly (transformer_config.py:2294, "Uneven PP");
  a layout lists stage c*p + r in order, ``|`` between stages, ``E`` (embedding) first and
  ``L`` (loss) last, ``t`` a decoder layer, ``x*N`` N of them
  (megatron/core/transformer/pipeline_parallel_layer_layout.py:86 and :283). Megatron runs
  1F1B without virtual stages and interleaved 1F1B with them, nothing else
  (megatron/core/pipeline_parallel/schedules.py:161, ``get_forward_backward_func``); m is
  global batch / (micro batch x data-parallel size).
- **torchtitan** (pytorch/torchtitan at b5bcd76c): ``ParallelismConfig`` in
  torchtitan/config/configs.py (``pipeline_parallel_degree`` :180,
  ``module_fqns_per_model_part`` :187, ``pipeline_parallel_first_stage_less_layers`` :197,
  ``pipeline_parallel_last_stage_less_layers`` :203, ``pipeline_parallel_layers_per_stage``
  :209, ``pipeline_parallel_schedule`` :216, ``num_pp_microbatches`` :232), given on the
  command line as ``--parallelism.<name>`` (torchtitan/config/manager.py,
  tests/unit_tests/test_no_new_cli_options.py lists them); ``TrainingConfig``'s
  ``num_tokens_per_microbatch_per_dp_rank`` (:37). ``pipeline_parallel_microbatch_size`` is
  gone: torchtitan 73aed7f6 ("fold batch dim") replaced it with ``num_pp_microbatches``.
  The schedule names are torch's ``get_schedule_class`` keys; with a layers-per-stage the
  stage count is ceil((layers + first_less + last_less) / layers_per_stage), and a
  multi-stage schedule needs at least 2 stages a rank
  (torchtitan/distributed/pipeline_parallel.py, ``_get_pipeline_metadata``); the decoder's
  modules are ``tok_embeddings``, ``layers.<i>``, ``norm``, ``lm_head``
  (``_generate_llm_fqn_per_model_part``).
- **DeepSpeed** (deepspeedai/DeepSpeed at edaa7221): ``PipelineModule(layers, num_stages=...,
  partition_method=...)`` (deepspeed/runtime/pipe/module.py:125, :133); ``partition_method``
  is ``'uniform'`` (deepspeed/runtime/utils.py:606 ``partition_uniform``: the first
  ``layers % stages`` stages one layer more), ``'parameters'`` or ``'type:REGEX'`` (balanced
  counts), nothing else (module.py:396 ``_partition_layers``, whose result is
  ``PipelineModule.parts``); one schedule, ``TrainSchedule`` (deepspeed/runtime/pipe/schedule.py:189),
  one stage a rank; its m is the config's ``gradient_accumulation_steps`` (pipe/engine.py:99), beside
  ``train_micro_batch_size_per_gpu`` and ``train_batch_size`` (deepspeed/runtime/constants.py:19, 95, 107).
- **torch.distributed.pipelining** (torch 2.13): the schedule classes
  (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``,
  ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) take
  ``n_microbatches``; ``PipelineStage(submodule, stage_index, num_stages, device)``;
  ``pipeline(module, mb_args, split_spec={fqn: SplitPoint.BEGINNING})`` cuts a model into stages.

tests/test_framework_config.py checks every name these lines hold against the frameworks'
sources (installed where they are, else a list of names with the upstream commit and line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from tracekit.analyze.framework import Framework
from tracekit.model.frameworks import FRAMEWORKS
from tracekit.model import schedules as traits
from tracekit.model.run import Run

if TYPE_CHECKING:
    from tracekit.analyze.split import SplitReport
    from tracekit.analyze.whatif import WhatIf


@dataclass(frozen=True)
class Target:
    """What one recommendation asks the framework to run."""

    label: str  # the recommendation's label in the what-if output
    schedule: str
    p: int
    v: int
    m: int
    keep: str  # "global-batch" | "microbatch" (tracekit.analyze.whatif)
    split: tuple[int, ...] | None = None  # layers per stage in stage order (p*v stages); None: as measured


@dataclass(frozen=True)
class RunFacts:
    """What the measured run says that the lines need."""

    m: int  # microbatches per step, measured
    dp: int = 1  # data-parallel replicas of the pipeline
    n_layers: int | None = None  # the model's layers (a split's own sum wins)
    microbatch_size: int | None = None  # samples per microbatch, where the capture says


def run_facts(run: Run, measured_m: int) -> RunFacts:
    """The facts of ``run``: data-parallel size from its layout; the layer count and the
    micro-batch size from ``capture.json`` where it has them (a trace alone holds neither)."""
    dp = run.layout.size("dp") if run.layout is not None else 1
    capture = run.capture or {}
    n_layers = _positive(_get(capture, "megatron", "transformer_config", "num_layers")) or _positive(
        _get(capture, "compute", "layers")
    )
    microbatch = _positive(_get(capture, "deepspeed", "config", "train_micro_batch_size_per_gpu")) or _positive(
        _get(capture, "compute", "microbatch_size")
    )
    return RunFacts(measured_m, dp, n_layers, microbatch)


def _get(doc: dict[str, Any], *keys: str) -> object:
    value: object = doc
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class ConfigLine:
    """One line to paste. ``names``: every identifier of the framework it holds (flags,
    config keys, classes, arguments), as the framework spells them."""

    names: tuple[str, ...]
    text: str
    placeholder: bool = False  # the text holds a <value> tracekit cannot know (said inside)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "text": self.text, "placeholder": self.placeholder, "note": self.note}


@dataclass(frozen=True)
class FrameworkConfig:
    """One recommendation as one framework's config lines, and what they cannot express."""

    framework: str  # a key of tracekit.analyze.framework.FRAMEWORKS
    target: Target
    lines: tuple[ConfigLine, ...]
    cannot: tuple[str, ...] = ()  # what the framework's flags cannot express, one line each
    notes: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return FRAMEWORKS[self.framework]

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "label": t.label,
            "framework": self.framework,
            "schedule": t.schedule,
            "p": t.p,
            "v": t.v,
            "m": t.m,
            "split": None if t.split is None else list(t.split),
            "lines": [line.to_dict() for line in self.lines],
            "cannot": list(self.cannot),
            "notes": list(self.notes),
        }


@dataclass
class _Lines:
    """What one framework's writer collects."""

    lines: list[ConfigLine] = field(default_factory=list)
    cannot: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, names: Sequence[str], text: str, placeholder: bool = False, note: str = "") -> None:
        self.lines.append(ConfigLine(tuple(names), text, placeholder, note))

    def done(self, framework: str, target: Target) -> FrameworkConfig:
        return FrameworkConfig(framework, target, tuple(self.lines), tuple(self.cannot), tuple(self.notes))


def config_lines(framework: str, target: Target, facts: RunFacts) -> FrameworkConfig:
    """``target`` as ``framework``'s config lines (see the module doc)."""
    if target.split is not None and len(target.split) != target.p * target.v:
        raise ValueError(f"split {target.split} has {len(target.split)} stages; p*v = {target.p * target.v}")
    writer = {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed, "torch": _torch}[framework]
    out = _Lines()
    writer(target, facts, out)
    return out.done(framework, target)


# --- micro-batches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    """The target's microbatch size against the measured one."""

    scale: Fraction  # target microbatch size / measured
    size: int | None  # samples per microbatch (None: unknown, or not a whole number)
    whole: bool  # False: the measured batch does not cut into m microbatches of whole samples

    def per_step(self, facts: RunFacts, m: int) -> int | None:
        return None if self.size is None else self.size * m * facts.dp


def _batch(target: Target, facts: RunFacts) -> _Batch:
    scale = Fraction(facts.m, target.m) if target.keep == "global-batch" else Fraction(1)
    if facts.microbatch_size is None:
        return _Batch(scale, None, True)
    size = facts.microbatch_size * scale
    if size.denominator != 1 or size < 1:
        return _Batch(scale, None, False)
    return _Batch(scale, int(size), True)


def _times(scale: Fraction) -> str:
    return f"x {scale.numerator}/{scale.denominator}" if scale.denominator != 1 else f"x {scale.numerator}"


def _not_whole(target: Target, facts: RunFacts) -> str:
    return (
        f"m={target.m} with the global batch kept: {facts.microbatch_size} samples a microbatch x {facts.m}/{target.m} "
        "is not a whole number of samples; keep the microbatch size instead (--keep microbatch) or choose another m"
    )


# --- Megatron-LM -----------------------------------------------------------------------------

MEGATRON_SCHEDULES = ("1F1B", "Interleaved1F1B")


def megatron_uneven_split(n_layers: int, p: int, v: int, first: int | None, last: int | None) -> list[int] | None:
    """Layers per stage (stage c*p + r, rank r) that Megatron builds from
    ``--decoder-first-pipeline-num-layers first`` / ``--decoder-last-pipeline-num-layers last``
    (None: not given) and v chunks a rank; None where Megatron refuses them (its rule:
    megatron/core/transformer/transformer_config.py:2294 at d98e8a64)."""
    per_rank: list[int | None] = [None] * p
    rest, middle = n_layers, p
    if first is not None:
        per_rank[0], rest, middle = first, rest - first, middle - 1
    if last is not None:
        per_rank[p - 1], rest, middle = last, rest - last, middle - 1
    if rest < 0 or (rest > 0) != (middle > 0) or (middle and rest % middle):
        return None
    filled = [rest // middle if n is None else n for n in per_rank] if middle else [n or 0 for n in per_rank]
    if any(n <= 0 or n % v for n in filled):
        return None
    return [filled[s % p] // v for s in range(p * v)]


def megatron_layout(split: Sequence[int]) -> str:
    """The ``--pipeline-model-parallel-layout`` of ``split`` (stages in order c*p + r):
    ``E`` on the first stage, ``L`` on the last, ``t*N`` decoder layers."""
    stages = [("t" if n == 1 else f"t*{n}") for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def _megatron(target: Target, facts: RunFacts, out: _Lines) -> None:
    """Megatron-LM's flags (see the module doc for where each is declared)."""
    if target.schedule not in MEGATRON_SCHEDULES:
        out.cannot.append(
            f"{target.schedule}: Megatron-LM runs 1F1B (no virtual stages) and interleaved 1F1B (virtual stages) "
            "only (megatron/core/pipeline_parallel/schedules.py, get_forward_backward_func); no flag selects "
            f"{target.schedule}"
        )
        return
    p, v = target.p, target.v
    out.add(["--pipeline-model-parallel-size"], f"--pipeline-model-parallel-size {p}")
    split = target.split
    n_layers = sum(split) if split is not None else facts.n_layers
    if split is not None:
        out.add(["--num-layers"], f"--num-layers {n_layers}")
    if split is not None and len(set(split)) > 1:
        _megatron_uneven(split, p, v, out)
    elif v > 1:
        if n_layers is not None and n_layers % (p * v) == 0:
            out.add(
                ["--num-layers-per-virtual-pipeline-stage"],
                f"--num-layers-per-virtual-pipeline-stage {n_layers // (p * v)}",
            )
        else:
            out.add(["--num-virtual-stages-per-pipeline-rank"], f"--num-virtual-stages-per-pipeline-rank {v}")
    else:
        out.notes.append(
            "no --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank: "
            "Megatron runs 1F1B without virtual stages"
        )
    if split is not None and len(set(split)) == 1:
        out.notes.append(
            "an even split: Megatron's default, with no --decoder-first-pipeline-num-layers, "
            "--decoder-last-pipeline-num-layers or --pipeline-model-parallel-layout"
        )
    _megatron_batch(target, facts, out)


def _megatron_uneven(split: Sequence[int], p: int, v: int, out: _Lines) -> None:
    """An uneven split: first/last-stage layer counts where they give it, else a layout."""
    n_layers = sum(split)
    first = sum(split[s] for s in range(0, p * v, p))
    last = sum(split[s] for s in range(p - 1, p * v, p))
    for use_first, use_last in ((True, False), (False, True), (True, True)):
        f, l_ = (first if use_first else None), (last if use_last else None)
        if megatron_uneven_split(n_layers, p, v, f, l_) == list(split):
            if f is not None:
                out.add(["--decoder-first-pipeline-num-layers"], f"--decoder-first-pipeline-num-layers {f}")
            if l_ is not None:
                out.add(["--decoder-last-pipeline-num-layers"], f"--decoder-last-pipeline-num-layers {l_}")
            if v > 1:
                out.add(["--num-virtual-stages-per-pipeline-rank"], f"--num-virtual-stages-per-pipeline-rank {v}")
            return
    out.add(
        ["--pipeline-model-parallel-layout"],
        f"--pipeline-model-parallel-layout '{megatron_layout(split)}'",
        note="first/last-stage layer counts cannot give this split (the middle ranks would share their layers "
        "evenly); the layout sets every stage, E the embedding on the first, L the loss on the last"
        + (", and implies the virtual stages" if v > 1 else ""),
    )


def _megatron_batch(target: Target, facts: RunFacts, out: _Lines) -> None:
    """m = global batch / (micro batch x data-parallel size)."""
    if target.m == facts.m:
        return
    batch = _batch(target, facts)
    if not batch.whole:
        out.cannot.append(_not_whole(target, facts))
        return
    if target.keep == "global-batch":
        if batch.size is not None:
            out.add(["--micro-batch-size"], f"--micro-batch-size {batch.size}")
            out.add(["--global-batch-size"], f"--global-batch-size {batch.per_step(facts, target.m)}")
        else:
            out.add(
                ["--micro-batch-size"],
                f"--micro-batch-size <the run's {_times(batch.scale)}>",
                placeholder=True,
                note=f"--global-batch-size unchanged: m = global batch / (micro batch x DP {facts.dp}) = {target.m}",
            )
    else:
        size = "" if facts.microbatch_size is None else f" (micro batch {facts.microbatch_size})"
        per_step = None if facts.microbatch_size is None else facts.microbatch_size * target.m * facts.dp
        if per_step is not None:
            out.add(["--global-batch-size"], f"--global-batch-size {per_step}", note=f"m = {target.m}{size}")
        else:
            out.add(
                ["--global-batch-size"],
                f"--global-batch-size <the run's x {target.m}/{facts.m}>",
                placeholder=True,
                note="--micro-batch-size unchanged",
            )


# --- torchtitan ------------------------------------------------------------------------------

TORCHTITAN_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


def torchtitan_fqns(split: Sequence[int]) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for ``split``: its decoder's module names,
    the embedding on the first stage and the norm and head on the last."""
    parts: list[list[str]] = []
    first = 0
    for n in split:
        parts.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def _flag(name: str, value: object) -> str:
    return f"--{name} {value}"


def _torchtitan(target: Target, facts: RunFacts, out: _Lines) -> None:
    """torchtitan's config (``--parallelism.<name>`` on its command line)."""
    if target.schedule not in TORCHTITAN_SCHEDULES:
        why = (
            "torch runs it as ScheduleInterleavedZeroBubble with one stage a rank, and torchtitan builds its "
            "multi-stage schedules with at least 2 stages a rank (torchtitan/distributed/pipeline_parallel.py, "
            "_get_pipeline_metadata)"
            if target.schedule == "ZB-H1"
            else "no schedule of that name in torch's get_schedule_class"
        )
        out.cannot.append(f"{target.schedule}: {why}")
        return
    p, v = target.p, target.v
    out.add(["parallelism.pipeline_parallel_degree"], _flag("parallelism.pipeline_parallel_degree", p))
    out.add(
        ["parallelism.pipeline_parallel_schedule"], _flag("parallelism.pipeline_parallel_schedule", target.schedule)
    )
    split = target.split
    n_layers = sum(split) if split is not None else facts.n_layers
    single = traits.BY_NAME[target.schedule].chunks == "one"
    if split is not None and len(set(split)) > 1:
        out.add(
            ["parallelism.module_fqns_per_model_part"],
            f"parallelism.module_fqns_per_model_part = {torchtitan_fqns(split)!r}",
            note="a list: set it in the config (Python); torchtitan's own module names, "
            "another model's are its layers' FQNs",
        )
    elif split is not None or (not single and v != 2):
        if n_layers is not None and n_layers % (p * v) == 0:
            _torchtitan_even(n_layers // (p * v), out)
        else:
            out.add(
                ["parallelism.pipeline_parallel_layers_per_stage"],
                _flag("parallelism.pipeline_parallel_layers_per_stage", f"<layers / {p * v}>"),
                placeholder=True,
                note="with first/last_stage_less_layers 0 for exactly p*v stages",
            )
    elif not single:
        out.notes.append("2 stages a rank: torchtitan's default for a multi-stage schedule")
    out.add(["parallelism.num_pp_microbatches"], _flag("parallelism.num_pp_microbatches", target.m))
    if target.m != facts.m and target.keep == "global-batch":
        batch = _batch(target, facts)
        out.add(
            ["training.num_tokens_per_microbatch_per_dp_rank"],
            _flag("training.num_tokens_per_microbatch_per_dp_rank", f"<the run's {_times(batch.scale)}>"),
            placeholder=True,
            note="the global batch kept (num_tokens_per_train_step as it was)",
        )


def _torchtitan_even(per_stage: int, out: _Lines) -> None:
    """Every stage ``per_stage`` layers: the embedding and the head counted as no layer."""
    out.add(
        ["parallelism.pipeline_parallel_layers_per_stage"],
        _flag("parallelism.pipeline_parallel_layers_per_stage", per_stage),
    )
    for end in ("first", "last"):
        name = f"parallelism.pipeline_parallel_{end}_stage_less_layers"
        out.add([name], _flag(name, 0), note="" if end == "last" else "else the embedding counts as a layer")


# --- DeepSpeed -------------------------------------------------------------------------------


def deepspeed_uniform(n_layers: int, stages: int) -> list[int]:
    """Layers per stage of DeepSpeed's ``partition_method='uniform'``: the first
    ``n_layers % stages`` stages hold one layer more."""
    each, extra = divmod(n_layers, stages)
    return [each + (1 if s < extra else 0) for s in range(stages)]


def _deepspeed(target: Target, facts: RunFacts, out: _Lines) -> None:
    """DeepSpeed's PipelineModule arguments and config keys."""
    if target.schedule != "1F1B" or target.v != 1:
        out.cannot.append(
            f"{target.schedule} v={target.v}: DeepSpeed's pipeline engine runs one schedule, TrainSchedule "
            "(1F1B), with one stage a rank (deepspeed/runtime/pipe/schedule.py)"
        )
        return
    split = target.split
    if split is None:
        out.add(["PipelineModule", "num_stages"], f"PipelineModule(layers, num_stages={target.p}, ...)")
    elif list(split) == deepspeed_uniform(sum(split), target.p):
        out.add(
            ["PipelineModule", "num_stages", "partition_method"],
            f"PipelineModule(layers, num_stages={target.p}, partition_method='uniform')",
            note="layers: tracekit's layers only; other entries of the list count too",
        )
    else:
        bounds = [0]
        for n in split:
            bounds.append(bounds[-1] + n)
        out.cannot.append(
            f"split {','.join(str(n) for n in split)}: no partition_method gives it ('uniform' cuts "
            f"{','.join(str(n) for n in deepspeed_uniform(sum(split), target.p))}, 'parameters' and 'type:REGEX' "
            f"balance parameter or layer-type counts); PipelineModule.parts would have to be {bounds}"
        )
    if target.m == facts.m:
        return
    out.add(["gradient_accumulation_steps"], f'"gradient_accumulation_steps": {target.m}')
    batch = _batch(target, facts)
    if not batch.whole:
        out.cannot.append(_not_whole(target, facts))
    elif batch.size is not None:
        out.add(["train_micro_batch_size_per_gpu"], f'"train_micro_batch_size_per_gpu": {batch.size}')
        out.add(["train_batch_size"], f'"train_batch_size": {batch.per_step(facts, target.m)}')
    elif target.keep == "global-batch":
        out.add(
            ["train_micro_batch_size_per_gpu"],
            f'"train_micro_batch_size_per_gpu": <the run\'s {_times(batch.scale)}>',
            placeholder=True,
            note="train_batch_size unchanged",
        )
    else:
        out.add(
            ["train_batch_size"],
            f'"train_batch_size": <the run\'s x {target.m}/{facts.m}>',
            placeholder=True,
            note="train_micro_batch_size_per_gpu unchanged",
        )


# --- torch.distributed.pipelining ------------------------------------------------------------


def _torch(target: Target, facts: RunFacts, out: _Lines) -> None:
    """torch.distributed.pipelining's classes and arguments."""
    spec = traits.BY_NAME.get(target.schedule)
    if spec is None or spec.design or not spec.runner.startswith("Schedule"):
        out.cannot.append(f"{target.schedule}: no schedule class of torch.distributed.pipelining runs it")
        return
    p, v = target.p, target.v
    n_stages = p * v
    if spec.chunks == "two":
        out.add(
            ["PipelineStage", "stage_index", "num_stages"],
            f"stages = [PipelineStage(chunk, stage_index=s, num_stages={n_stages}, device=device) "
            f"for chunk, s in zip(chunks, (r, {n_stages - 1} - r))]",
            note="rank r holds two stages in a V",
        )
    elif v > 1 or spec.chunks == "several":
        out.add(
            ["PipelineStage", "stage_index", "num_stages"],
            f"stages = [PipelineStage(chunk, stage_index=r + {p} * c, num_stages={n_stages}, device=device) "
            "for c, chunk in enumerate(chunks)]",
            note=f"rank r holds {v} chunks",
        )
    # GPipe's and 1F1B's classes take one stage, the others a list of a rank's stages
    stages = "stage" if spec.runner in ("ScheduleGPipe", "Schedule1F1B") else ("stages" if n_stages > p else "[stage]")
    out.add(
        [spec.runner, "n_microbatches"],
        f"schedule = {spec.runner}({stages}, n_microbatches={target.m}, loss_fn=loss_fn)",
        note="one stage a rank: torch's interleaved zero-bubble class orders ZB-H1"
        if target.schedule == "ZB-H1"
        else "",
    )
    if target.split is not None:
        starts, first = [], 0
        for n in target.split[:-1]:
            first += n
            starts.append(first)
        spec_text = ", ".join(f'"layers.{i}": SplitPoint.BEGINNING' for i in starts)
        out.add(
            ["pipeline", "split_spec", "SplitPoint", "BEGINNING"],
            f"pipeline(model, mb_args, split_spec={{{spec_text}}})",
            note="layers.<i>: the FQN of your model's layer i",
        )
    if target.m != facts.m and target.keep == "microbatch":
        out.notes.append(
            f"microbatches keep their size: give schedule.step() {target.m}/{facts.m} of the run's batch "
            "(n_microbatches cuts it)"
        )


# --- every recommendation of a what-if -------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    """The framework that ran and each recommendation in its config lines (none where the
    framework is not recognised)."""

    framework: Framework
    configs: tuple[FrameworkConfig, ...]

    def for_label(self, label: str) -> FrameworkConfig | None:
        return next((c for c in self.configs if c.target.label == label), None)

    def runs(self, label: str) -> bool:
        """The framework's flags express the recommendation ``label`` whole."""
        config = self.for_label(label)
        return config is not None and not config.cannot

    def to_dict(self) -> dict[str, Any]:
        return {**self.framework.to_dict(), "configs": [c.to_dict() for c in self.configs]}


def advise(framework: Framework, facts: RunFacts, result: WhatIf, report: SplitReport | None = None) -> Advice:
    """Every configuration ``result`` and ``report`` predict that a user could run (generated
    orders; not the ideal-balance bounds): the best and the given splits, and each row."""
    if framework.name is None:
        return Advice(framework, ())
    targets = [
        Target(p.label, p.schedule, p.p, p.v, p.m, p.keep)
        for p in result.predictions
        if p.basis == "generated order" and not p.ideal_balance
    ]
    if report is not None:
        chosen = [s.recommended for s in report.searches] + list(report.given)
        for c in chosen:
            p = c.prediction
            targets.append(Target(p.label, p.schedule, p.p, p.v, p.m, p.keep, tuple(c.split)))
    return Advice(framework, tuple(config_lines(framework.name, t, facts) for t in targets))
