"""Record real pipeline-parallel runs (torch.distributed.pipelining, gloo, local processes).

torch is imported only when a capture actually runs (``run_capture``); importing this
package, or tracekit's analysis code, never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from tracekit.capture.config import SCHEDULES, CaptureConfig

__all__ = ["CaptureConfig", "SCHEDULES", "run_capture"]


def run_capture(config: CaptureConfig, out_dir: str | Path, *, command_out: str | None = None) -> Path:
    """Run a capture; see :func:`tracekit.capture.runner.run_capture`."""
    from tracekit.capture.runner import run_capture as _run

    return _run(config, out_dir, command_out=command_out)
