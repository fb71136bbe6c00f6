"""The README's two commands are the ones CI runs and the ones that work."""

from __future__ import annotations

import re

from conftest import ROOT


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .+?)\n```", text)


def test_readme_has_two_commands_and_ci_runs_the_second():
    commands = _commands()
    assert len(commands) >= 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci


def test_first_command_analyses_a_bundled_sample():
    first = _commands()[0]
    match = re.search(r"tracekit analyze (\S+)", first)
    assert match and (ROOT / match.group(1) / "capture.json").is_file()
