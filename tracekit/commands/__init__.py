"""One module per CLI subcommand; each exposes a click command, collected here.

A command module that fails to import is an error, not a missing command: the ImportError
propagates, so a broken install or a typo shows at once instead of as a subcommand that is
silently not there.
"""

from __future__ import annotations

import importlib

import click

_MODULES = ["analyze", "whatif", "report", "check", "baseline", "diff", "export", "capture", "cache"]


def _collect() -> list[click.Command]:
    return [importlib.import_module(f"tracekit.commands.{name}").command for name in _MODULES]


COMMANDS = _collect()
