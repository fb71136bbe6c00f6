"""Write docs/api.md, the Python API reference, from the docstrings of ``tracekit``'s public
names and the column documentation of its frames and tables.

Usage: ``python scripts/api_docs.py`` (rewrites docs/api.md); ``--check`` exits 1 when the
file is not what the docstrings give (tests/test_api_docs.py runs the same comparison).
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "api.md"
# Sphinx roles and literals as Markdown code: :func:`~tracekit.load` -> `load`, ``x`` -> `x`
_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_FUNCTIONS = ("analysis", "compare", "whatif", "load", "trace_handler")
_CLASSES = ("RunAnalysis", "RunComparison", "WhatIfResult", "Plots", "LoadOptions", "Monitor")


def _markdown(doc: str) -> str:
    """A docstring as Markdown: its examples (``>>>`` paragraphs) fenced as Python sessions."""
    out = []
    for paragraph in doc.strip().split("\n\n"):
        if paragraph.lstrip().startswith(">>>"):
            out.append("```pycon\n" + paragraph + "\n```")
        else:
            text = _ROLE.sub(lambda m: f"`{m.group(1)}`", paragraph)
            out.append(_LITERAL.sub(r"`\1`", text))
    return "\n\n".join(out)


class _Written(str):
    """An annotation as the source writes it (postponed annotations are strings: shown unquoted)."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj: object) -> str:
    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"

    def written(annotation: object) -> object:
        return _Written(annotation) if isinstance(annotation, str) else annotation

    parameters = [p.replace(annotation=written(p.annotation)) for p in signature.parameters.values()]
    if parameters and parameters[0].name == "self":  # a method, shown as called on an instance
        parameters = parameters[1:]
    return str(signature.replace(parameters=parameters, return_annotation=written(signature.return_annotation)))


def _members(cls: type) -> list[tuple[str, object]]:
    """The public methods and properties ``cls`` defines itself, in source order."""
    return [
        (name, value)
        for name, value in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    ]


def _columns(title: str, specs: dict) -> list[str]:
    lines = [f"## {title}", ""]
    for name, spec in specs.items():
        lines += [f"### `{name}`", "", _markdown(spec.doc), "", "| column | type | meaning |", "|---|---|---|"]
        lines += [
            f"| `{column}` | {dtype} | {doc.replace('|', '/')} |" for column, (dtype, doc) in spec.columns.items()
        ]
        lines.append("")
    return lines


def api_markdown() -> str:
    """docs/api.md's text."""
    import tracekit
    from tracekit import notebook
    from tracekit.analyze.tabular import TABLES

    lines = [
        "# Python API",
        "",
        "Generated from the docstrings by `python scripts/api_docs.py`; do not edit by hand "
        "(tests/test_api_docs.py checks that it is current, and runs every example below).",
        "",
        _markdown(inspect.getdoc(tracekit) or ""),
        "",
        "## In a notebook: `tracekit.notebook`",
        "",
        _markdown(inspect.getdoc(notebook) or ""),
        "",
        "## Functions",
        "",
    ]
    for name in _FUNCTIONS:
        function = getattr(tracekit, name)
        lines += [f"### `tracekit.{name}{_signature(function)}`", "", _markdown(inspect.getdoc(function) or ""), ""]
    lines += ["## Classes", ""]
    for name in _CLASSES:
        cls = getattr(tracekit, name, None) or getattr(notebook, name)
        lines += [f"### `{cls.__module__}.{name}`", "", _markdown(inspect.getdoc(cls) or ""), ""]
        for member, value in _members(cls):
            if isinstance(value, property):
                heading = f"#### `.{member}` (property)"
                doc = inspect.getdoc(value.fget) or ""
            else:
                heading = f"#### `.{member}{_signature(value)}`"
                doc = inspect.getdoc(value) or ""
            lines += [heading, "", _markdown(doc), ""]
    lines += _columns("Frames (RunAnalysis, RunComparison, WhatIfResult)", notebook.FRAMES)
    lines += _columns("Tables (RunAnalysis.tables(), tracekit export --tables)", TABLES)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = api_markdown()
    if "--check" in argv:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python scripts/api_docs.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
