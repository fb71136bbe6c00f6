"""tracekit: where pipeline-parallel training sits idle, and why.

In a notebook, ``tracekit.analysis(path)`` loads and analyses a run: DataFrames with fixed
columns, a summary Jupyter shows, the report's figures (:mod:`tracekit.notebook`);
``tracekit.compare(a, b)`` and ``tracekit.whatif(a, ...)`` answer as ``tracekit diff`` and
``tracekit whatif`` do. ``tracekit.load(path, LoadOptions(...))`` reads a run and
reconstructs its pipeline (:mod:`tracekit.loading`); ``tracekit.trace_handler(run_dir,
schedule=...)`` is an ``on_trace_ready`` for torch.profiler (:mod:`tracekit.handler`), and
``tracekit.Monitor(run_dir)`` reads the windows it analysed while training runs
(:mod:`tracekit.monitor`). All load on first use, so ``import tracekit`` stays light.

>>> import tracekit
>>> a = tracekit.analysis("sample_traces/1f1b_slow_stage2")
>>> a.findings["cause"].iloc[0]
'imbalance'
"""

from typing import TYPE_CHECKING, Any

from tracekit.version import __version__

if TYPE_CHECKING:  # what a type checker sees; at run time each loads on first use (__getattr__)
    from tracekit.handler import trace_handler
    from tracekit.loading import LoadOptions, load
    from tracekit.monitor import Monitor
    from tracekit.notebook import RunAnalysis, RunComparison, WhatIfResult, analysis, compare, whatif

_WHERE = {
    "analysis": "tracekit.notebook",
    "compare": "tracekit.notebook",
    "whatif": "tracekit.notebook",
    "RunAnalysis": "tracekit.notebook",
    "RunComparison": "tracekit.notebook",
    "WhatIfResult": "tracekit.notebook",
    "load": "tracekit.loading",
    "LoadOptions": "tracekit.loading",
    "trace_handler": "tracekit.handler",
    "Monitor": "tracekit.monitor",
}
__all__ = [
    "LoadOptions",
    "Monitor",
    "RunAnalysis",
    "RunComparison",
    "WhatIfResult",
    "__version__",
    "analysis",
    "compare",
    "load",
    "trace_handler",
    "whatif",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    """The public names, the lazy ones too, and the submodules imported so far: what
    ``dir(tracekit)`` and a notebook's completion show."""
    from types import ModuleType

    modules = {name for name, value in globals().items() if isinstance(value, ModuleType)}
    return sorted(set(__all__) | modules)
