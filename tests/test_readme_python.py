"""The README's Python example (the block under "### Python API") runs as written, and the
shell-completion scripts the README names are what click prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT


def _python_api_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^### Python API\n+```python\n(.*?)\n```", text, re.DOTALL | re.MULTILINE)
    assert match, "README.md has no ```python block under ### Python API"
    return match.group(1)


def test_the_readme_python_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # its paths are the checkout's (sample_traces/...)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_python_api_example(), "README.md (### Python API)", "exec"), {"__name__": "readme"})
    lines = printed.getvalue().splitlines()
    # the first print is the recognised schedule of the sample named in the example
    assert lines[0] == "Interleaved1F1B 4 2 8"
    assert len(lines) > 3


@pytest.mark.parametrize(
    "shell, line",
    [("zsh", "compdef _tracekit_completion tracekit"), ("fish", "complete --no-files --command tracekit")],
)
def test_the_other_shells_completion_scripts(shell, line):
    code = "import sys\nsys.argv = ['tracekit']\nfrom tracekit.cli import run\nrun()\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "_TRACEKIT_COMPLETE": f"{shell}_source"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert line in done.stdout
