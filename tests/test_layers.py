"""The house has one direction: a module imports only from its own layer or the layers below.

Layers, bottom up: the vocabulary every stage shares (model, errors, text, vocab, ...) <
ingest < reconstruct < loading (tracekit.load) < analyze < render and gate < commands < cli.
capture stands beside the stages: it records runs and reads nothing above reconstruct, and
only the command line imports it. Imports under ``if TYPE_CHECKING:`` are types only and
run nowhere; imports inside functions run, and count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tracekit"

# Bottom (0) to top. A name is a module or a package (and everything in it).
LAYERS: dict[str, int] = {
    "tracekit.model": 0,
    "tracekit.errors": 0,
    "tracekit.text": 0,
    "tracekit.vocab": 0,
    "tracekit.version": 0,
    "tracekit.schemas": 0,
    "tracekit.output": 0,
    "tracekit.pyproject": 0,
    "tracekit._lean": 0,
    "tracekit.ingest": 1,
    "tracekit.reconstruct": 2,
    "tracekit.loading": 3,
    "tracekit": 3,  # the package face: tracekit.load
    "tracekit.analyze": 4,
    "tracekit.render": 5,
    "tracekit.gate": 5,
    "tracekit.commands": 6,
    # a window analysed while training runs, in the handler's analysis worker (a process of its own)
    "tracekit.monitor.window": 6,
    "tracekit.monitor.worker": 6,
    "tracekit.notebook": 6,  # the notebook face: tracekit.analysis, compare, whatif (figures from render)
    "tracekit.cli": 7,
    "tracekit.__main__": 7,
}
CAPTURE = "tracekit.capture"
CAPTURE_READS_UP_TO = LAYERS["tracekit.reconstruct"]
CAPTURE_USERS = ("tracekit.commands", "tracekit.cli")


def layer_of(module: str) -> tuple[str, int]:
    """The longest layer name that is ``module`` or a package holding it."""
    for name in sorted(LAYERS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name, LAYERS[name]
    raise KeyError(f"{module}: in no layer of tests/test_layers.py; give it one")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported tracekit module, line) for every import that runs: not the ones under
    ``if TYPE_CHECKING:``."""
    here = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names if a.name.split(".")[0] == "tracekit")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here.split(".")[: len(here.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == "tracekit":
                    found.append((target, child.lineno))
            visit(child)

    visit(ast.parse(source))
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every import of ``module`` that runs back up the layers, as one line each."""
    out = []
    for target, line in runtime_imports(source, module, is_package):
        if module.startswith(CAPTURE) or target.startswith(CAPTURE):
            if module.startswith(CAPTURE) and not target.startswith(CAPTURE):
                name, level = layer_of(target)
                if level > CAPTURE_READS_UP_TO:
                    out.append(f"{module}:{line} imports {target}: capture reads nothing above reconstruct")
            elif target.startswith(CAPTURE) and not module.startswith(CAPTURE) and not module.startswith(CAPTURE_USERS):
                out.append(f"{module}:{line} imports {target}: only the command line imports capture")
            continue
        own_name, own = layer_of(module)
        name, level = layer_of(target)
        if level > own:
            out.append(
                f"{module}:{line} imports {target}: {own_name} (layer {own}) may not import {name} (layer {level})"
            )
    return out


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def test_no_import_runs_back_up_the_layers():
    found = [
        v
        for module, path in _modules()
        for v in violations(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    ]
    assert found == [], "imports that run back up:\n" + "\n".join(found)


def test_every_module_has_a_layer():
    for module, _ in _modules():
        if not module.startswith(CAPTURE):
            layer_of(module)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "tracekit.analyze.compare",
            "from tracekit.render.console import CAUSE_NAMES\n",
            "may not import tracekit.render",
        ),
        (
            "tracekit.ingest",
            "def f():\n    from tracekit.reconstruct import reconstruct\n",
            "may not import tracekit.reconstruct",
        ),
        ("tracekit.ingest.cache", "from tracekit import __version__\n", "may not import tracekit (layer 3)"),
        ("tracekit.gate.baseline", "from tracekit.commands.common import x\n", "may not import tracekit.commands"),
        (
            "tracekit.capture.runner",
            "from tracekit.analyze import analyze\n",
            "capture reads nothing above reconstruct",
        ),
        ("tracekit.analyze", "from tracekit.capture import config\n", "only the command line imports capture"),
        ("tracekit.render.json", "from ..commands import common\n", "may not import tracekit.commands"),
    ],
)
def test_the_check_catches_an_import_up(module, source, expected):
    """The checker itself: each of these would be an arrow back up."""
    found = violations(module, source, is_package=module == "tracekit.ingest")
    assert len(found) == 1 and expected in found[0], found


def test_types_only_and_downward_imports_pass():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tracekit.reconstruct.labels import LabelSet\n"
        "from tracekit.model.run import Run\nfrom tracekit.errors import TracekitError\n"
    )
    assert violations("tracekit.ingest.options", source) == []
    assert violations("tracekit.render.junit", "from tracekit.gate.checks import GateResult\n") == []
