"""The Python API's documentation: every example in its docstrings runs and prints what it
says (doctest, on the sample runs), every public function and method has one, docs/api.md is
what scripts/api_docs.py makes of them, and ``dir(tracekit)`` shows the lazy names while
``import tracekit`` stays light."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys

import pytest
from conftest import ROOT

# The modules whose docstrings hold the API's examples.
DOCUMENTED = ("tracekit", "tracekit.notebook", "tracekit.loading")
# __version__ is a string, not a function
NO_EXAMPLE = {"__version__"}


def _doctests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for name in DOCUMENTED:
        module = importlib.import_module(name)
        found += [t for t in finder.find(module, name) if t.examples and t.name.startswith(name)]
    return sorted({t.name: t for t in found}.values(), key=lambda t: t.name)


DOCTESTS = _doctests()


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_the_docstring_examples_run(test, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the examples name the sample runs by their path in the checkout
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def _public() -> list[tuple[str, object]]:
    """Every public function of the package face and every public method of its classes."""
    import tracekit

    out = []
    for name in sorted(set(tracekit.__all__) - NO_EXAMPLE):
        value = getattr(tracekit, name)
        out.append((f"tracekit.{name}", value))
        if inspect.isclass(value):
            out += [
                (f"tracekit.{name}.{member}", method)
                for member, method in vars(value).items()
                if not member.startswith("_") and inspect.isfunction(method)
            ]
    from tracekit.notebook import Plots

    out += [(f"Plots.{m}", f) for m, f in vars(Plots).items() if not m.startswith("_") and inspect.isfunction(f)]
    return out


def test_every_public_function_has_a_docstring_with_an_example():
    public = _public()
    assert {"tracekit.analysis", "tracekit.compare", "tracekit.whatif", "tracekit.load"} <= {n for n, _ in public}
    parser = doctest.DocTestParser()
    missing = [name for name, value in public if not parser.get_examples(inspect.getdoc(value) or "")]
    assert missing == []


def _api_docs():
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_page_is_current():
    api_docs = _api_docs()
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == api_docs.api_markdown(), (
        "docs/api.md is out of date: run python scripts/api_docs.py"
    )


def test_the_api_reference_shows_every_example_and_column():
    from tracekit.analyze.tabular import TABLES
    from tracekit.notebook import FRAMES

    text = _api_docs().api_markdown()
    for test in DOCTESTS:
        for example in test.examples:
            assert ">>> " + example.source.splitlines()[0] in text, (test.name, example.source)
    for spec in (*FRAMES.values(), *TABLES.values()):
        for column in spec.columns:
            assert f"| `{column}` |" in text


def test_dir_shows_the_lazy_names_and_import_stays_light():
    import tracekit

    assert {"analysis", "compare", "whatif", "load", "LoadOptions", "RunAnalysis"} <= set(dir(tracekit))
    assert set(tracekit.__all__) <= set(dir(tracekit))
    code = (
        "import sys, tracekit\n"
        "dir(tracekit)\n"
        "print(sorted(m for m in ('pandas', 'bokeh', 'tracekit.notebook', 'tracekit.analyze') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
