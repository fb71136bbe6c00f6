"""tracekit: where pipeline-parallel training sits idle, and why.

``tracekit.load(path, LoadOptions(...))`` reads a run and reconstructs its pipeline
(:mod:`tracekit.loading`); both load on first use, so ``import tracekit`` stays light.
"""
from tracekit.version import __version__

_WHERE = {"load": "tracekit.loading", "LoadOptions": "tracekit.loading"}
__all__ = ["LoadOptions", "__version__", "load"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
