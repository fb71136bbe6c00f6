"""Keep the command-line process lean: pandas without its optional pyarrow string backend.

pandas 3 imports pyarrow, when it is installed, to back its ``str`` dtype: ~40 MB of
resident library code and ~0.1 s of CPU. tracekit's analysis never needs it (event names are
categoricals, the parse cache converts through numpy), so the command line asks pandas to
start as it does where pyarrow is not installed, a configuration pandas supports. pyarrow
itself stays importable: the parse cache loads it when it reads or writes Parquet.
Measured in turn with and without (``benchmarks/tuning_ab.py``, benchmarks/README.md).

Only the ``tracekit`` command does this, and only where pandas is not imported yet; a program
that imports tracekit as a library gets pandas exactly as it configured it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _WithoutPyarrow(importlib.abc.MetaPathFinder):
    """While pandas itself is being imported, ``import pyarrow`` fails as if not installed."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "pandas":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        real = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: ModuleSpec) -> ModuleType | None:
                return real.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                hidden = "pyarrow" not in sys.modules
                if hidden:
                    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # "import pyarrow" raises ImportError
                try:
                    real.exec_module(module)
                finally:
                    if hidden and sys.modules.get("pyarrow", 0) is None:
                        del sys.modules["pyarrow"]

        spec.loader = _Loader()
        return spec


def pandas_without_pyarrow() -> None:
    """Arrange for the first ``import pandas`` of this process to skip pyarrow."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return
    if not any(isinstance(f, _WithoutPyarrow) for f in sys.meta_path):
        sys.meta_path.insert(0, _WithoutPyarrow())
