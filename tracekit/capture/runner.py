"""Start the ranks of a capture and write its folder: rank<R>.json.gz + capture.json."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from tracekit.capture.config import DESIGNS, SPLIT_BACKWARD, CaptureConfig, manifest_head
from tracekit.capture.files import write_text
from tracekit.errors import CaptureError

EMULATED_HOW = (
    "real training (real Linear matmuls, real gloo P2P, SGD) with each layer's cost set by "
    "sleeps in two autograd Functions: TracekitEmuCompute on the layer output (forward "
    "sleeps layer_ms; its backward sleeps layer_ms on the input-grad path) and "
    "TracekitEmuWeightGrad on the weight (backward sleeps layer_ms on the weight-grad path). "
    "A full backward B = 2x forward; split schedules: I = 1x, W = 1x "
    "(torch runs stage 0's whole backward in W and leaves its I empty)."
)
REAL_HOW = "plain Linear+ReLU matmuls, no sleeps; processes time-slice the CPU cores"
GPU_HOW = (
    "plain Linear+ReLU matmuls on GPU 0, no sleeps; every rank's process shares the one GPU "
    "(time-sliced, no MPS). P2P is gloo over 127.0.0.1, not NCCL (NCCL refuses two ranks on "
    "one device): each stage copies its input to the GPU (aten::to, host-to-device memcpy) and "
    "its output back (device-to-host, which waits for the stage's kernels), so gloo sends host "
    "tensors; the backward's copies run the other way round"
)
P2P_HOW = (
    "every torch.distributed.isend is enqueued on the main thread inside a zero-length "
    "record_function('tracekit:p2p_delay') marker and posted by one FIFO sender thread per "
    "process after sleeping until p2p_delay_ms past the request "
    "(record_function('tracekit:p2p_delay_sleep') on that thread); the message therefore "
    "reaches the receiver late while the sender keeps computing. The real c10d::send and "
    "gloo:send appear on the sender thread (profile_all_threads=True). Receives are untouched."
)


def _log(msg: str) -> None:
    print(f"tracekit capture: {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET
        return port


def import_torch() -> None:
    """Check that torch, torch.distributed and numpy import; a CaptureError line if not
    (callers then ``import torch`` themselves)."""
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except ImportError as err:
        raise CaptureError(
            f"capture needs PyTorch ({err.name or 'torch'} is not importable); "
            "install it with: pip install 'tracekit[capture]'"
        ) from None
    import torch

    if not torch.distributed.is_available():
        raise CaptureError(
            "this PyTorch build has no torch.distributed; install the official wheel: pip install 'tracekit[capture]'"
        )
    try:
        import numpy  # noqa: F401  (PipelineStage shape inference uses recv_object_list)
    except ImportError:
        raise CaptureError("capture needs numpy (PipelineStage shape inference); pip install numpy") from None


def run_capture(config: CaptureConfig, out_dir: str | Path, *, command_out: str | None = None) -> Path:
    """Run a profiled pipeline-parallel training on ``config.ranks`` local processes.

    Writes ``rank<R>.json.gz`` for every rank and ``capture.json`` into ``out_dir`` and
    returns that folder. Raises CaptureError (one line) for anything the user can fix.
    """
    config.validate()
    import_torch()
    import torch

    if config.device == "cuda" and not torch.cuda.is_available():
        raise CaptureError(
            f"--device cuda: this PyTorch ({torch.__version__}) sees no CUDA GPU; "
            "run on a machine with one, or drop --device"
        )

    from tracekit.capture import worker

    out = prepare_out_dir(out_dir)
    cmd = config.command or config.command_line(command_out if command_out is not None else str(out))

    dims = (
        f" (pipeline {config.ranks} x TP {config.tensor_parallel} x DP {config.data_parallel}, order tp-dp-pp)"
        if config.is_3d
        else ""
    )
    _log(
        f"spawning {config.world_size} ranks{dims}: {config.schedule}, p={config.ranks} v={config.v} "
        f"m={config.microbatches}, {config.n_stages} stages ({config.placement} placement), "
        f"{config.compute} compute on {'GPU 0' if config.device == 'cuda' else 'the CPU'}, gloo on 127.0.0.1"
    )
    t0 = time.perf_counter()
    spawn_ranks(worker.run_rank, (config.to_dict(), str(out.resolve())), config.world_size)
    _log(f"ranks finished in {time.perf_counter() - t0:.1f} s; writing capture.json")
    files = trace_files(out, config.world_size)
    losses = take_losses(out)
    measured = take_parallel_times(out)

    meta = {
        **manifest_head(config, cmd, torch.__version__),
        "profiler": profiler_manifest(config),
        "backend": "gloo",
        "compute": compute_manifest(config),
        "faults": faults_manifest(config),
        **({"design": design_manifest(config)} if config.schedule in DESIGNS else {}),
        "labels": (
            "hand-written per-layer ranges: record_function('linear<i>(F)') around each layer's "
            "forward, 'linear<i>(B)' around each of its two backward sleeps, and one "
            f"'{config.schedule}' range around every training step"
            if config.layer_labels
            else "none added by the capture (the schedule's own, if any)"
        ),
        **({"layout": layout_manifest(config, measured)} if config.is_3d or config.recompute else {}),
        "seed": config.seed,
        "losses_per_step": losses,
        "created": utc_now(),
        "files": files,
    }
    write_manifest(out, meta, files)
    return out


# ---------------------------------------------------------------------------------------
# the parts every capture runner shares (this one and tracekit.capture.frameworks)
# ---------------------------------------------------------------------------------------
def prepare_out_dir(out_dir: str | Path) -> Path:
    """The output folder, made if missing and emptied of an earlier capture's traces."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CaptureError(f"--out {out} exists and is not a folder; pick a folder path")
    out.mkdir(parents=True, exist_ok=True)
    stale = sorted(out.glob("rank*.json*")) + sorted(out.glob(".*.rank*.json"))
    for f in stale:  # never leave a mix of two captures in one folder
        f.unlink()
    if stale:
        _log(f"removed {len(stale)} trace file(s) of an earlier capture in {out}")
    return out


def spawn_ranks(entry: Callable[..., None], args: tuple[object, ...], nprocs: int) -> None:
    """``torch.multiprocessing.spawn(entry, args + (port,))`` on a free port, retried when
    another process takes the port first; a failed rank becomes one CaptureError line."""
    from torch.multiprocessing.spawn import spawn as torch_spawn

    # torch's spawn has no annotations: typed as called here (it returns None with join=True)
    spawn = cast("Callable[..., object]", torch_spawn)
    last_err: Exception | None = None
    for _attempt in range(3):
        port = _free_port()
        try:
            spawn(entry, args=(*args, port), nprocs=nprocs, join=True)
            return
        except Exception as err:  # ProcessRaisedException / ProcessExitedException
            last_err = err
            text = str(err)
            if "Address already in use" in text or "EADDRINUSE" in text:
                _log(f"port {port} was taken, retrying")
                continue
            break
    assert last_err is not None
    lines = [ln.strip() for ln in str(last_err).strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else type(last_err).__name__
    raise CaptureError(
        f"a rank failed during capture ({summary}); see the traceback above, or try fewer -p/--pipeline-ranks / another --schedule"
    ) from None


def trace_files(out: Path, ranks: int) -> list[str]:
    """The names of the ranks' traces, all of which must have been written."""
    files = [f"rank{r}.json.gz" for r in range(ranks)]
    missing = [f for f in files if not (out / f).exists()]
    if missing:
        raise CaptureError(f"capture finished but {', '.join(missing)} were not written to {out}")
    return files


def take_losses(out: Path) -> list[float]:
    """The per-step losses the last stage left in ``.losses.rank<R>.json`` (the file is removed)."""
    losses: list[float] = []
    for f in sorted(out.glob(".losses.rank*.json")):
        losses = json.loads(f.read_text())
        f.unlink()
    return losses


def take_parallel_times(out: Path) -> dict[str, dict[str, Any]]:
    """Each rank's ``.parallel.rank<R>.json`` (the 3-D clock), by rank; the files are removed."""
    times: dict[str, dict[str, Any]] = {}
    for f in sorted(out.glob(".parallel.rank*.json"), key=lambda f: int(f.name.split("rank")[1].split(".")[0])):
        times[f.name.split("rank")[1].split(".")[0]] = json.loads(f.read_text())
        f.unlink()
    return times


TP_HOW = (
    "each stage's layers in pairs, as Megatron's MLP: a column-parallel Linear (output features "
    "sharded over the TP group; its input through _CopyToModelParallelRegion: identity forward, "
    "torch.distributed.all_reduce of the input grad in the backward), ReLU, a row-parallel Linear "
    "(input features sharded; its partial output through _ReduceFromModelParallelRegion: "
    "all_reduce in the forward, identity backward; bias added after the reduce): the class "
    "names and semantics of megatron/core/tensor_parallel/mappings.py. Shards cut from the same full layers (same maths); each TP "
    "rank's emulated sleeps are layer_ms / tensor_parallel. On stage 0 the first pair's input "
    "needs no grad, so its backward all-reduce does not run."
)
DP_HOW = (
    "tracekit's own bucketed gradient all-reduce (not torch DDP, which torch.distributed.pipelining "
    "also supports): one bucket per Linear layer, last layer first; each parameter's "
    "post-accumulate-grad hook counts backwards, and when every parameter of a bucket has had its "
    "m-th (the last microbatch's backward) the bucket's flat gradient is all-reduced with "
    "async_op=True on the DATA_PARALLEL_GROUP (Megatron overlap_grad_reduce / DDP buckets); all "
    "buckets are waited on after the schedule and before Optimizer.step, then divided by "
    "data_parallel. Step 0 (shape inference runs one more backward) launches its buckets at the wait."
)
RECOMPUTE_HOW = (
    "torch.utils.checkpoint.checkpoint(stage_layers, x, use_reentrant=False) around each stage's "
    "layers: the forward keeps only the stage input; the backward re-runs the stage's forward "
    "(its matmuls and emulated forward sleeps, TP all-reduces included) before its own work"
)


def layout_manifest(config: CaptureConfig, measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """capture.json's ``layout``: the 3-D shape, every group, every rank's coordinates, and the
    wall time each rank measured in its TP / DP collectives and recomputation per step."""
    ranks = {}
    for rank in range(config.world_size):
        tp_rank, dp_rank, pp_rank = config.coords(rank)
        ranks[str(rank)] = {
            "tp_rank": tp_rank,
            "dp_rank": dp_rank,
            "pp_rank": pp_rank,
            "stages": config.stages_of_rank(pp_rank),
        }
    return {
        "tp": config.tensor_parallel,
        "dp": config.data_parallel,
        "pp": config.ranks,
        "world_size": config.world_size,
        "order": "tp-dp-pp",
        "rank_formula": "rank = tp_rank + tp * dp_rank + tp * dp * pp_rank (megatron/core/parallel_state.py)",
        "groups": config.process_groups() if config.is_3d else [],
        "groups_how": (
            "torch.distributed.new_group(ranks, group_desc=<Megatron's description>) for every group, "
            "in the order listed, on every rank; PipelineStage(group=<its PP group>)"
            if config.is_3d
            else "the default group only (one pipeline)"
        ),
        "ranks": ranks,
        "slow_replica": config.slow_replica,
        "slow_replica_factor": config.slow_factor if config.slow_replica is not None else None,
        "tensor_parallel_how": TP_HOW if config.tensor_parallel > 1 else None,
        "data_parallel_how": DP_HOW if config.data_parallel > 1 else None,
        "recompute_how": RECOMPUTE_HOW if config.recompute else None,
        "measured_how": (
            "time.perf_counter_ns in each rank around every TP all_reduce (tp_all_reduce_forward / "
            "_backward), every DP all_reduce launch (dp_all_reduce_launch) and wait "
            "(dp_all_reduce_wait), and every recompute of a stage's forward (recompute); ns and "
            "calls per recorded ProfilerStep#N; with --recompute the TP all-reduces a re-run makes count "
            "as tp_all_reduce_forward and lie inside recompute too. dp_buckets: each bucket's launch and wait-end on the "
            "rank's perf_counter clock (not the trace's)."
        ),
        "measured": measured,
    }


def profiler_manifest(config: CaptureConfig) -> dict[str, Any]:
    """capture.json's account of :func:`tracekit.capture.profiling.make_profiler`."""
    return {
        "activities": ["CPU", "CUDA"] if config.device == "cuda" else ["CPU"],
        "record_shapes": True,
        "with_stack": config.with_stack,
        "profile_memory": config.profile_memory,
        "profile_all_threads": not config.profile_memory,
        "schedule": config.profiler_schedule(),
    }


def compute_manifest(config: CaptureConfig) -> dict[str, Any]:
    """capture.json's account of the model and its costs (:mod:`tracekit.capture.model`)."""
    per_layer = config.layer_costs_ms(0)
    return {
        "mode": config.compute,
        "layer_ms": config.layer_ms if config.compute == "emulated" else None,
        "per_layer_ms": (
            {
                "forward": per_layer["forward"],
                "backward_full": 2 * per_layer["forward"],
                "input_grad": per_layer["input_grad"],
                "weight_grad": per_layer["weight_grad"],
            }
            if config.compute == "emulated"
            else None
        ),
        "layers": config.layers,
        # what one layer is (tracekit.capture.model): linear, sleep-linear or transformer
        "layer_kind": config.layer_kind,
        # one number for an even split (as before), the per-stage list for an uneven one
        "layers_per_stage": (
            list(config.layers_per_stage) if config.layers_per_stage is not None else config.layers // config.n_stages
        ),
        "hidden": config.hidden,
        "microbatch_size": config.microbatch_size,
        "init": "kaiming_normal (relu) weights, zero bias, same seed on every rank",
        "torch_threads_per_rank": 1,
        "flush_denormal": True,
        "optimizer": "SGD lr=1e-3, one step per training step",
        "loss": "MSELoss on the last stage",
        "split_backward": config.schedule in SPLIT_BACKWARD,
        "device": config.device,
        "how": EMULATED_HOW if config.compute == "emulated" else (GPU_HOW if config.device == "cuda" else REAL_HOW),
    }


def faults_manifest(config: CaptureConfig) -> dict[str, Any]:
    return {
        "slow_stage": config.slow_stage,
        "slow_factor": config.slow_factor if config.slow_stage is not None else None,
        "p2p_delay_ms": config.p2p_delay_ms,
        "how": _fault_how(config),
    }


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_manifest(out: Path, meta: dict[str, Any], files: list[str]) -> None:
    write_text(out / "capture.json", json.dumps(meta, indent=2) + "\n")
    size = sum((out / f).stat().st_size for f in files)
    _log(f"wrote {len(files)} traces ({size / 1e6:.2f} MB) and capture.json to {out}")


LOOP_HOW = (
    "tracekit's own loop (tracekit/capture/designs.py; torch.distributed.pipelining has no such "
    "schedule): one stage per rank, real autograd, torch.distributed.isend/irecv over gloo "
    "(tag = the microbatch id), SGD lr=1e-3; every action labelled record_function('PP:<stage>F<mb>') "
    "/ 'PP:<stage>B<mb>' as torch's runtime schedules label theirs, the label holding the receive "
    "wait, the compute and the send's post; sends waited on at the end of the run (2BW) or step (TeraPipe)"
)


def design_manifest(config: CaptureConfig) -> dict[str, Any]:
    """capture.json's ``design``: what the design loop ran, its order and its costs."""
    m, steps = config.microbatches, config.steps
    per_layer = config.layer_costs_ms(0)["forward"]
    layers = config.layers // config.n_stages
    if config.schedule == "PipeDream2BW":
        return {
            "name": "PipeDream-2BW",
            "paper": "Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021",
            "runtime": LOOP_HOW,
            "order": (
                "per stage r: p-r-1 warm-up forwards, then one forward one backward with no flush "
                "between weight updates; microbatch ids count on across updates (0..n-1)"
            ),
            "microbatches_total": (steps + 1) * m,
            "weight_update_every_microbatches": m,
            "weight_versions": 2,
            "update_rule": (
                "each stage keeps two weight buffers; a microbatch's forward runs on the newest "
                "version and its backward on the same (stashed) version; after every m-th "
                "backward the gradients of those m backwards (summed over both buffers) update a "
                "copy of the newest version written into the other buffer, which is free: every "
                "microbatch that used its version has finished (checked at run time; needs m >= p)"
            ),
            "profiler_steps": (
                "ProfilerStep#0 is a warm-up (one message each way per link, a barrier; "
                "profiler warming up, not recorded); ProfilerStep#1..#{0} each end at this "
                "rank's weight update 1..{0} (recorded); update {1} (not recorded) drains the "
                "pipeline"
            ).format(steps, steps + 1),
            "losses_per_step": "mean MSE of the m microbatches before each weight update (last stage)",
        }
    factors = [config.slice_factor(i) for i in range(m)]
    fwd = [round(per_layer * f * layers, 4) for f in factors]
    share = config.attention_share
    assert share is not None  # validate() sets TeraPipe's default
    return {
        "name": "TeraPipe",
        "paper": "Li et al., TeraPipe: Token-Level Pipeline Parallelism for Training Large-Scale Language "
        "Models, ICML 2021",
        "runtime": LOOP_HOW,
        "sequence": (
            f"each step is one sequence of {m * config.microbatch_size} tokens cut into m={m} "
            f"slices of {config.microbatch_size} tokens (microbatch i = slice i)"
        ),
        "attention": (
            "every layer is the emulated Linear followed by causal attention over the tokens "
            "seen so far (earlier slices' keys as detached leaves, then the slice's own); a "
            "later slice's backward leaves gradient on earlier slices' keys, which slice i's "
            "backward then pushes through its own graph"
        ),
        "order": "every stage: F0 F1 ... F(m-1), then B(m-1) ... B0 (backwards last slice first); "
        "one SGD update per sequence",
        "attention_share": config.attention_share,
        "cost_model": (
            "slice i's per-layer sleeps (forward, input-grad, weight-grad) = layer_ms x "
            "(a + b*(i+0.5)/m), a = 1 - attention_share, b = 2*attention_share: the mean slice "
            "costs layer_ms, attention's part grows with the prefix"
        ),
        "a": 1 - share,
        "b": 2 * share,
        "slice_factor": [round(f, 6) for f in factors],
        "per_slice_stage_ms": {"forward": fwd, "backward_full": [2 * x for x in fwd]},
    }


def _fault_how(config: CaptureConfig) -> str:
    parts = []
    if config.slow_stage is not None:
        parts.append(
            f"stage {config.slow_stage}'s emulated per-layer sleeps (forward, input-grad, "
            f"weight-grad) multiplied by {config.slow_factor:g}"
        )
    if config.p2p_delay_ms > 0:
        parts.append(P2P_HOW)
    return "; ".join(parts) if parts else "none injected"
