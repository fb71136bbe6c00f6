"""Capture a real pipeline-parallel run under Nsight Systems: a scrubbed SQLite report.

``run_nsys_capture(config, out_dir)`` runs the same training as the Kineto capture
(:mod:`tracekit.capture.worker`: torch.distributed.pipelining over gloo, emulated or real
compute) inside ``nsys profile -t nvtx``, exports the report to SQLite, removes what a
report must not carry when shared (environments, command lines, file paths, other
processes and their threads), and writes ``nsys_report.sqlite`` and ``capture.json`` into
``out_dir``. The raw ``.nsys-rep`` is made in a temporary folder and deleted.

What each rank records as NVTX ranges (steps 2.. only; steps 0 and 1 warm up untraced):

* with a CUDA build of torch: ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``;
* with a CPU-only build (whose emit_nvtx refuses to run), :class:`NvtxOpEmitter`, which
  writes the same strings emit_nvtx would: ``aten::addmm, seq = 351, op_id = 12,
  sizes = [[256], [8, 256], [256, 256], [], []]`` for every op (a TorchDispatchMode), autograd
  Function and backward node (hooks), and ``PP:1F0, op_id = 7`` for every
  ``record_function``; plus ``gloo:send`` / ``gloo:recv`` start/end ranges from inside
  ``c10d::send`` / ``c10d::recv_`` to ``wait()`` returning, as ProcessGroupGloo's own
  RecordFunctions span.
* the harness adds ``ProfilerStep#N`` around each step and one mark
  ``tracekit:rank=R world_size=P`` per process, so the report states its ranks.

nsys and the Python ``nvtx`` package (0.2.8; 0.2.16's ranges are not recorded by nsys
2022.4) must be installed; nothing here needs a GPU.

Also runnable as ``python -m tracekit.capture.nsys CONFIG_JSON OUT_DIR``: the program
nsys launches, which spawns the ranks.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from tracekit.capture.config import SPLIT_BACKWARD, CaptureConfig, manifest_head
from tracekit.errors import CaptureError

REPORT_NAME = "nsys_report.sqlite"
RANK_MARK = "tracekit:rank={rank} world_size={world}"
NVTX_PACKAGE_HINT = "pip install 'nvtx==0.2.8'"
# record_function's own ops: its enter/exit, not work (Kineto does not show them either)
_UNTRACED_NAMESPACES = ("profiler::",)
_GLOO_LABELS = {"c10d::send": "gloo:send", "c10d::recv_": "gloo:recv", "c10d::recv_any_source_": "gloo:recv"}
_TRACE_FLAGS = ["-t", "nvtx", "--sample=none", "--cpuctxsw=none"]


def _log(msg: str) -> None:
    print(f"tracekit capture (nsys): {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# the parent: nsys profile -> import -> export -> scrub
# ---------------------------------------------------------------------------------------
def find_nsys() -> Path:
    found = shutil.which("nsys")
    if not found:
        raise CaptureError(
            "nsys (Nsight Systems CLI) is not on PATH; install it (Debian: enable the non-free "
            "component and 'apt-get install nsight-systems libssh-4'), or capture with the PyTorch profiler"
        )
    return Path(found)


def _find_importer(nsys: Path) -> Path | None:
    """QdstrmImporter, which turns nsys's raw .qdstrm into a .nsys-rep.

    Debian's package installs it where its own nsys does not look, so nsys leaves a
    .qdstrm behind ("importer binary ... not found"); we run the importer ourselves.
    """
    real = nsys.resolve()
    for base in (real.parent, *real.parents[:3]):
        for candidate in (base / "QdstrmImporter", base / "host-linux-x64" / "QdstrmImporter"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    for candidate in Path("/usr/lib/nsight-systems").glob("host-*/QdstrmImporter"):
        return candidate
    return None


def _check_python_side() -> None:
    try:
        import nvtx  # noqa: F401
    except ImportError:
        raise CaptureError(f"an nsys capture needs the Python 'nvtx' package: {NVTX_PACKAGE_HINT}") from None
    from tracekit.capture.runner import import_torch

    import_torch()


def _run(cmd: list[str], what: str, env: dict | None = None, cwd: Path | None = None,
         timeout: float = 1800, show_output: bool = False) -> subprocess.CompletedProcess:
    """Run a tool; ``show_output`` passes its output (the ranks' progress) to our stderr."""
    streams = {"stdout": sys.stderr, "stderr": sys.stderr} if show_output else {"capture_output": True}
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, text=True, timeout=timeout, **streams)
    except subprocess.TimeoutExpired:
        raise CaptureError(f"{what} did not finish within {timeout:.0f} s; try fewer --steps or --ranks") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = tail[-1] if tail else "see the output above"
        raise CaptureError(f"{what} failed (exit {proc.returncode}): {last}")
    return proc


def run_nsys_capture(config: CaptureConfig, out_dir, *, command_out: str | None = None) -> Path:
    """Run ``config``'s pipeline training under ``nsys profile`` and write a scrubbed report.

    Writes ``nsys_report.sqlite`` and ``capture.json`` into ``out_dir`` and returns that
    folder. Raises CaptureError (one line) for anything the user can fix.
    """
    config.validate()
    nsys = find_nsys()
    _check_python_side()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CaptureError(f"--out {out} exists and is not a folder; pick a folder path")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / REPORT_NAME, *out.glob("rank*.json*")]:
        if stale.exists():
            stale.unlink()
    cmd_line = config.command or (
        config.command_line(command_out if command_out is not None else str(out)) + " --profiler nsys")

    with tempfile.TemporaryDirectory(prefix="tracekit-nsys-") as tmp_name:
        tmp = Path(tmp_name)
        raw, version = record_report(nsys, "tracekit.capture.nsys", config, tmp)
        rank_pids = {int(k): int(v) for k, v in json.loads((tmp / "rank_pids.json").read_text()).items()}
        removed = scrub_report(raw, out / REPORT_NAME, set(rank_pids.values()))
        losses = json.loads((tmp / "losses.json").read_text()) if (tmp / "losses.json").exists() else []
        emitter = (tmp / "emitter.txt").read_text().strip() if (tmp / "emitter.txt").exists() else "unknown"

    meta = _capture_meta(config, cmd_line, version, rank_pids, losses, emitter, removed)
    (out / "capture.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = (out / REPORT_NAME).stat().st_size
    _log(f"wrote {REPORT_NAME} ({size / 1e6:.2f} MB, scrubbed) and capture.json to {out}")
    return out


def record_report(nsys: Path, program_module: str, config: CaptureConfig, tmp: Path) -> tuple[Path, str]:
    """Run ``python -m program_module CONFIG_JSON TMP`` under ``nsys profile`` and export SQLite.

    The program spawns the ranks and must leave ``rank_pids.json`` in ``tmp``. Returns the
    raw (unscrubbed) SQLite export inside ``tmp`` and nsys's version line.
    """
    version = _run([str(nsys), "--version"], "nsys --version").stdout.strip()
    (tmp / "config.json").write_text(json.dumps(config.to_dict()))
    _log(f"{version}; running {config.ranks} ranks ({config.schedule}, m={config.microbatches}) under nsys")
    t0 = time.perf_counter()
    _run([str(nsys), "profile", *_TRACE_FLAGS, "--force-overwrite=true", "-o", str(tmp / "report"),
          sys.executable, "-m", program_module, str(tmp / "config.json"), str(tmp)],
         "nsys profile", env=_child_env(), cwd=tmp, show_output=True)
    if not (tmp / "rank_pids.json").exists():
        raise CaptureError("the ranks did not finish under nsys (no rank_pids.json); run without nsys to see why")
    report = tmp / "report.nsys-rep"
    if not report.exists():
        report = _import_qdstrm(nsys, tmp / "report.qdstrm")
    _log(f"profiled in {time.perf_counter() - t0:.1f} s; exporting SQLite")
    raw = tmp / "raw.sqlite"
    _run([str(nsys), "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(raw), str(report)],
         "nsys export")
    return raw, version


def _child_env() -> dict[str, str]:
    """A small environment for the profiled program: nsys records it (and we scrub it)."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _import_qdstrm(nsys: Path, qdstrm: Path) -> Path:
    if not qdstrm.exists():
        raise CaptureError("nsys wrote neither a .nsys-rep nor a .qdstrm; check that 'nsys profile' works here")
    importer = _find_importer(nsys)
    if importer is None:
        raise CaptureError(
            "nsys left a raw .qdstrm and its QdstrmImporter was not found; install the full "
            "nsight-systems package (and libssh-4) so the report can be imported"
        )
    _log(f"nsys did not import its raw .qdstrm (its QdstrmImporter lookup fails); running {importer}")
    _run([str(importer), "-i", str(qdstrm)], "QdstrmImporter")
    report = qdstrm.with_suffix(".nsys-rep")
    if not report.exists():
        raise CaptureError(f"QdstrmImporter did not write {report.name}")
    return report


def _capture_meta(config: CaptureConfig, cmd_line: str, nsys_version: str, rank_pids: dict[int, int],
                  losses: list, emitter: str, removed: dict[str, int]) -> dict:
    import torch

    per_layer = config.layer_costs_ms(0)
    return {
        **manifest_head(config, cmd_line, torch.__version__),
        "profiler": {
            "tool": "nsys",
            "nsys_version": nsys_version,
            "nsys_flags": " ".join(_TRACE_FLAGS),
            "nvtx_source": emitter,
            "record_shapes": True,
            "traced_steps": list(range(2, 2 + config.steps)),
            "rank_of_pid": {str(pid): rank for rank, pid in sorted(rank_pids.items())},
            "scrubbed": removed,
        },
        "backend": "gloo",
        "compute": {
            "mode": config.compute,
            "layer_ms": config.layer_ms if config.compute == "emulated" else None,
            "per_layer_ms": (
                {"forward": per_layer["forward"], "backward_full": 2 * per_layer["forward"],
                 "input_grad": per_layer["input_grad"], "weight_grad": per_layer["weight_grad"]}
                if config.compute == "emulated" else None),
            "layers": config.layers,
            "layers_per_stage": config.layers // config.n_stages,
            "hidden": config.hidden,
            "microbatch_size": config.microbatch_size,
            "split_backward": config.schedule in SPLIT_BACKWARD,
        },
        "faults": {
            "slow_stage": config.slow_stage,
            "slow_factor": config.slow_factor if config.slow_stage is not None else None,
            "p2p_delay_ms": config.p2p_delay_ms,
        },
        "seed": config.seed,
        "losses_per_step": losses,
        "created": datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "files": [REPORT_NAME],
    }


# ---------------------------------------------------------------------------------------
# scrubbing
# ---------------------------------------------------------------------------------------
# Tables that hold file paths, program output, call stacks or OS activity of the machine:
# nothing tracekit reads, all of it private.
_DROP_TABLES = re.compile(
    r"^(ANALYSIS_FILE|ProcessStreams|OSRT_.*|SAMPLING_CALLCHAINS|CUDA_CALLCHAINS|COMPOSITE_EVENTS|"
    r"SCHED_EVENTS|DIAGNOSTIC_EVENT|PROFILER_OVERHEAD|TARGET_INFO_NIC_INFO|UnwindMethodType)$"
)
_ENV_LIKE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PATH_LIKE = re.compile(r"(^|[\s\"'=:;])(/|~/|[A-Za-z]:\\)[^\s]*")
_META_PRIVATE = re.compile(r"(ENVIRONMENT|ARGUMENT|COMMAND|WORKING_DIR|USER|HOST|PATH|FILE|DISPLAY_NAME)")
_SYSTEM_PRIVATE = {"DeviceEnvironment", "Hostname", "TargetInstallDir", "InjectionFilesStoragePath",
                   "KernelVersion", "NamespacePID"}
#: strings that must not appear anywhere in a shared report (the committed sample's test)
FORBIDDEN = ("PATH=", "HOME=", "USER=", "/root", "/home/", "/tmp/", "/work/")


def scrub_report(src: Path, dst: Path, keep_pids: set[int]) -> dict[str, int]:
    """Copy ``src`` to ``dst`` without environments, command lines, paths or other processes.

    Works on a copy (``src`` is left as it is) and ends with VACUUM so deleted text does
    not linger in free pages. Returns what was removed, by kind.
    """
    work = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, work)
    removed: dict[str, int] = {}
    conn = sqlite3.connect(work)
    try:
        tables = {n: [r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')]
                  for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for name in list(tables):
            if _DROP_TABLES.match(name):
                conn.execute(f'DROP TABLE "{name}"')
                removed["tables dropped"] = removed.get("tables dropped", 0) + 1
                del tables[name]
        keep_gpids = {pid << 24 for pid in keep_pids}
        pid_sql = ", ".join(str(g) for g in sorted(keep_gpids)) or "-1"
        if "PROCESSES" in tables:
            n = conn.execute(f"DELETE FROM PROCESSES WHERE globalPid NOT IN ({pid_sql})").rowcount
            conn.execute("UPDATE PROCESSES SET name = 'python'")
            removed["other processes"] = n
        if "ThreadNames" in tables:
            n = conn.execute(f"DELETE FROM ThreadNames WHERE (globalTid & ~16777215) NOT IN ({pid_sql})").rowcount
            removed["threads of other processes"] = n
        for meta in ("META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA"):
            if meta in tables:
                rows = conn.execute(f'SELECT rowid, name FROM "{meta}"').fetchall()
                private = [rid for rid, name in rows if _META_PRIVATE.search(str(name))]
                conn.executemany(f'DELETE FROM "{meta}" WHERE rowid = ?', [(r,) for r in private])
                removed[f"{meta} rows"] = len(private)
        if "TARGET_INFO_SYSTEM_ENV" in tables:
            marks = ", ".join("?" * len(_SYSTEM_PRIVATE))
            n = conn.execute(f"DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE name IN ({marks})",
                             sorted(_SYSTEM_PRIVATE)).rowcount
            removed["system environment rows"] = n
        removed["strings"] = _scrub_strings(conn, tables)
        removed["other text cells"] = _scrub_text_cells(conn, tables)
        conn.commit()
    finally:
        conn.close()
    if dst.exists():
        dst.unlink()
    conn = sqlite3.connect(work)
    try:
        conn.execute("VACUUM INTO ?", (str(dst),))
    finally:
        conn.close()
    work.unlink()
    return removed


def _scrub_strings(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> int:
    """Keep only the strings that the kept rows name (NVTX text, kernels, API, threads)."""
    if "StringIds" not in tables:
        return 0
    used: set[int] = set()
    for table, cols in tables.items():
        if table == "StringIds":
            continue
        for col in cols:
            if col.endswith(("Id", "Name")) and col not in ("globalTid", "globalPid", "domainId", "correlationId"):
                try:
                    used.update(v for (v,) in conn.execute(f'SELECT DISTINCT "{col}" FROM "{table}"')
                                if isinstance(v, int))
                except sqlite3.DatabaseError:
                    continue
    rows = conn.execute("SELECT id, value FROM StringIds").fetchall()
    blank = [(i,) for i, v in rows if i not in used or _private(str(v))]
    conn.executemany("UPDATE StringIds SET value = '' WHERE id = ?", blank)
    return len(blank)


def _private(text: str) -> bool:
    return bool(_ENV_LIKE.match(text) or _PATH_LIKE.search(text) or any(f in text for f in FORBIDDEN))


def _scrub_text_cells(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> int:
    """Blank any remaining text cell that looks like an environment entry or a path."""
    n = 0
    for table, cols in tables.items():
        if table == "StringIds" or table.startswith("ENUM_"):
            continue
        for col in cols:
            try:
                rows = conn.execute(
                    f'SELECT rowid, "{col}" FROM "{table}" WHERE typeof("{col}") = \'text\'').fetchall()
            except sqlite3.DatabaseError:
                continue
            bad = [(rid,) for rid, v in rows if _private(v)]
            if bad:
                conn.executemany(f'UPDATE "{table}" SET "{col}" = \'\' WHERE rowid = ?', bad)
                n += len(bad)
    return n


# ---------------------------------------------------------------------------------------
# the ranks (inside nsys)
# ---------------------------------------------------------------------------------------
class NvtxOpEmitter:
    """What ``emit_nvtx(record_shapes=True)`` records, for CPU-only torch builds.

    torch's CPU wheels have no NVTX, so emit_nvtx raises; this writes the same range
    texts from Python: ops through a TorchDispatchMode (the op as dispatched below
    autograd: ``aten::linear`` shows as its ``aten::t`` and ``aten::addmm``), autograd
    Functions by patching ``Function.apply``, backward nodes by hooks installed when
    ``torch.autograd.backward``/``grad`` run, ``record_function`` labels by patching it,
    and gloo sends/receives as start/end ranges from post to ``wait()``.
    """

    def __init__(self):
        import nvtx
        import torch

        self._nvtx = nvtx
        self._torch = torch
        self._op_id = 0
        self._mode = None
        self.pending_range = None   # the gloo range started inside the last c10d send/recv
        self._patches: list[tuple[object, str, object]] = []

    # -- text --------------------------------------------------------------------------
    def _next_id(self) -> int:
        self._op_id += 1
        return self._op_id

    def _text(self, name: str, seq: int, inputs=()) -> str:
        text = name
        if seq >= 0:
            text += f", seq = {seq}"
        text += f", op_id = {self._next_id()}"
        shapes = [self._shape(x) for x in inputs]
        if shapes:
            text += ", sizes = [" + ", ".join(shapes) + "]"
        return text

    def _shape(self, value) -> str:
        if isinstance(value, self._torch.Tensor):
            return "[" + ", ".join(str(d) for d in value.shape) + "]"
        return "[]"

    def push(self, text: str) -> None:
        self._nvtx.push_range(text)

    def pop(self) -> None:
        self._nvtx.pop_range()

    def _seq_now(self, made_node: bool) -> int:
        if not self._torch.is_grad_enabled():
            return -1
        peek = self._torch._C._autograd._get_sequence_nr()
        return peek - 1 if made_node else peek

    # -- install -----------------------------------------------------------------------
    def __enter__(self):
        torch = self._torch
        from torch.utils._python_dispatch import TorchDispatchMode

        emitter = self

        class _OpRanges(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func._schema.name.startswith(_UNTRACED_NAMESPACES):
                    return func(*args, **(kwargs or {}))
                flat = list(args) + list((kwargs or {}).values())
                made_node = any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat)
                name = func._schema.name
                emitter.push(emitter._text(name, emitter._seq_now(made_node), args))
                try:
                    out = func(*args, **(kwargs or {}))
                    if name in _GLOO_LABELS:
                        # ProcessGroupGloo starts its own RecordFunction inside the op
                        tensors = args[0] if args and isinstance(args[0], (list, tuple)) else args[:1]
                        emitter.pending_range = emitter._nvtx.start_range(
                            emitter._text(_GLOO_LABELS[name], -1, tensors))
                    return out
                finally:
                    emitter.pop()

        self._patch_record_function()
        self._patch_function_apply()
        self._patch_backward()
        self._patch_p2p()
        self._mode = _OpRanges()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        for owner, attr, original in reversed(self._patches):
            setattr(owner, attr, original)
        self._patches.clear()
        return False

    def _set(self, owner, attr: str, value) -> None:
        self._patches.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def _patch_record_function(self) -> None:
        from torch.autograd.profiler import record_function

        enter, leave, emitter = record_function.__enter__, record_function.__exit__, self

        def __enter__(rf):
            emitter.push(emitter._text(rf.name, -1))
            return enter(rf)

        def __exit__(rf, *exc):
            try:
                return leave(rf, *exc)
            finally:
                emitter.pop()

        self._set(record_function, "__enter__", __enter__)
        self._set(record_function, "__exit__", __exit__)

    def _patch_function_apply(self) -> None:
        from torch.autograd.function import Function

        original, emitter = Function.__dict__["apply"], self
        apply = original.__func__

        def traced(cls, *args, **kwargs):
            emitter.push(emitter._text(cls.__name__, emitter._seq_now(False), args))
            try:
                return apply(cls, *args, **kwargs)
            finally:
                emitter.pop()

        self._patches.append((Function, "apply", original))
        Function.apply = classmethod(traced)

    def _patch_backward(self) -> None:
        torch, emitter = self._torch, self
        backward, grad = torch.autograd.backward, torch.autograd.grad

        def hooked_backward(tensors, *args, **kwargs):
            emitter._hook_graph(tensors)
            return backward(tensors, *args, **kwargs)

        def hooked_grad(outputs, *args, **kwargs):
            emitter._hook_graph(outputs)
            return grad(outputs, *args, **kwargs)

        self._set(torch.autograd, "backward", hooked_backward)
        self._set(torch.autograd, "grad", hooked_grad)

    def _hook_graph(self, roots) -> None:
        """Give every node reachable from ``roots`` a range: autograd's evaluate_function."""
        torch = self._torch
        if isinstance(roots, (torch.Tensor, torch.autograd.graph.GradientEdge)):
            roots = [roots]
        stack = []
        for root in roots:
            node = root.grad_fn if isinstance(root, torch.Tensor) else getattr(root, "node", None)
            if node is not None:
                stack.append(node)
        while stack:
            node = stack.pop()
            if node.metadata.get("_tracekit_nvtx"):
                continue
            node.metadata["_tracekit_nvtx"] = True
            name = node.name()
            seq = node._sequence_nr()
            seq = seq if 0 <= seq < 2**62 and "AccumulateGrad" not in name else -1
            node.register_prehook(self._node_enter(name, seq))
            node.register_hook(self._node_exit)
            stack.extend(n for n, _ in node.next_functions if n is not None)

    def _node_enter(self, name: str, seq: int):
        def enter(grad_outputs):
            self.push(self._text(f"autograd::engine::evaluate_function: {name}", seq))
            self.push(self._text(name, seq, grad_outputs))
        return enter

    def _node_exit(self, grad_inputs, grad_outputs):
        self.pop()
        self.pop()

    def _patch_p2p(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        emitter = self

        def traced(post):
            def call(*args, **kwargs):
                emitter.pending_range = None
                work = post(*args, **kwargs)
                range_id, emitter.pending_range = emitter.pending_range, None
                if range_id is None:
                    return work
                return _EndOnWait(work, lambda: emitter._nvtx.end_range(range_id))
            call.__wrapped__ = post
            return call

        isend, irecv = traced(c10d.isend), traced(c10d.irecv)
        # batch_isend_irecv and P2POp compare ops with c10d's globals: patch both names
        for owner in (c10d, dist):
            self._set(owner, "isend", isend)
            self._set(owner, "irecv", irecv)


class _EndOnWait:
    """A posted send/recv whose NVTX range ends when ``wait()`` returns."""

    def __init__(self, work, end):
        self._work, self._end = work, end

    def wait(self, *args, **kwargs):
        try:
            return self._work.wait(*args, **kwargs) if self._work is not None else True
        finally:
            if self._end is not None:
                self._end()
                self._end = None

    def __getattr__(self, attr):
        return getattr(self._work, attr)


def _emitter_for_this_torch():
    import torch

    if torch.cuda.is_available():
        how = "torch.autograd.profiler.emit_nvtx(record_shapes=True)"
        return torch.autograd.profiler.emit_nvtx(record_shapes=True), how
    return NvtxOpEmitter(), (
        "tracekit NvtxOpEmitter: emit_nvtx's range texts written from Python "
        "(this torch has no CUDA, so emit_nvtx cannot run)"
    )


def run_rank_under_nsys(rank: int, cfg_dict: dict, out_dir: str, port: int) -> None:
    """One spawned rank: the Kineto worker's training, with NVTX ranges instead of torch.profiler."""
    from datetime import timedelta

    import nvtx
    import torch
    import torch.distributed as dist

    from tracekit.capture import worker

    cfg = CaptureConfig(**cfg_dict)
    cfg.validate()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=cfg.ranks, timeout=timedelta(seconds=300))
    sender = worker.install_p2p_delay(cfg.p2p_delay_ms) if cfg.p2p_delay_ms > 0 else None
    out = Path(out_dir)
    try:
        nvtx.mark(RANK_MARK.format(rank=rank, world=cfg.ranks))
        (out / f"pid.rank{rank}").write_text(str(os.getpid()))
        losses = _train_with_nvtx(rank, cfg, out)
        if losses is not None:
            (out / "losses.json").write_text(json.dumps(losses))
        dist.barrier()
    finally:
        if sender is not None:
            sender.close()
        dist.destroy_process_group()


def _train_with_nvtx(rank: int, cfg: CaptureConfig, out: Path) -> list[float] | None:
    import torch
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torch.profiler import record_function

    from tracekit.capture import worker
    from tracekit.capture.model import build_layers, build_stage_module, training_data

    my_stages = cfg.stages_of_rank(rank)
    layers = build_layers(cfg)
    stages = [PipelineStage(build_stage_module(cfg, s, layers), s, cfg.n_stages, torch.device("cpu"))
              for s in my_stages]
    del layers
    optimizer = torch.optim.SGD([p for st in stages for p in st.submod.parameters()], lr=1e-3)
    schedule = worker._make_schedule(cfg, stages, nn.MSELoss())
    first, last = 0 in my_stages, (cfg.n_stages - 1) in my_stages
    xs, ys = training_data(cfg)
    emitter, how = _emitter_for_this_torch()
    if rank == 0:
        (out / "emitter.txt").write_text(how)
    step_losses: list[float] = []
    entered = False
    try:
        for step in range(cfg.steps + 2):
            traced = step >= 2  # as the Kineto capture's schedule(wait=1, warmup=1, active=steps)
            if traced and not entered:
                emitter.__enter__()
                entered = True
            with record_function(f"ProfilerStep#{step}") if traced else contextlib.nullcontext():
                loss = worker.train_step(schedule, optimizer, xs[step], ys[step], first, last)
            if loss is not None:
                step_losses.append(loss)
            if rank == 0:
                _log(f"step {step} done{' (traced)' if traced else ''}")
    finally:
        if entered:
            emitter.__exit__(None, None, None)
    return step_losses if last else None


def _spawn_ranks(config_path: str, out_dir: str) -> None:
    """The program nsys launches: start the ranks, then record which pid is which rank."""
    import socket

    import torch.multiprocessing as mp

    cfg = json.loads(Path(config_path).read_text())
    out = Path(out_dir)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run_rank_under_nsys, args=(cfg, out_dir, port), nprocs=cfg["ranks"], join=True)
    pids = {r: int((out / f"pid.rank{r}").read_text()) for r in range(cfg["ranks"])}
    (out / "rank_pids.json").write_text(json.dumps(pids))


if __name__ == "__main__":
    _spawn_ranks(sys.argv[1], sys.argv[2])
