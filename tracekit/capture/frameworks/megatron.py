"""Capture Megatron-core's own pipeline schedules on CPU (gloo over 127.0.0.1).

``run_capture(cfg, out, profiler)`` runs ``forward_backward_pipelining_without_interleaving``
(1F1B) or ``forward_backward_pipelining_with_interleaving`` (Interleaved1F1B) from
``megatron.core.pipeline_parallel.schedules`` on ``cfg.ranks`` local processes, with
Megatron's own ``P2PCommunicator`` (``batch_isend_irecv``) moving activations and
gradients. The model and its costs are those of every other capture: 16 Linear layers
with the emulated per-layer sleeps of :mod:`tracekit.capture.worker`, split into p·v
chunks; chunk c of rank r is stage c·p + r (Megatron's interleaved placement).

Megatron writes no label of its own into a torch.profiler trace, and the capture adds
none. What ran is recorded beside the trace instead: ``forward_step`` and
``backward_step`` in Megatron's schedules module are wrapped by plain Python functions
that append (kind, stage, chunk, microbatch) to a list per profiled step; that list goes
to ``capture.json["executed_order"]`` and is the ground truth for tests.

CPU shim (megatron-core 0.16.1 asks for CUDA in four places; each request is answered
with the CPU, nothing else changes):
  * ``schedules.py:596, 983, 2138`` ``torch.zeros([], dtype=torch.int, device="cuda")``
    (the token counter): ``torch.zeros`` maps ``device="cuda"`` to the CPU;
  * ``p2p_communication.py:313, 321`` receive buffers on ``torch.cuda.current_device()``:
    ``torch.cuda.current_device`` returns the CPU device;
  * ``p2p_communication.py:398`` ``torch.cuda.synchronize()`` after ``batch_isend_irecv``:
    not patched, switched off by Megatron's own ``batch_p2p_sync=False`` (gloo's
    ``wait()`` is synchronous, so there is no race to protect against);
  * under nsys only, ``utils.py:2186, 2215`` ``torch.cuda.nvtx.range_push/range_pop``
    (the schedule-phase ranges): CPU torch has no NVTX, so they go to the ``nvtx``
    package's ``push_range`` / ``pop_range``, the same NVTX calls from another library.
Without the shim the first two raise "Torch not compiled with CUDA enabled".

NVTX under nsys: megatron-core's ``nvtx_decorator`` (``utils.py:2255``) decides at
import time whether to wrap the P2P methods, and ``import megatron.core`` already
imports ``p2p_communication``; so the capture calls ``configure_nvtx_profiling(True)``
and then reloads ``p2p_communication`` and ``schedules``, which is what a process that
enabled NVTX before importing Megatron would have. Op ranges come from
:class:`tracekit.capture.nsys.NvtxOpEmitter`, as in the torch nsys capture.

Also runnable as ``python -m tracekit.capture.frameworks.megatron CONFIG_JSON OUT_DIR``:
the program nsys launches, which spawns the ranks.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from functools import partial
from importlib.metadata import version as package_version
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from tracekit.capture.config import CaptureConfig, manifest_head
from tracekit.capture.files import gzip_file, write_text
from tracekit.errors import CaptureError

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

#: what a rank's executed-order log holds per action: kind, stage, chunk, microbatch
Action = dict[str, Any]

SCHEDULE_FUNCTIONS = {
    "1F1B": "forward_backward_pipelining_without_interleaving",
    "Interleaved1F1B": "forward_backward_pipelining_with_interleaving",
}
SCHEDULES_MODULE = "megatron.core.pipeline_parallel.schedules"
#: Megatron's tensors are [sequence, microbatch, hidden]; one row of sequence keeps each
#: message the size of the other captures' [microbatch, hidden] ones
SEQ_LENGTH = 1
ORDER_FILE = ".order.rank{rank}.json"
SHIM = [
    "schedules.py:596,983,2138 torch.zeros(..., device='cuda') (token counter): torch.zeros maps "
    "device 'cuda' to the CPU",
    "p2p_communication.py:313,321 receive buffers on torch.cuda.current_device(): "
    "torch.cuda.current_device returns the CPU device",
    "p2p_communication.py:398 torch.cuda.synchronize() after batch_isend_irecv: off through "
    "Megatron's own ModelParallelConfig(batch_p2p_sync=False)",
]
NVTX_SHIM = (
    "utils.py:2186,2215 torch.cuda.nvtx.range_push/range_pop (schedule phases): sent to the nvtx "
    "package's push_range/pop_range, since CPU torch has no NVTX"
)
NVTX_HOW = (
    "megatron.core.utils.configure_nvtx_profiling(True) at rank start, then "
    "importlib.reload of megatron.core.pipeline_parallel.p2p_communication and .schedules: "
    "nvtx_decorator (utils.py:2255) wraps the P2P methods only if NVTX is on when the module is "
    "imported, and `import megatron.core` imports it before anything can turn NVTX on"
)


def _log(msg: str) -> None:
    print(f"tracekit capture (megatron): {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# the parent
# ---------------------------------------------------------------------------------------
def run_capture(cfg: CaptureConfig, out: str, profiler: str) -> Path:
    """Run Megatron-core's ``cfg.schedule`` on ``cfg.ranks`` processes and write the capture.

    ``profiler`` "torch" writes ``rank<R>.json.gz`` per rank, "nsys" one scrubbed
    ``nsys_report.sqlite``; both with ``capture.json``. Returns the folder.
    """
    cfg.validate()
    if cfg.p2p_delay_ms:
        raise CaptureError(
            "--p2p-delay-ms is not supported with --framework megatron "
            "(its sends go through batch_isend_irecv); drop it or use --framework torch"
        )
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise CaptureError(f"--out {folder} exists and is not a folder; pick a folder path")
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("rank*.json*"), *folder.glob(".order.rank*.json"), folder / "nsys_report.sqlite"]:
        if stale.exists():
            stale.unlink()
    cmd = cfg.command or (cfg.command_line(str(folder)) + ("" if profiler == "torch" else f" --profiler {profiler}"))
    t0 = time.perf_counter()
    if profiler == "nsys":
        meta = _capture_under_nsys(cfg, folder)
    else:
        meta = _capture_with_torch_profiler(cfg, folder)
    meta = {**_manifest(cfg, cmd), **meta}
    write_text(folder / "capture.json", json.dumps(meta, indent=2) + "\n")
    _log(f"done in {time.perf_counter() - t0:.1f} s; wrote {', '.join(meta['files'])} and capture.json to {folder}")
    return folder


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET
        return port


def _spawn(cfg: CaptureConfig, work_dir: Path, profiler: str) -> None:
    from torch.multiprocessing.spawn import spawn as torch_spawn

    # torch's spawn has no annotations: typed as called here (it returns None with join=True)
    spawn = cast("Callable[..., object]", torch_spawn)

    _log(
        f"spawning {cfg.ranks} ranks: Megatron-core {SCHEDULE_FUNCTIONS[cfg.schedule]}, p={cfg.ranks} "
        f"v={cfg.v} m={cfg.microbatches}, gloo on 127.0.0.1, profiler {profiler}"
    )
    try:
        spawn(
            _run_rank,
            args=(cfg.to_dict(), str(work_dir.resolve()), _free_port(), profiler),
            nprocs=cfg.ranks,
            join=True,
        )
    except Exception as err:  # ProcessRaisedException / ProcessExitedException
        lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
        raise CaptureError(
            f"a rank failed during the Megatron capture ({lines[-1] if lines else type(err).__name__}); "
            "see the traceback above"
        ) from None


def _collect_order(cfg: CaptureConfig, work_dir: Path) -> tuple[dict[str, Any], list[float]]:
    """The executed order each rank recorded, and the last rank's per-step losses."""
    executed: dict[str, Any] = {}
    losses: list[float] = []
    for rank in range(cfg.ranks):
        path = work_dir / ORDER_FILE.format(rank=rank)
        if not path.exists():
            raise CaptureError(f"rank {rank} finished without recording its executed order ({path.name})")
        record = json.loads(path.read_text())
        path.unlink()
        executed[str(rank)] = record["steps"]
        losses = record["losses"] or losses
    return executed, losses


def _capture_with_torch_profiler(cfg: CaptureConfig, folder: Path) -> dict[str, Any]:
    _spawn(cfg, folder, "torch")
    files = [f"rank{r}.json.gz" for r in range(cfg.ranks)]
    missing = [f for f in files if not (folder / f).exists()]
    if missing:
        raise CaptureError(f"capture finished but {', '.join(missing)} were not written to {folder}")
    executed, losses = _collect_order(cfg, folder)
    return {
        "profiler": {
            "tool": "torch.profiler",
            "activities": ["CPU"],
            "record_shapes": True,
            "with_stack": cfg.with_stack,
            "profile_all_threads": True,
            "schedule": {"wait": 1, "warmup": 1, "active": cfg.steps},
            "nvtx": None,
        },
        "losses_per_step": losses,
        "executed_order": executed,
        "files": files,
    }


def _capture_under_nsys(cfg: CaptureConfig, folder: Path) -> dict[str, Any]:
    from tracekit.capture import nsys

    nsys_bin = nsys.find_nsys()
    try:
        import nvtx  # noqa: F401  (the ranks emit Megatron's ranges through it)
    except ImportError:
        raise CaptureError(f"an nsys capture needs the Python 'nvtx' package: {nsys.NVTX_PACKAGE_HINT}") from None
    with tempfile.TemporaryDirectory(prefix="tracekit-megatron-nsys-") as tmp_name:
        tmp = Path(tmp_name)
        raw, nsys_version = nsys.record_report(nsys_bin, __name__, cfg, tmp)
        rank_pids = {int(k): int(v) for k, v in json.loads((tmp / "rank_pids.json").read_text()).items()}
        removed = nsys.scrub_report(raw, folder / nsys.REPORT_NAME, set(rank_pids.values()))
        executed, losses = _collect_order(cfg, tmp)
    return {
        "profiler": {
            "tool": "nsys",
            "nsys_version": nsys_version,
            "nsys_flags": " ".join(nsys.TRACE_FLAGS),
            "nvtx": {
                "megatron": NVTX_HOW,
                "ops": "tracekit NvtxOpEmitter: emit_nvtx(record_shapes=True)'s range texts written from "
                "Python (this torch has no CUDA, so emit_nvtx cannot run), steps 2.. only",
                "steps": "record_function('ProfilerStep#N') around each traced step (an NVTX range "
                "through NvtxOpEmitter), one mark 'tracekit:rank=R world_size=P' per process",
            },
            "traced_steps": list(range(2, 2 + cfg.steps)),
            "rank_of_pid": {str(pid): rank for rank, pid in sorted(rank_pids.items())},
            "scrubbed": removed,
        },
        "losses_per_step": losses,
        "executed_order": executed,
        "files": [nsys.REPORT_NAME],
    }


def _manifest(cfg: CaptureConfig, cmd: str) -> dict[str, Any]:
    import torch

    from tracekit.capture.runner import compute_manifest, faults_manifest, utc_now

    return {
        **manifest_head(cfg, cmd, torch.__version__),
        "schedule_class": f"{SCHEDULES_MODULE}.{SCHEDULE_FUNCTIONS[cfg.schedule]}",
        "megatron_core_version": package_version("megatron-core"),
        "megatron": {
            "parallel_state": {
                "pipeline_model_parallel_size": cfg.ranks,
                "virtual_pipeline_model_parallel_size": cfg.v if cfg.v > 1 else None,
            },
            "transformer_config": {
                "num_layers": cfg.layers,
                "hidden_size": cfg.hidden,
                "num_attention_heads": 1,
                "pipeline_dtype": "float32",
                "batch_p2p_comm": True,
                "batch_p2p_sync": False,
                "overlap_p2p_comm": False,
                "microbatch_group_size_per_vp_stage": cfg.ranks if cfg.v > 1 else None,
                "deallocate_pipeline_outputs": False,
            },
            "tensor_shape": [SEQ_LENGTH, cfg.microbatch_size, cfg.hidden],
            "p2p": "Megatron's P2PCommunicator: torch.distributed.batch_isend_irecv, which gloo runs as "
            "one isend/irecv per tensor (c10d::send / c10d::recv_ + gloo:send / gloo:recv)",
            "cpu_shim": SHIM,
            "chunk_placement": "chunk c of rank r is stage c*p + r",
        },
        "backend": "gloo",
        "compute": {
            **compute_manifest(cfg),
            "optimizer": "torch.optim.SGD lr=1e-3 over the rank's chunks, one step per training step",
            "loss": "MSELoss on the last stage; Megatron divides it by the microbatch count before backward",
        },
        "faults": faults_manifest(cfg),
        "seed": cfg.seed,
        "executed_order_how": (
            "forward_step and backward_step in megatron.core.pipeline_parallel.schedules wrapped by "
            "plain Python functions (no profiler events): a forward's stage is its model chunk's, its "
            "microbatch Megatron's current_microbatch argument; a backward is the forward whose output "
            "tensor Megatron hands to backward_step. Per rank, per traced step, in execution order."
        ),
        "created": utc_now(),
    }


# ---------------------------------------------------------------------------------------
# inside a rank
# ---------------------------------------------------------------------------------------
def install_cpu_shim(with_nvtx: bool) -> None:
    """Answer Megatron's CUDA device requests with the CPU (see the module docstring)."""
    import torch

    real_zeros = torch.zeros

    def zeros(*size: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return real_zeros(*size, **kwargs)

    # the shim stands in for torch's own functions (typed as theirs): zeros as itself, and
    # current_device answering a device where torch's answers an index (Megatron passes it on
    # as a device argument)
    torch.zeros = cast(Any, zeros)
    torch.cuda.current_device = cast("Callable[[], int]", lambda: torch.device("cpu"))
    if with_nvtx:
        import nvtx

        torch.cuda.nvtx.range_push = nvtx.push_range
        torch.cuda.nvtx.range_pop = nvtx.pop_range


def _schedules_module(with_nvtx: bool) -> ModuleType:
    """Megatron's schedules module; with NVTX, as if NVTX had been on before the import."""
    schedules = importlib.import_module(SCHEDULES_MODULE)
    if with_nvtx:
        from megatron.core import utils as mcore_utils
        from megatron.core.pipeline_parallel import p2p_communication

        mcore_utils.configure_nvtx_profiling(True)
        importlib.reload(p2p_communication)
        schedules = importlib.reload(schedules)
    return schedules


class ExecutedOrder:
    """Wraps ``forward_step`` / ``backward_step`` of Megatron's schedules module and records
    each call as ``{"kind", "stage", "chunk", "microbatch"}`` while ``recording`` is set."""

    def __init__(self, schedules: ModuleType, rank: int, p: int) -> None:
        module: Any = schedules  # Megatron's (unannotated) module, whose two step functions are replaced
        self.actions: list[Action] = []
        self.recording = False
        self._forward_of_output: dict[int, Action] = {}
        real_forward, real_backward = module.forward_step, module.backward_step
        forward_sig, backward_sig = inspect.signature(real_forward), inspect.signature(real_backward)

        def forward_step(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
            call = forward_sig.bind(*args, **kwargs).arguments
            chunk = call.get("vp_stage") or 0
            stage = call["model"].stage
            if stage != chunk * p + rank:
                raise RuntimeError(f"rank {rank} ran chunk {chunk} as stage {stage}, not {chunk * p + rank}")
            output, num_tokens = real_forward(*args, **kwargs)
            action = {"kind": "F", "stage": stage, "chunk": chunk, "microbatch": call["current_microbatch"]}
            self._forward_of_output[id(_first(output))] = action
            if self.recording:
                self.actions.append(action)
            return output, num_tokens

        def backward_step(*args: Any, **kwargs: Any) -> Any:
            call = backward_sig.bind(*args, **kwargs).arguments
            forward = self._forward_of_output.pop(id(_first(call["output_tensor"])))
            grad = real_backward(*args, **kwargs)
            if self.recording:
                self.actions.append({**forward, "kind": "B"})
            return grad

        module.forward_step = forward_step
        module.backward_step = backward_step


def _first(tensors: object) -> object:
    return tensors[0] if isinstance(tensors, (list, tuple)) else tensors


def _build_chunks(cfg: CaptureConfig, rank: int, model_config: object) -> list[nn.Module]:
    import torch.nn as nn
    from megatron.core.enums import ModelType

    from tracekit.capture.model import build_layers, build_stage_module

    class MegatronChunk(nn.Module):
        """One model chunk as Megatron's schedules expect it: ``config``, ``model_type`` and
        ``set_input_tensor`` (the activation Megatron received for a non-first stage)."""

        def __init__(self, body: nn.Module, stage: int) -> None:
            super().__init__()
            self.body, self.stage = body, stage
            self.config, self.model_type = model_config, ModelType.encoder_or_decoder
            self.input_tensor: object = None

        def set_input_tensor(self, input_tensor: object) -> None:
            self.input_tensor = _first(input_tensor)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = self.body(x if self.stage == 0 else self.input_tensor)  # Module calls: Any
            return y

    layers = build_layers(cfg)
    return [MegatronChunk(build_stage_module(cfg, s, layers), s) for s in cfg.stages_of_rank(rank)]


def _run_rank(rank: int, cfg_dict: dict[str, Any], out_dir: str, port: int, profiler: str) -> None:
    """Entry point of one spawned process (``torch.multiprocessing.spawn`` passes ``rank``)."""
    import torch
    import torch.distributed as dist

    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    out = Path(out_dir)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # denormal float math is ~40x slower on CPU
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.ranks, timeout=timedelta(seconds=300)
    )
    with_nvtx = profiler == "nsys"
    install_cpu_shim(with_nvtx)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=cfg.ranks,
        virtual_pipeline_model_parallel_size=cfg.v if cfg.v > 1 else None,
    )
    try:
        if with_nvtx:
            import nvtx

            from tracekit.capture.nsys import RANK_MARK

            nvtx.mark(RANK_MARK.format(rank=rank, world=cfg.ranks))
            write_text(out / f"pid.rank{rank}", str(os.getpid()))
        steps, losses = _train(rank, cfg, out, _schedules_module(with_nvtx), profiler)
        write_text(out / ORDER_FILE.format(rank=rank), json.dumps({"steps": steps, "losses": losses}))
        dist.barrier()
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _train(
    rank: int, cfg: CaptureConfig, out: Path, schedules: ModuleType, profiler: str
) -> tuple[dict[str, list[Action]], list[float] | None]:
    """``2 + steps`` training steps (Megatron schedule + SGD); the last ``steps`` profiled."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    p, v, m = cfg.ranks, cfg.v, cfg.microbatches
    # TransformerConfig, not its base ModelParallelConfig: the schedules read fields that only
    # TransformerConfig has (fine_grained_activation_offloading, ...); no transformer is built
    model_config = TransformerConfig(
        num_layers=cfg.layers,
        hidden_size=cfg.hidden,  # the schedules size receive buffers from it
        num_attention_heads=1,
        pipeline_model_parallel_size=p,
        virtual_pipeline_model_parallel_size=v if v > 1 else None,
        pipeline_dtype=torch.float32,
        batch_p2p_sync=False,  # its torch.cuda.synchronize() guards an NCCL race gloo does not have
    )
    chunks = _build_chunks(cfg, rank, model_config)
    optimizer = torch.optim.SGD([w for c in chunks for w in c.parameters()], lr=1e-3)
    order = ExecutedOrder(schedules, rank, p)
    schedule = getattr(schedules, SCHEDULE_FUNCTIONS[cfg.schedule])
    last = (cfg.n_stages - 1) in cfg.stages_of_rank(rank)

    gen = torch.Generator().manual_seed(cfg.seed + 1)  # same data on every rank, as worker.py
    batch = m * cfg.microbatch_size
    xs = [torch.randn(batch, cfg.width, generator=gen) for _ in range(cfg.steps + 2)]
    ys = [torch.randn(batch, cfg.width, generator=gen) for _ in range(cfg.steps + 2)]

    def loss_func(target: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = F.mse_loss(output, target)
        return loss, {"mse": loss.detach().clone()}  # Megatron scales the loss in place next

    def forward_step_func(
        data_iterator: Iterator[tuple[torch.Tensor, torch.Tensor]], model: nn.Module
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]]:
        x, y = next(data_iterator)
        out: torch.Tensor = model(x)  # Module.__call__ is Any in torch
        return out, partial(loss_func, y)

    def microbatches(step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Microbatch i = rows i*b..(i+1)*b as [s, b, h], cut when Megatron asks for it (as a
        get_batch would), so the slicing runs inside each forward_step."""
        rows = cfg.microbatch_size
        for i in range(m):
            yield xs[step][i * rows : (i + 1) * rows].unsqueeze(0), ys[step][i * rows : (i + 1) * rows].unsqueeze(0)

    def train_step(step: int) -> float | None:
        optimizer.zero_grad(set_to_none=True)
        iterators = [microbatches(step) for _ in chunks]
        store = schedule(
            forward_step_func=forward_step_func,
            data_iterator=iterators if v > 1 else iterators[0],
            model=chunks if v > 1 else chunks[0],
            num_microbatches=m,
            seq_length=SEQ_LENGTH,
            micro_batch_size=cfg.microbatch_size,
        )
        optimizer.step()
        if last and store:
            return float(torch.stack([d["mse"] for d in store]).mean())
        return None

    steps: dict[str, list[Action]] = {}
    losses: list[float] = []
    with _profiling(rank, cfg, out, profiler) as next_step:
        for step in range(cfg.steps + 2):
            order.recording, order.actions = step >= 2, []
            t0 = time.perf_counter()
            with next_step(step):
                loss = train_step(step)
            if order.recording:
                steps[str(step)] = order.actions
            if loss is not None:
                losses.append(loss)
            if rank == 0:
                _log(
                    f"step {step}{' (traced)' if step >= 2 else ''} took {(time.perf_counter() - t0) * 1000:.0f} ms on rank 0"
                )
    return steps, (losses if last else None)


@contextlib.contextmanager
def _profiling(
    rank: int, cfg: CaptureConfig, out: Path, profiler: str
) -> Iterator[Callable[[int], AbstractContextManager[None]]]:
    """Yields ``step_context(step)``: torch.profiler's step boundaries, or NVTX under nsys."""
    import torch

    if profiler == "nsys":
        from torch.profiler import record_function

        from tracekit.capture.nsys import NvtxOpEmitter

        emitter = NvtxOpEmitter()

        @contextlib.contextmanager
        def nvtx_step(step: int) -> Iterator[None]:
            if step == 2:  # as the Kineto capture's schedule(wait=1, warmup=1, active=steps)
                emitter.__enter__()
            with record_function(f"ProfilerStep#{step}") if step >= 2 else contextlib.nullcontext():
                yield

        try:
            yield nvtx_step
        finally:
            emitter.__exit__(None, None, None)
        return

    from torch._C._profiler import _ExperimentalConfig  # torch.profiler re-exports it without __all__

    trace_json = out / f"rank{rank}.json"
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=cfg.steps, repeat=1),
        record_shapes=True,
        with_stack=cfg.with_stack,
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace_json)),
    )

    @contextlib.contextmanager
    def kineto_step(step: int) -> Iterator[None]:
        yield
        prof.step()

    with prof:
        yield kineto_step
    gzip_file(trace_json, out / f"rank{rank}.json.gz")
    os.remove(trace_json)


def _spawn_under_nsys(config_path: str, out_dir: str) -> None:
    """The program nsys launches: start the ranks, then record which pid is which rank."""
    cfg = CaptureConfig(**json.loads(Path(config_path).read_text()))
    out = Path(out_dir)
    _spawn(cfg, out, "nsys")
    pids = {r: int((out / f"pid.rank{r}").read_text()) for r in range(cfg.ranks)}
    write_text(out / "rank_pids.json", json.dumps(pids))


if __name__ == "__main__":
    _spawn_under_nsys(sys.argv[1], sys.argv[2])
