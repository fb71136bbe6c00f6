"""One registry of idle causes (tracekit.vocab.IDLE_CAUSES) that every output reads.

A throwaway cause registered there (tests/extra_cause.py, in a subprocess so that no other
test sees it) must appear in every output, each listing exactly the registered causes in
their order: the console, the JSON document and its schema, the tables, the HTML report,
the merged trace, the gate (limits, baseline, checks) and the commands' help.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from conftest import ROOT, SAMPLES
from tracekit.schemas import ANALYSIS_SCHEMA_PATH, analysis_schema_text
from tracekit.vocab import IDLE_CAUSES

RUN = SAMPLES / "1f1b"


def test_the_registry_is_consistent():
    keys = [c.key for c in IDLE_CAUSES]
    assert len(set(keys)) == len(keys)
    assert len({c.label for c in IDLE_CAUSES}) == len(keys)
    assert len({c.legend for c in IDLE_CAUSES}) == len(keys)
    aliases = [a for c in IDLE_CAUSES for a in c.aliases]
    assert len(set(aliases)) == len(aliases) and not set(aliases) & set(keys)
    assert {c.kind for c in IDLE_CAUSES} <= {"schedule", "removable"}
    assert {c.drawn for c in IDLE_CAUSES} <= {"front", "back", "middle"}
    assert all(re.fullmatch(r"#[0-9A-F]{6}", c.color) for c in IDLE_CAUSES)


def test_the_schema_file_lists_the_registered_causes():
    assert ANALYSIS_SCHEMA_PATH.read_text() == analysis_schema_text(), (
        "the analysis schema is behind tracekit.vocab.IDLE_CAUSES: run python -m tracekit.schemas"
    )


@pytest.fixture(scope="module")
def with_extra(tmp_path_factory) -> tuple[Path, list[str]]:
    """Every output of the sample run with a throwaway cause registered: (folder, outputs)."""
    out = tmp_path_factory.mktemp("extra_cause")
    commands = [
        f"analyze {RUN} --no-progress",
        f"analyze {RUN} --json --no-progress",
        f"export {RUN} --tables {out / 'tables'} --csv --no-progress",
        f"report {RUN} -o {out / 'report.html'} --no-progress",
        f"export {RUN} -o {out / 'merged.json'} --no-progress",
        f"check {RUN} --max-cause xtra=0.99 --json --no-config --no-progress",
        f"baseline {RUN} -o {out / 'baseline.json'} --no-progress",
        f"check {RUN} --baseline {out / 'baseline.json'} --json --no-config --no-progress",
        "check --help",
        "baseline --help",
        "export --help",
    ]
    argv = [a for command in commands for a in ("::", *command.split())]
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(out / "cache"), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "tests" / "extra_cause.py"), str(out), *argv], env=env, check=True)
    outputs = [(out / f"{n}.out").read_text() for n in range(len(commands))]
    codes = [(out / f"{n}.rc").read_text() for n in range(len(commands))]
    assert codes == ["0"] * len(commands), list(zip(commands, codes, outputs))
    return out, outputs


def _registered(extra: str) -> list[str]:
    return [c.key for c in IDLE_CAUSES] + [extra]


def test_the_console_lists_exactly_the_registered_causes(with_extra):
    console = with_extra[1][0]
    header = next(line for line in console.splitlines() if line.startswith("rank "))
    labels = [c.label for c in IDLE_CAUSES] + ["xtra"]
    assert header.split()[-len(labels) :] == labels
    assert header.split()[-len(labels) - 1] == "bubble"  # nothing else among the causes
    assert re.search(r"^  extra cause +[0-9.]+ ms", console, re.M)
    assert "xtra: extra cause" in console


def test_the_json_lists_exactly_the_registered_causes(with_extra):
    out, outputs = with_extra
    doc = json.loads(outputs[1])
    jsonschema.validate(doc, json.loads((out / "schema.json").read_text()))
    columns = [f"{c}_ns" for c in _registered("extra")]
    assert all(list(r["causes"]) == columns for r in doc["ranks"])
    assert sum(r["causes"]["extra_ns"] for r in doc["ranks"]) > 0


def test_the_tables_list_exactly_the_registered_causes(with_extra):
    out, _ = with_extra
    with open(out / "tables" / "attribution.csv") as f:
        header = next(csv.reader(f))
    assert header == ["rank", "step", "idle_ns", *[f"{c}_ns" for c in _registered("extra")], "run_id"]
    with open(out / "tables" / "idle_intervals.csv") as f:
        causes = {row["cause"] for row in csv.DictReader(f)}
    assert "extra" in causes and causes <= set(_registered("extra"))


def test_the_report_and_the_merged_trace_draw_the_cause(with_extra):
    out, _ = with_extra
    html = (out / "report.html").read_text()
    assert "extra legend" in html and "#44BB99" in html
    trace = json.loads((out / "merged.json").read_text())
    drawn = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "bubble"}
    assert "extra" in drawn and drawn <= set(_registered("extra"))


def test_the_gate_checks_exactly_the_registered_causes(with_extra):
    out, outputs = with_extra
    limits = json.loads(outputs[5])
    assert [c["id"] for c in limits["checks"] if c["id"].startswith("cause.")] == ["cause.extra"]
    assert list(limits["measures"]["causes"]) == _registered("extra")
    assert list(json.loads((out / "baseline.json").read_text())["causes"]) == _registered("extra")
    against = json.loads(outputs[7])
    ids = [c["id"] for c in against["checks"] if c["id"].startswith("baseline.cause.")]
    assert ids == [f"baseline.cause.{c}" for c in _registered("extra")]


def test_the_help_lists_exactly_the_registered_causes(with_extra):
    listed = ", ".join(_registered("extra"))
    for help_text in with_extra[1][8:]:
        assert listed in " ".join(help_text.split()), help_text
