"""The parent side of an nsys capture: run the program under ``nsys profile``, import and
export its report to SQLite, scrub it into the output folder and write capture.json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracekit.capture.config import CaptureConfig, manifest_head
from tracekit.capture.files import write_text
from tracekit.capture.runner import compute_manifest, faults_manifest, import_torch, utc_now
from tracekit.capture.nsys.scrub import scrub_report
from tracekit.errors import CaptureError

REPORT_NAME = "nsys_report.sqlite"
NVTX_PACKAGE_HINT = "pip install 'nvtx==0.2.8'"
TRACE_FLAGS = ["-t", "nvtx", "--sample=none", "--cpuctxsw=none"]


def _log(msg: str) -> None:
    print(f"tracekit capture (nsys): {msg}", file=sys.stderr, flush=True)


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
    import_torch()


def _run(
    cmd: list[str],
    what: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 1800,
    show_output: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a tool; ``show_output`` passes its output (the ranks' progress) to our stderr."""
    streams = {"stdout": sys.stderr, "stderr": sys.stderr} if show_output else {"capture_output": True}
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, text=True, timeout=timeout, **streams)
    except subprocess.TimeoutExpired:
        raise CaptureError(
            f"{what} did not finish within {timeout:.0f} s; try fewer --steps or -p/--pipeline-ranks"
        ) from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = tail[-1] if tail else "see the output above"
        raise CaptureError(f"{what} failed (exit {proc.returncode}): {last}")
    return proc


def run_nsys_capture(config: CaptureConfig, out_dir: str | Path, *, command_out: str | None = None) -> Path:
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
        config.command_line(command_out if command_out is not None else str(out)) + " --profiler nsys"
    )

    with tempfile.TemporaryDirectory(prefix="tracekit-nsys-") as tmp_name:
        tmp = Path(tmp_name)
        raw, version = record_report(nsys, "tracekit.capture.nsys", config, tmp)
        rank_pids = {int(k): int(v) for k, v in json.loads((tmp / "rank_pids.json").read_text()).items()}
        removed = scrub_report(raw, out / REPORT_NAME, set(rank_pids.values()))
        losses = json.loads((tmp / "losses.json").read_text()) if (tmp / "losses.json").exists() else []
        emitter = (tmp / "emitter.txt").read_text().strip() if (tmp / "emitter.txt").exists() else "unknown"

    meta = _capture_meta(config, cmd_line, version, rank_pids, losses, emitter, removed)
    write_text(out / "capture.json", json.dumps(meta, indent=2) + "\n")
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
    _run(
        [
            str(nsys),
            "profile",
            *TRACE_FLAGS,
            "--force-overwrite=true",
            "-o",
            str(tmp / "report"),
            sys.executable,
            "-m",
            program_module,
            str(tmp / "config.json"),
            str(tmp),
        ],
        "nsys profile",
        env=_child_env(),
        cwd=tmp,
        show_output=True,
    )
    if not (tmp / "rank_pids.json").exists():
        raise CaptureError("the ranks did not finish under nsys (no rank_pids.json); run without nsys to see why")
    report = tmp / "report.nsys-rep"
    if not report.exists():
        report = _import_qdstrm(nsys, tmp / "report.qdstrm")
    _log(f"profiled in {time.perf_counter() - t0:.1f} s; exporting SQLite")
    raw = tmp / "raw.sqlite"
    _run(
        [str(nsys), "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(raw), str(report)], "nsys export"
    )
    return raw, version


def _child_env() -> dict[str, str]:
    """A small environment for the profiled program: nsys records it (and we scrub it)."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    package_root = str(Path(__file__).resolve().parents[3])
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


def _capture_meta(
    config: CaptureConfig,
    cmd_line: str,
    nsys_version: str,
    rank_pids: dict[int, int],
    losses: list[float],
    emitter: str,
    removed: dict[str, int],
) -> dict[str, Any]:
    import torch

    return {
        **manifest_head(config, cmd_line, torch.__version__),
        "profiler": {
            "tool": "nsys",
            "nsys_version": nsys_version,
            "nsys_flags": " ".join(TRACE_FLAGS),
            "nvtx_source": emitter,
            "record_shapes": True,
            "traced_steps": list(range(2, 2 + config.steps)),
            "rank_of_pid": {str(pid): rank for rank, pid in sorted(rank_pids.items())},
            "scrubbed": removed,
        },
        "backend": "gloo",
        "compute": compute_manifest(config),
        "faults": faults_manifest(config),
        "seed": config.seed,
        "losses_per_step": losses,
        "created": utc_now(),
        "files": [REPORT_NAME],
    }
