"""One module per CLI subcommand; each exposes a click command, collected here."""

from __future__ import annotations

import importlib

_MODULES = ["analyze", "whatif", "report", "check", "baseline", "diff", "export", "capture", "cache"]


def _collect():
    commands = []
    for name in _MODULES:
        try:
            module = importlib.import_module(f"tracekit.commands.{name}")
        except ModuleNotFoundError as err:  # a command still being written
            if err.name and err.name.startswith("tracekit.commands."):
                continue
            raise
        commands.append(module.command)
    return commands


COMMANDS = _collect()
