"""What a capture records: one frozen description, validated before any process starts.

Nothing here imports torch: the CLI validates options (and reports mistakes in one line)
before the capture code path loads torch.
"""

from __future__ import annotations

import platform
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from tracekit.errors import CaptureError
from tracekit.model import schedules as traits

# The schedules a capture runs (their traits: tracekit/model/schedules.py).
# CLI name -> torch.distributed.pipelining class name, or tracekit's own loop for a design
SCHEDULES: dict[str, str] = {s.name: s.runner for s in traits.SCHEDULES if s.captured}

#: schedules run by tracekit's own loops (tracekit.capture.designs), not by a torch schedule class
DESIGNS = set(traits.names(captured=True, design=True))

#: schedules that take one stage per rank (PipelineScheduleSingle)
SINGLE_STAGE = set(traits.names(captured=True, chunks="one"))
#: schedules that place stages in a V (rank r holds stages r and 2p-1-r)
V_PLACEMENT = set(traits.names(captured=True, v_shaped=True))
#: schedules that split backward into input-grad (I) and weight-grad (W) actions
SPLIT_BACKWARD = set(traits.names(captured=True, split_backward=True))

COMPUTE_MODES = ("emulated", "real")
#: what one layer of the model is (tracekit.capture.model): an emulated Linear, the Linear whose
#: input and weight each pass one autograd Function, or a transformer block of four Linears
LAYER_KINDS = ("linear", "sleep-linear", "transformer")
DEVICES = ("cpu", "cuda")

#: TeraPipe: share of a layer's mean cost that grows with the slice's prefix (attention)
DEFAULT_ATTENTION_SHARE = 0.5

#: training frameworks a capture can run, with the schedules each one has
FRAMEWORK_SCHEDULES: dict[str, tuple[str, ...]] = {
    "torch": tuple(SCHEDULES),  # the designs are built on torch.distributed too
    "deepspeed": ("1F1B",),  # PipelineEngine's TrainSchedule
    "megatron": ("1F1B", "Interleaved1F1B"),  # forward_backward_pipelining_{without,with}_interleaving
}
FRAMEWORKS = tuple(FRAMEWORK_SCHEDULES)

DEFAULT_HIDDEN = {"emulated": 256, "real": 1024}


def schedule_by_name(name: str) -> str:
    """The canonical schedule name for ``name`` (case-insensitive), or a CaptureError."""
    for known in SCHEDULES:
        if known.lower() == name.lower():
            return known
    raise CaptureError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


@dataclass
class CaptureConfig:
    """Everything that decides what a capture runs. ``validate()`` fills defaults."""

    schedule: str = "1F1B"
    framework: str = "torch"  # torch.distributed.pipelining, DeepSpeed's PipelineEngine, Megatron-core
    ranks: int = 4
    microbatches: int = 8
    stages_per_rank: int | None = None  # None: 1 for GPipe/1F1B, else 2
    steps: int = 3  # profiled steps (2 more run unprofiled first: wait + warmup)
    compute: str = "emulated"
    layer_ms: float = 3.0  # emulated forward cost of one layer
    layers: int = 16
    hidden: int | None = None  # None: 256 emulated, 1024 real
    microbatch_size: int = 8  # rows per microbatch
    slow_stage: int | None = None
    slow_factor: float = 2.0
    p2p_delay_ms: float = 0.0
    # hand-written per-layer ranges (linear3(F), linear3(B)) inside a whole-step "1F1B" range
    layer_labels: bool = False
    # torch.profiler(profile_memory=True): [memory] events on every allocation and free
    profile_memory: bool = False
    #: where the stages compute: "cpu", or "cuda" (every rank on GPU 0; P2P still over gloo,
    #: through the host: see tracekit.capture.model.OnDevice)
    device: str = "cpu"
    #: torch.profiler(with_stack=True): python_function frames (larger traces)
    with_stack: bool = False
    seed: int = 0
    attention_share: float | None = None  # TeraPipe only; None: DEFAULT_ATTENTION_SHARE
    #: layers of each stage, in stage order (an uneven split); None: layers split evenly
    layers_per_stage: tuple[int, ...] | None = None
    #: ranks per pipeline stage that split each stage's layers Megatron-style (TP)
    tensor_parallel: int = 1
    #: replicas of the whole pipeline whose gradients are all-reduced (DP)
    data_parallel: int = 1
    #: the data-parallel replica whose emulated costs are x slow_factor (a slower host)
    slow_replica: int | None = None
    #: torch.utils.checkpoint(use_reentrant=False) around each stage's layers
    recompute: bool = False
    #: what one layer is: one of LAYER_KINDS
    layer_kind: str = "linear"
    #: the command line to record in capture.json (filled by the CLI; else reconstructed)
    command: str | None = field(default=None, compare=False)

    # ---- derived -------------------------------------------------------------------
    @property
    def v(self) -> int:
        assert self.stages_per_rank is not None
        return self.stages_per_rank

    @property
    def width(self) -> int:
        """``hidden`` as ``validate`` resolved it (its default by compute mode)."""
        assert self.hidden is not None
        return self.hidden

    @property
    def n_stages(self) -> int:
        return self.ranks * self.v

    # ---- the 3-D layout: Megatron's order tp-dp-pp -----------------------------------
    @property
    def world_size(self) -> int:
        """Processes: pipeline ranks x tensor-parallel x data-parallel."""
        return self.ranks * self.tensor_parallel * self.data_parallel

    def global_rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        """Megatron's order tp-dp-pp (megatron/core/parallel_state.py): TP varies fastest."""
        tp, dp = self.tensor_parallel, self.data_parallel
        return tp_rank + tp * dp_rank + tp * dp * pp_rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of global ``rank``."""
        tp, dp = self.tensor_parallel, self.data_parallel
        return rank % tp, (rank // tp) % dp, rank // (tp * dp)

    def process_groups(self) -> list[dict[str, Any]]:
        """Every group a 3-D capture creates, in creation order (every rank creates all of
        them, as torch.distributed.new_group requires): role, Megatron's group_desc, ranks."""
        tp, dp, p = self.tensor_parallel, self.data_parallel, self.ranks
        groups = []
        for pp_rank in range(p):
            for tp_rank in range(tp):
                ranks = [self.global_rank(tp_rank, d, pp_rank) for d in range(dp)]
                groups.append({"role": "DP", "desc": "DATA_PARALLEL_GROUP", "ranks": ranks})
        for pp_rank in range(p):
            for dp_rank in range(dp):
                ranks = [self.global_rank(t, dp_rank, pp_rank) for t in range(tp)]
                groups.append({"role": "TP", "desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": ranks})
        for dp_rank in range(dp):
            for tp_rank in range(tp):
                ranks = [self.global_rank(tp_rank, dp_rank, s) for s in range(p)]
                groups.append({"role": "PP", "desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": ranks})
        return groups

    @property
    def is_3d(self) -> bool:
        """Whether the capture runs more than one pipeline (TP or DP): its own groups."""
        return self.tensor_parallel > 1 or self.data_parallel > 1

    @property
    def placement(self) -> str:
        return "v" if self.schedule in V_PLACEMENT else "loop"

    def stage_to_rank(self, stage: int) -> int:
        p = self.ranks
        if self.placement == "v":
            return stage if stage < p else 2 * p - 1 - stage
        return stage % p

    def stages_of_rank(self, rank: int) -> list[int]:
        return [s for s in range(self.n_stages) if self.stage_to_rank(s) == rank]

    def stage_layer_counts(self) -> list[int]:
        """Layers of every stage, in stage order: the given split, else an even one."""
        if self.layers_per_stage is not None:
            return list(self.layers_per_stage)
        return [self.layers // self.n_stages] * self.n_stages

    def layers_of_stage(self, stage: int) -> range:
        counts = self.stage_layer_counts()
        first = sum(counts[:stage])
        return range(first, first + counts[stage])

    def stage_of_layer(self, layer: int) -> int:
        return next(s for s in range(self.n_stages) if layer in self.layers_of_stage(s))

    # ---- checks --------------------------------------------------------------------
    def validate(self) -> "CaptureConfig":
        """Fill defaults and raise CaptureError (one line) for impossible combinations."""
        self.schedule = schedule_by_name(self.schedule)
        if self.framework not in FRAMEWORK_SCHEDULES:
            raise CaptureError(f"unknown framework {self.framework!r}; choose one of {', '.join(FRAMEWORKS)}")
        if self.schedule not in FRAMEWORK_SCHEDULES[self.framework]:
            raise CaptureError(
                f"--framework {self.framework} has no {self.schedule} schedule; it has "
                f"{', '.join(FRAMEWORK_SCHEDULES[self.framework])}"
            )
        if self.compute not in COMPUTE_MODES:
            raise CaptureError(f"unknown compute mode {self.compute!r}; use --compute emulated or --compute real")
        if self.hidden is None:
            self.hidden = DEFAULT_HIDDEN[self.compute]
        if self.stages_per_rank is None:
            self.stages_per_rank = 1 if self.schedule in SINGLE_STAGE else 2
        p, v, m = self.ranks, self.stages_per_rank, self.microbatches
        if p < 2:
            raise CaptureError(f"-p/--pipeline-ranks must be at least 2 (got {p}); a pipeline needs 2 stages")
        if p > 64:
            raise CaptureError(f"-p/--pipeline-ranks {p} is too many processes for one machine; use 64 or fewer")
        if v < 1:
            raise CaptureError(f"--stages-per-rank must be at least 1 (got {v})")
        if m < 1:
            raise CaptureError(f"--microbatches must be at least 1 (got {m})")
        if self.steps < 1:
            raise CaptureError(f"--steps must be at least 1 (got {self.steps})")
        if self.schedule in SINGLE_STAGE and v != 1:
            raise CaptureError(
                f"{self.schedule} runs one stage per rank; drop --stages-per-rank {v} "
                "or pick Interleaved1F1B / LoopedBFS / InterleavedZeroBubble"
            )
        if self.schedule not in SINGLE_STAGE and v < 2 and self.schedule != "LoopedBFS":
            raise CaptureError(
                f"{self.schedule} needs at least 2 stages per rank; use --stages-per-rank 2 "
                "(or --schedule 1F1B for one stage per rank)"
            )
        if self.schedule in V_PLACEMENT and v != 2:
            raise CaptureError(
                f"{self.schedule} needs exactly 2 stages per rank (V placement); use --stages-per-rank 2"
            )
        if self.schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
            rounds = max(1, m // p)
            if m % rounds:
                raise CaptureError(
                    f"{self.schedule} needs --microbatches to be a multiple of its rounds "
                    f"(m // p = {rounds}); got m={m}, p={p}; use e.g. -m {p * rounds}"
                )
        if self.schedule in V_PLACEMENT and m < p * v:
            raise CaptureError(
                f"{self.schedule} needs at least as many microbatches as stages "
                f"(m={m} < {p * v} stages); use -m {p * v} or more"
            )
        if self.layers_per_stage is not None:
            self._check_layers_per_stage()
        elif self.layers < self.n_stages or self.layers % self.n_stages:
            raise CaptureError(
                f"--layers {self.layers} does not split evenly into {self.n_stages} stages "
                f"(p*v); use a multiple of {self.n_stages}"
            )
        if self.layer_ms < 0:
            raise CaptureError(f"--layer-ms must be >= 0 (got {self.layer_ms})")
        if self.compute == "real" and self.slow_stage is not None:
            raise CaptureError("--slow-stage scales the emulated per-layer cost; use it with --compute emulated")
        if self.slow_stage is not None and not 0 <= self.slow_stage < self.n_stages:
            raise CaptureError(f"--slow-stage {self.slow_stage} is not a stage (stages are 0..{self.n_stages - 1})")
        self._check_3d()
        if self.slow_factor <= 0:
            raise CaptureError(f"--slow-factor must be > 0 (got {self.slow_factor})")
        if self.layer_labels and (self.schedule != "1F1B" or self.framework != "torch" or self.compute != "emulated"):
            raise CaptureError(
                "--layer-labels labels the emulated layers of torch's 1F1B (which leaves no labels "
                "of its own); use it with --schedule 1F1B and --compute emulated"
            )
        self._check_layer_kind()
        if self.profile_memory and self.framework != "torch":
            raise CaptureError("--profile-memory is recorded by tracekit's own torch ranks; drop --framework")
        if self.profile_memory and self.p2p_delay_ms:
            # torch records memory events only without profile_all_threads, and the delayed
            # sends run on a thread of their own
            raise CaptureError("--profile-memory records the main thread only; drop --p2p-delay-ms")
        if self.p2p_delay_ms < 0:
            raise CaptureError(f"--p2p-delay-ms must be >= 0 (got {self.p2p_delay_ms})")
        if self.p2p_delay_ms and self.framework == "deepspeed":
            # the delay is injected into torch.distributed.isend, which DeepSpeed's blocking P2P never calls
            raise CaptureError(
                "--p2p-delay-ms is not available with --framework deepspeed "
                "(its P2P is blocking deepspeed.comm send/recv); drop it"
            )
        if self.hidden < 1 or self.microbatch_size < 1:
            raise CaptureError("--hidden and --microbatch-size must be at least 1")
        self._check_device()
        if self.schedule == "PipeDream2BW" and m < p:
            # two weight buffers suffice only while every microbatch in flight at an update
            # (up to p-1 of them on stage 0) started after the previous update
            raise CaptureError(
                f"PipeDream2BW keeps two weight versions, which needs --microbatches >= -p/--pipeline-ranks "
                f"(a weight update every m microbatches; got m={m}, p={p}); use -m {p} or more"
            )
        if self.attention_share is not None and self.schedule != "TeraPipe":
            raise CaptureError(
                "--attention-share sets TeraPipe's per-slice cost growth; use it with --schedule TeraPipe"
            )
        if self.schedule == "TeraPipe":
            if self.attention_share is None:
                self.attention_share = DEFAULT_ATTENTION_SHARE
            if not 0 <= self.attention_share <= 1:
                raise CaptureError(f"--attention-share must be within [0, 1] (got {self.attention_share:g})")
        return self

    def _check_3d(self) -> None:
        tp, dp = self.tensor_parallel, self.data_parallel
        if tp < 1 or dp < 1:
            raise CaptureError(f"--tensor-parallel and --data-parallel must be at least 1 (got {tp}, {dp})")
        if self.world_size > 64:
            raise CaptureError(
                f"-p {self.ranks} x --tensor-parallel {tp} x --data-parallel {dp} = {self.world_size} "
                "processes is too many for one machine; use 64 or fewer"
            )
        if self.slow_replica is not None:
            if self.slow_stage is not None:
                raise CaptureError("--slow-replica and --slow-stage share --slow-factor; give one of them")
            if self.compute != "emulated":
                raise CaptureError("--slow-replica scales the emulated per-layer cost; use it with --compute emulated")
            if not 0 <= self.slow_replica < dp:
                raise CaptureError(f"--slow-replica {self.slow_replica} is not a replica (replicas are 0..{dp - 1})")
        if not (self.is_3d or self.recompute):
            return
        self._torch_schedules_only("--tensor-parallel, --data-parallel and --recompute run", "drop them")
        if self.device != "cpu":
            raise CaptureError("--tensor-parallel, --data-parallel and --recompute run on the CPU; drop --device cuda")
        if self.layer_labels and tp > 1:
            raise CaptureError("--layer-labels labels whole layers; drop it with --tensor-parallel")
        if self.schedule in SPLIT_BACKWARD and (dp > 1 or self.recompute):
            # the gradient buckets count full backwards; I/W split them (not handled)
            raise CaptureError(
                f"--data-parallel and --recompute need a schedule with a full backward; {self.schedule} splits it"
            )
        if tp > 1:
            assert self.hidden is not None
            if self.hidden % tp:
                raise CaptureError(f"--hidden {self.hidden} does not split over --tensor-parallel {tp}")
            odd = [c for c in self.stage_layer_counts() if c % 2]
            if odd:
                # Megatron's MLP: a column-parallel layer, then a row-parallel one
                raise CaptureError(
                    f"--tensor-parallel pairs each stage's layers (column- then row-parallel) and needs an "
                    f"even number of layers per stage; got {self.stage_layer_counts()}"
                )

    def _torch_schedules_only(self, what: str, fix: str) -> None:
        """Refuse (``what``: the options and their verb) anything but torch.distributed.pipelining's
        own schedules: a framework's ranks or a design loop."""
        if self.framework != "torch" or self.schedule in DESIGNS:
            ran = self.framework if self.framework != "torch" else self.schedule
            raise CaptureError(f"{what} torch.distributed.pipelining's schedules (not {ran}); {fix}")

    def _check_device(self) -> None:
        if self.device not in DEVICES:
            raise CaptureError(f"unknown device {self.device!r}; use --device cpu or --device cuda")
        if self.with_stack and self.framework == "deepspeed":
            raise CaptureError("--with-stack is recorded by tracekit's own torch and Megatron ranks; drop --framework")
        if self.device == "cpu":
            return
        # the design loops and the frameworks' ranks compute on the CPU only
        self._torch_schedules_only("--device cuda runs", "drop it or pick one of those")
        if self.compute != "real":
            raise CaptureError(
                "--device cuda needs --compute real (the emulated costs are host sleeps, which leave the GPU idle)"
            )
        if self.profile_memory:
            raise CaptureError("--profile-memory is recorded on the CPU captures only; drop it with --device cuda")

    def _check_layer_kind(self) -> None:
        if self.layer_kind not in LAYER_KINDS:
            raise CaptureError(f"unknown --layer-kind {self.layer_kind!r}; choose one of {', '.join(LAYER_KINDS)}")
        if self.layer_kind == "linear":
            return
        self._torch_schedules_only(f"--layer-kind {self.layer_kind} runs with", "drop it or pick one of those")
        if self.compute != "emulated" or self.layer_labels or self.tensor_parallel > 1:
            raise CaptureError(
                f"--layer-kind {self.layer_kind} builds emulated layers of its own: drop --compute real, "
                "--layer-labels and --tensor-parallel"
            )

    def _check_layers_per_stage(self) -> None:
        counts = self.layers_per_stage or ()
        given = ",".join(str(c) for c in counts)
        if self.framework != "torch" or self.schedule in DESIGNS:
            # the design loops and the frameworks' manifests describe even splits only
            raise CaptureError(
                f"--layers-per-stage runs with torch.distributed.pipelining's schedules "
                f"(--framework torch, not {self.framework if self.framework != 'torch' else self.schedule}); "
                "drop it or pick one of those"
            )
        if len(counts) != self.n_stages:
            raise CaptureError(
                f"--layers-per-stage {given} gives {len(counts)} stages but {self.schedule} with p={self.ranks} "
                f"v={self.v} has p*v = {self.n_stages}; give one count per stage"
            )
        if any(c < 1 for c in counts):
            raise CaptureError(f"--layers-per-stage {given}: every stage needs at least 1 layer")
        if sum(counts) != self.layers:
            raise CaptureError(
                f"--layers-per-stage {given} sums to {sum(counts)} layers but the model has "
                f"--layers {self.layers}; make the counts add up to {self.layers}"
            )

    def profiler_schedule(self) -> dict[str, int]:
        """torch.profiler.schedule arguments. torch schedules skip step 0 (PipelineStage
        shape inference) and step 1 (warm-up). PipeDream-2BW's step 0 is no training step but
        a warm-up exchange (one message each way per link, a barrier) with the profiler
        warming up: its first recorded step is the pipeline's start, so the initial fill is
        in the trace, which a flush-free pipeline only has once."""
        if self.schedule == "PipeDream2BW":
            return {"wait": 0, "warmup": 1, "active": self.steps}
        return {"wait": 1, "warmup": 1, "active": self.steps}

    def slice_factor(self, microbatch: int) -> float:
        """TeraPipe: slice ``microbatch``'s cost relative to the mean slice,
        ``a + b*(i+0.5)/m`` with ``a = 1 - s``, ``b = 2s`` (s = attention share): attention
        over the prefix grows linearly with the slice's position, the rest does not."""
        if self.schedule != "TeraPipe":
            return 1.0
        s = self.attention_share if self.attention_share is not None else DEFAULT_ATTENTION_SHARE
        return (1 - s) + 2 * s * (microbatch + 0.5) / self.microbatches

    # ---- emulated costs (ms) -------------------------------------------------------
    def stage_factor(self, stage: int) -> float:
        return self.slow_factor if self.slow_stage is not None and stage == self.slow_stage else 1.0

    def replica_factor(self, replica: int) -> float:
        return self.slow_factor if self.slow_replica is not None and replica == self.slow_replica else 1.0

    def layer_costs_ms(self, stage: int, replica: int = 0) -> dict[str, float]:
        """Per-layer sleep of forward, input-grad and weight-grad for ``stage`` of data-parallel
        ``replica`` (emulated), on each of its tensor-parallel ranks: TP splits a layer's
        work, so each TP rank sleeps layer_ms / tensor_parallel."""
        f = 0.0
        if self.compute == "emulated":
            f = self.layer_ms * self.stage_factor(stage) * self.replica_factor(replica) / self.tensor_parallel
        return {"forward": f, "input_grad": f, "weight_grad": f}

    # ---- provenance ----------------------------------------------------------------
    def command_line(self, out: str) -> str:
        """A command line that reproduces this capture (explicit about everything non-default)."""
        parts = ["tracekit", "capture", "-o", str(out)]
        if self.framework != "torch":
            parts += ["--framework", self.framework]
        parts += ["--schedule", self.schedule, "-p", str(self.ranks), "-m", str(self.microbatches)]
        default_v = 1 if self.schedule in SINGLE_STAGE else 2
        if self.stages_per_rank != default_v:
            parts += ["-v", str(self.stages_per_rank)]
        parts += ["--steps", str(self.steps)]
        if self.compute != "emulated":
            parts += ["--compute", self.compute]
        if self.compute == "emulated" and self.layer_ms != 3.0:
            parts += ["--layer-ms", _num(self.layer_ms)]
        if self.layers != 16:
            parts += ["--layers", str(self.layers)]
        if self.layer_kind != "linear":
            parts += ["--layer-kind", self.layer_kind]
        if self.layers_per_stage is not None:
            parts += ["--layers-per-stage", ",".join(str(c) for c in self.layers_per_stage)]
        if self.hidden != DEFAULT_HIDDEN[self.compute]:
            parts += ["--hidden", str(self.hidden)]
        if self.microbatch_size != 8:
            parts += ["--microbatch-size", str(self.microbatch_size)]
        if self.slow_stage is not None:
            parts += ["--slow-stage", str(self.slow_stage), "--slow-factor", _num(self.slow_factor)]
        if self.p2p_delay_ms:
            parts += ["--p2p-delay-ms", _num(self.p2p_delay_ms)]
        if self.layer_labels:
            parts += ["--layer-labels"]
        if self.profile_memory:
            parts += ["--profile-memory"]
        if self.device != "cpu":
            parts += ["--device", self.device]
        if self.with_stack:
            parts += ["--with-stack"]
        if self.seed != 0:
            parts += ["--seed", str(self.seed)]
        if self.tensor_parallel != 1:
            parts += ["--tensor-parallel", str(self.tensor_parallel)]
        if self.data_parallel != 1:
            parts += ["--data-parallel", str(self.data_parallel)]
        if self.slow_replica is not None:
            parts += ["--slow-replica", str(self.slow_replica), "--slow-factor", _num(self.slow_factor)]
        if self.recompute:
            parts += ["--recompute"]
        share = self.attention_share
        if self.schedule == "TeraPipe" and share is not None and share != DEFAULT_ATTENTION_SHARE:
            parts += ["--attention-share", _num(share)]
        return shlex.join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_layers_per_stage(text: str | None) -> tuple[int, ...] | None:
    """``"6,4,3,3"`` -> ``(6, 4, 3, 3)``; None stays None; anything else is a CaptureError."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CaptureError(
            f"--layers-per-stage {text!r}: give whole layer counts separated by commas, e.g. 6,4,3,3"
        ) from None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def manifest_head(config: CaptureConfig, command: str, torch_version: str) -> dict[str, Any]:
    """The part of capture.json every profiler writes alike: what ran, where, how shaped."""
    from tracekit.version import __version__

    return {
        "tracekit_version": __version__,
        "command": command,
        "torch_version": torch_version,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "framework": config.framework,
        "schedule": config.schedule,
        "schedule_class": (
            f"tracekit.capture.designs.{SCHEDULES[config.schedule]}"
            if config.schedule in DESIGNS
            else f"torch.distributed.pipelining.{SCHEDULES[config.schedule]}"
        ),
        "p": config.ranks,
        # every process: p x TP x DP (tracekit reads a run's rank count from it)
        "world_size": config.world_size,
        "v": config.v,
        "m": config.microbatches,
        "n_stages": config.n_stages,
        "placement": config.placement,
        # the first pipeline's (TP rank 0, replica 0) global ranks; layout has every pipeline
        "stage_to_rank": [config.global_rank(0, 0, config.stage_to_rank(s)) for s in range(config.n_stages)],
        "steps": config.steps,
    }
