"""Captures of pipelines run by training frameworks (DeepSpeed, Megatron-core), not by
torch.distributed.pipelining: the same model, emulated costs and folder layout as
``tracekit capture``, with the framework's own schedule and P2P code doing the work."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from tracekit.capture.config import CaptureConfig
from tracekit.errors import CaptureError

#: framework -> (module under tracekit.capture.frameworks, the package it needs, its pip extra)
_RUNNERS = {
    "deepspeed": ("deepspeed", "deepspeed", "deepspeed"),
    "megatron": ("megatron", "megatron.core", "megatron"),
}


def run_framework_capture(cfg: CaptureConfig, out: str, profiler: str) -> Path:
    """Run ``cfg.framework``'s capture; a missing framework is one line, not a traceback."""
    module_name, package, extra = _RUNNERS[cfg.framework]
    try:
        importlib.import_module(package)
    except ImportError as err:
        raise CaptureError(
            f"--framework {cfg.framework} needs {package} importable ({err}); "
            f"install it with: pip install 'tracekit[{extra}]'"
        ) from None
    module = importlib.import_module(f"tracekit.capture.frameworks.{module_name}")
    run: Callable[[CaptureConfig, str, str], Path] = module.run_capture  # each module's, same signature
    return run(cfg, out, profiler)
