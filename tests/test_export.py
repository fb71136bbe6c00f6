"""tracekit export: one Chrome trace of the whole run, checked the way Perfetto and
chrome://tracing read it (slices, flow arrows and their binding, thread names)."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.analyze.attribution import CATEGORIES
from tracekit.analyze.intervals import idle_intervals
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.render.chrome_trace import lanes, to_chrome_trace

ACTION_NAME = re.compile(r"^[FBIW] s\d+ mb(\d+|\?)$")


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cached(monkeypatch, loaded_runs):
    monkeypatch.setattr("tracekit.commands.export.load_with_progress", lambda path, *_: loaded_runs(Path(path))[0])


def _inside(slices: list[tuple[int, int]], t: int) -> bool:
    """Whether a slice encloses time t (half-open: a slice's end belongs to what follows)."""
    return any(start <= t < end or start == t == end for start, end in slices)


def validate(doc: dict) -> dict:
    """Structural checks of a Chrome trace; returns the X events per (pid, tid)."""
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "M", "s", "f"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    tracks: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] != "X":
            continue
        assert all(k in e for k in ("name", "ts", "dur", "pid", "tid")), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        assert e["pid"] > 0, "pid 0 is the kernel's idle task to Perfetto"
        assert (e["pid"], e["tid"]) in names and e["pid"] in processes, e
        # integer ns, so that nesting checks are exact
        tracks[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for key, slices in tracks.items():
        slices.sort()
        for (_, end), (start, _) in zip(slices, slices[1:]):
            assert start >= end, f"overlapping slices on {names[key]} of {processes[key[0]]}"
    flows = defaultdict(list)
    for e in events:
        if e["ph"] in "sf":
            flows[e["id"]].append(e)
    for flow_id, pair in flows.items():
        assert sorted(e["ph"] for e in pair) == ["f", "s"], flow_id
        begin, finish = sorted(pair, key=lambda e: e["ph"] == "f")
        assert begin["name"] == finish["name"] and begin["cat"] == finish["cat"]
        assert begin["ts"] <= finish["ts"], flow_id
        # flow ends bind to slices on their own thread: the start to the enclosing one, the
        # finish to the enclosing one (bp "e") or to the next slice that starts
        ts_s, ts_f = round(begin["ts"] * 1000), round(finish["ts"] * 1000)
        assert _inside(tracks[(begin["pid"], begin["tid"])], ts_s), begin
        if finish.get("bp") == "e":
            assert _inside(tracks[(finish["pid"], finish["tid"])], ts_f), finish
        else:
            assert any(start >= ts_f for start, _ in tracks[(finish["pid"], finish["tid"])]), finish
    return {"tracks": tracks, "threads": names, "processes": processes, "flows": flows}


def test_export_merges_every_rank_on_one_clock(tmp_path, loaded_runs):
    out = tmp_path / "merged.json.gz"
    result = cli("export", SAMPLES / "1f1b", "-o", out, "--no-progress")  # the real command, no cache
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "ui.perfetto.dev" in result.output
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    doc = json.loads(gzip.decompress(raw))
    seen = validate(doc)

    run, analysis = loaded_runs(SAMPLES / "1f1b")
    assert doc["otherData"]["origin_ns"] == int(run.events["start_ns"].min())
    assert set(seen["processes"].values()) == {f"rank {r}" for r in run.ranks}
    for pid in seen["processes"]:
        assert {"compute", "bubbles", "p2p", "steps"} <= {n for (p, _), n in seen["threads"].items() if p == pid}

    events = doc["traceEvents"]
    actions = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    assert len(actions) == len(run.actions)  # round trip: every action, once
    by_id = run.actions.set_index("action_id")
    for e in actions:
        assert ACTION_NAME.match(e["name"]), e["name"]
        row = by_id.loc[e["args"]["action_id"]]
        assert e["args"]["stage"] == row.stage and e["args"]["microbatch"] == row.microbatch
        assert e["args"]["duration_ns"] == row.end_ns - row.start_ns
        assert e["args"]["source_index"] == row.source_index
        assert seen["processes"][e["pid"]] == f"rank {row['rank']}"
        assert round(e["ts"] * 1000) == row.start_ns - doc["otherData"]["origin_ns"]
    assert len(seen["flows"]) == len(run.messages)

    bubbles = [e for e in events if e["ph"] == "X" and e["cat"] == "bubble"]
    assert len(bubbles) == len(idle_intervals(analysis))
    assert {e["name"] for e in bubbles} <= set(CATEGORIES)
    assert all(seen["threads"][(e["pid"], e["tid"])].startswith("bubbles") for e in bubbles)
    # the drawn idle per rank and cause is the attributed idle, to a viewer's resolution
    # (1 µs per step): idle_intervals rounds where it lays the causes out
    drawn = Counter()
    for e in bubbles:
        drawn[(seen["processes"][e["pid"]], e["name"])] += round(e["dur"] * 1000)
    table = analysis.attribution.table
    for rank, rows in table.groupby("rank"):
        allowed_ns = 1000 * len(rows)
        total = sum(drawn[(f"rank {rank}", c)] for c in CATEGORIES)
        assert abs(total - rows["idle_ns"].sum()) <= allowed_ns
        for cause in CATEGORIES:
            error = abs(drawn[(f"rank {rank}", cause)] - rows[f"{cause}_ns"].sum())
            assert error <= allowed_ns, (rank, cause, error)


def test_plain_json_when_the_name_has_no_gz(tmp_path, cached):
    out = tmp_path / "zbv.json"
    assert cli("export", SAMPLES / "zbv", "-o", out).exit_code == 0
    doc = json.loads(out.read_text())  # not compressed
    validate(doc)
    assert doc["otherData"]["schedule"]["name"] == "ZBVZeroBubble"


def test_arrows_without_known_actions_start_at_the_send_and_land_after_arrival(loaded_runs):
    run, analysis = loaded_runs(SAMPLES / "1f1b")
    messages = run.messages.copy()
    messages.loc[::2, "producer_action"] = -1
    messages.loc[::3, "consumer_action"] = -1
    doc = to_chrome_trace(replace(analysis, run=replace(run, messages=messages)))
    seen = validate(doc)
    assert len(seen["flows"]) == len(messages)
    unbound = [e for e in doc["traceEvents"] if e["ph"] == "f" and "bp" not in e]
    assert len(unbound) == (messages["consumer_action"] < 0).sum()
    starts_on_p2p = [e for e in doc["traceEvents"] if e["ph"] == "s" and seen["threads"][(e["pid"], e["tid"])] == "p2p"]
    assert len(starts_on_p2p) == (messages["producer_action"] < 0).sum()


def test_a_run_without_a_pipeline_is_refused(loaded_runs):
    run, analysis = loaded_runs(SAMPLES / "1f1b")
    with pytest.raises(TracekitError, match="no pipeline actions"):
        to_chrome_trace(replace(analysis, run=replace(run, schedule=None)))


@pytest.fixture
def run_copy(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("capture.json", "rank0.json.gz", "rank1.json.gz", "rank2.json.gz", "rank3.json.gz"):
        (run / name).write_bytes((SAMPLES / "1f1b" / name).read_bytes())
    return run


@pytest.mark.parametrize(
    "name, message",
    [
        ("rank2.json.gz", "is one of the run's input traces"),
        ("merged.json.gz", "would be read as one more trace"),
        ("capture.json", "capture manifest"),
    ],
)
def test_never_writes_over_or_into_the_run(run_copy, name, message):
    target = run_copy / name
    before = target.read_bytes() if target.exists() else None
    result = cli("export", run_copy, "-o", target)
    assert result.exit_code == 2 and message in result.output, result.output
    assert (target.read_bytes() if target.exists() else None) == before


def test_overlapping_slices_get_their_own_lanes():
    assert lanes([0, 5, 10], [5, 10, 15]) == [0, 0, 0]  # touching is not overlapping
    assert lanes([0, 2, 4, 12], [10, 3, 11, 13]) == [0, 1, 1, 0]
