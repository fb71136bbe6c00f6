"""What a renderer is: a small object with a ``name`` and one ``render(subject)`` method that
returns the output's text or bytes, and formats only: every figure it shows is computed
before it (in :mod:`tracekit.analyze`, or from the document by :mod:`tracekit.render.json`).

Most renderers read the one analysed object, the JSON-able analysis document
(:data:`~tracekit.render.document.AnalysisDocument`, built by :func:`tracekit.render.json.to_document` or read back
from the document cache): the console and JSON. A few read something else, each because the
document does not hold what they write:

- the gate's renderers (JUnit, Markdown) read the gate's result
  (:class:`tracekit.gate.checks.GateResult`), the checks held against the analysis;
- the HTML report reads the :class:`~tracekit.analyze.Analysis` itself: its figures draw
  every action and idle interval, which the document does not carry;
- the table files (Parquet, CSV) read one table of :func:`tracekit.analyze.tabular.tables`
  (:class:`NamedTable`), and TensorBoard the per-step scalars of
  :func:`tracekit.analyze.tabular.step_scalars`: rows the document summarises.

:data:`RENDERERS` names them all, for the commands to look up; each entry makes a renderer
from its options (``RENDERERS["console"](ranks="all")``), and every option has a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

Subject = TypeVar("Subject", contravariant=True)


@runtime_checkable
class Renderer(Protocol[Subject]):
    """One output format: ``render`` formats ``subject`` (for most renderers the analysis
    document) and computes nothing of its own."""

    @property
    def name(self) -> str: ...

    @property
    def reads(self) -> str:
        """What it reads: "document" (the analysis document), "gate" (the gate's result),
        "analysis" (the Analysis), "table" (a NamedTable) or "scalars" (step_scalars' frame)."""
        ...

    def render(self, subject: Subject) -> str | bytes: ...


def text_of(rendered: str | bytes) -> str:
    """A text renderer's output as text (UTF-8 where it gave bytes)."""
    return rendered if isinstance(rendered, str) else rendered.decode()


def bytes_of(rendered: str | bytes) -> bytes:
    """Any renderer's output as the bytes a file holds (text as UTF-8)."""
    return rendered.encode() if isinstance(rendered, str) else rendered


@dataclass(frozen=True)
class NamedTable:
    """One table of :func:`tracekit.analyze.tabular.tables`, as a table file renders it:
    its name (for its documented schema), its rows, and facts about the run for its metadata."""

    name: str
    frame: pd.DataFrame
    run_meta: dict[str, str]


@dataclass(frozen=True)
class _Lazy:
    """A renderer class named by its module, imported when first made: a renderer's module
    (bokeh for HTML, pyarrow for the tables) is imported only by the command that writes
    its output."""

    module: str
    cls: str

    def __call__(self, **options: Any) -> Renderer[Any]:
        made: Renderer[Any] = getattr(import_module(self.module), self.cls)(**options)
        return made


@dataclass(frozen=True)
class FunctionRenderer:
    """A module's ``render`` function as a :class:`Renderer` (the gate's JUnit and Markdown,
    the HTML report: each reads something else than the document, see the module doc)."""

    name: str
    reads: str
    function: Callable[[Any], str | bytes]

    def render(self, subject: Any) -> str | bytes:
        return self.function(subject)


@dataclass(frozen=True)
class _LazyFunction:
    """A render function named by its module, imported when first made (as :class:`_Lazy`)."""

    module: str
    function: str
    name: str
    reads: str

    def __call__(self, **options: Any) -> Renderer[Any]:
        return FunctionRenderer(self.name, self.reads, getattr(import_module(self.module), self.function))


# Each renderer by name: calling an entry makes one.
RENDERERS: dict[str, Callable[..., Renderer[Any]]] = {
    "console": _Lazy("tracekit.render.console", "ConsoleRenderer"),
    "json": _Lazy("tracekit.render.document", "JsonRenderer"),
    "junit": _LazyFunction("tracekit.render.junit", "render", "junit", "gate"),
    "markdown": _LazyFunction("tracekit.render.markdown", "render", "markdown", "gate"),
    "html": _LazyFunction("tracekit.render.html", "render_report", "html", "analysis"),
    "parquet": _Lazy("tracekit.render.tables", "ParquetRenderer"),
    "csv": _Lazy("tracekit.render.tables", "CsvRenderer"),
    "tensorboard": _Lazy("tracekit.render.tensorboard", "TensorBoardRenderer"),
}
