"""Record real pipeline-parallel runs (torch.distributed.pipelining, gloo, local processes).

torch is imported only when a capture actually runs (``run_capture``); importing this
package, or tracekit's analysis code, never imports torch.
"""

from __future__ import annotations

from tracekit.capture.config import SCHEDULES, CaptureConfig

__all__ = ["CaptureConfig", "SCHEDULES", "run_capture"]


def run_capture(config, out_dir, **kwargs):
    """Run a capture; see :func:`tracekit.capture.runner.run_capture`."""
    from tracekit.capture.runner import run_capture as _run

    return _run(config, out_dir, **kwargs)
