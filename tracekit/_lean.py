"""Keep the command-line process lean: pandas without its optional pyarrow string backend,
numpy's BLAS without its idle threads.

pandas 3 imports pyarrow, when it is installed, to back its ``str`` dtype: ~35 MB of
resident library code and ~0.1 s. tracekit's analysis never needs it (event names are
categoricals, the parse cache converts through numpy), so the command line asks pandas to
start as it does where pyarrow is not installed, a configuration pandas supports. pyarrow
itself stays importable: the parse cache loads it when it reads or writes Parquet.

numpy's OpenBLAS starts one thread per core as it loads, and each spins for a while before it
sleeps: ~0.07 s of CPU on 2 cores, more on larger machines, where a command's parser workers
want those cores. tracekit does no linear algebra, so the command line loads numpy as
``OPENBLAS_NUM_THREADS=1`` would, then puts the environment back as it was (a program the
command starts, ``capture``'s training, gets its own threads). A value the user set is kept.

Only the ``tracekit`` command does this, and only for a module not imported yet; a program
that imports tracekit as a library gets pandas and numpy exactly as it configured them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable

_BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _around(module: str) -> Callable[[], Callable[[], None]]:
    """What to arrange while ``module`` itself executes: a function that arranges it and
    returns the function that undoes it."""

    def without_pyarrow() -> Callable[[], None]:
        if "pyarrow" in sys.modules:
            return lambda: None
        sys.modules["pyarrow"] = None  # type: ignore[assignment]  # "import pyarrow" raises ImportError

        def undo() -> None:
            if sys.modules.get("pyarrow", 0) is None:
                del sys.modules["pyarrow"]

        return undo

    def one_blas_thread() -> Callable[[], None]:
        if _BLAS_THREADS in os.environ:
            return lambda: None
        os.environ[_BLAS_THREADS] = "1"

        def undo() -> None:
            os.environ.pop(_BLAS_THREADS, None)

        return undo

    return {"pandas": without_pyarrow, "numpy": one_blas_thread}[module]


class _WhileImporting(importlib.abc.MetaPathFinder):
    """While ``module`` itself is being imported, :func:`_around` of it holds."""

    def __init__(self, module: str):
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        real, arrange = spec.loader, _around(name)

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                undo = arrange()
                try:
                    real.exec_module(module)
                finally:
                    undo()

        spec.loader = _Loader()
        return spec


def _hook(module: str, unless: tuple[str, ...] = ()) -> None:
    if module in sys.modules or any(name in sys.modules for name in unless):
        return
    if not any(isinstance(f, _WhileImporting) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, _WhileImporting(module))


def pandas_without_pyarrow() -> None:
    """Arrange for the first ``import pandas`` of this process to skip pyarrow."""
    _hook("pandas", unless=("pyarrow",))


def numpy_with_one_blas_thread() -> None:
    """Arrange for the first ``import numpy`` of this process to start no BLAS threads."""
    _hook("numpy")
