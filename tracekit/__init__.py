"""tracekit: where pipeline-parallel training sits idle, and why.

``tracekit.load(path, LoadOptions(...))`` reads a run and reconstructs its pipeline
(:mod:`tracekit.loading`); ``tracekit.trace_handler(run_dir, schedule=...)`` is an
``on_trace_ready`` for torch.profiler (:mod:`tracekit.handler`). All load on first use, so
``import tracekit`` stays light.
"""

from typing import Any

from tracekit.version import __version__

_WHERE = {"load": "tracekit.loading", "LoadOptions": "tracekit.loading", "trace_handler": "tracekit.handler"}
__all__ = ["LoadOptions", "__version__", "load", "trace_handler"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
