"""tracekit.pyproject: a pyproject.toml is parsed once while unchanged, and every caller
gets its own copy of the tables."""

from __future__ import annotations

import os

from tracekit import pyproject


def test_read_toml_parses_once_while_unchanged_and_again_after_a_change(tmp_path, monkeypatch):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.tracekit.gate]\nmax_bubble = 0.2\n")
    parses = []
    real = pyproject._parse_toml
    monkeypatch.setattr(pyproject, "_parse_toml", lambda p: parses.append(p) or real(p))
    first = pyproject.read_toml(path)
    assert pyproject.read_toml(path) == first == {"tool": {"tracekit": {"gate": {"max_bubble": 0.2}}}}
    assert len(parses) == 1
    path.write_text("[tool.tracekit.gate]\nmax_bubble = 0.3\n")  # same size: the time tells
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert pyproject.read_toml(path)["tool"]["tracekit"]["gate"]["max_bubble"] == 0.3
    assert len(parses) == 2


def test_read_toml_gives_each_caller_its_own_tables(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.tracekit.labels]\nrules = ["a=F"]\n')
    pyproject.read_toml(path)["tool"]["tracekit"]["labels"]["rules"].append("b=B")
    assert pyproject.tracekit_table(path, "labels") == {"rules": ["a=F"]}
