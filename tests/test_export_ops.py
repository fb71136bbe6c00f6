"""tracekit export -o FILE --with-ops: each action's own ops nested under its slice, checked
against the rank traces themselves (read with gzip and json, not with tracekit)."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

from click.testing import CliRunner
from conftest import SAMPLES

from tracekit.cli import main


def _export(tmp_path, run: str, *more: str) -> dict:
    out = tmp_path / "ops.json.gz"
    result = CliRunner().invoke(main, ["export", str(SAMPLES / run), "-o", str(out), "--no-progress", *more])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "ops in them" in result.output
    return json.loads(gzip.decompress(out.read_bytes()))


def _ns(event: dict) -> tuple[int, int]:
    return round(event["ts"] * 1000), round((event["ts"] + event["dur"]) * 1000)


def _nesting(doc: dict) -> dict[int, int]:
    """Check that the slices of every thread nest (as Perfetto and chrome://tracing draw them:
    a slice lies wholly inside the one open before it, or after it); return each op's parent
    (indices into traceEvents)."""
    threads: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)
    events = doc["traceEvents"]
    for index, e in enumerate(events):
        assert e["ph"] in {"X", "M", "s", "f"}, e
        if e["ph"] == "X":
            start, end = _ns(e)
            threads[(e["pid"], e["tid"])].append((start, -end, index))
    parent: dict[int, int] = {}
    for key, slices in threads.items():
        open_: list[tuple[int, int]] = []  # (end, index) of the enclosing slices
        for start, neg_end, index in sorted(slices):
            while open_ and open_[-1][0] <= start and not (open_[-1][0] == start == -neg_end):
                open_.pop()
            if open_:
                assert -neg_end <= open_[-1][0], f"slice {events[index]} overlaps {events[open_[-1][1]]} on {key}"
                parent[index] = open_[-1][1]
            open_.append((-neg_end, index))
    return parent


def _ops_under(doc: dict) -> dict[int, list[dict]]:
    """Each action's nested ops (by action id), those whose parent chain reaches the action."""
    parent = _nesting(doc)
    events = doc["traceEvents"]
    under: dict[int, list[dict]] = defaultdict(list)
    for index, e in enumerate(events):
        if e["ph"] != "X" or e["cat"] in ("compute", "bubble", "p2p", "step"):
            continue
        above = parent.get(index)
        while above is not None and events[above]["cat"] != "compute":
            above = parent.get(above)
        assert above is not None, f"op {e} is not inside an action"
        assert events[above]["args"]["action_id"] == e["args"]["action_id"], (e, events[above])
        under[e["args"]["action_id"]].append(e)
    return under


def test_labelled_actions_hold_their_two_top_levels_of_ops(tmp_path):
    doc = _export(tmp_path, "interleaved1f1b", "--with-ops")
    under = _ops_under(doc)
    actions = {e["args"]["action_id"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"}
    assert set(under) == set(actions), "every action holds ops"
    assert doc["otherData"]["counts"]["ops"] == sum(len(ops) for ops in under.values())
    assert doc["otherData"]["counts"]["ops_left_out"] == 0

    # rank 0's PP:0F0, against its own trace: the label's depth + 1 and + 2, nothing deeper
    raw = json.loads(gzip.decompress((SAMPLES / "interleaved1f1b" / "rank0.json.gz").read_bytes()))["traceEvents"]
    label = next(e for e in raw if e.get("name") == "PP:0F0" and e.get("cat") == "user_annotation")
    first = next(a for a in actions.values() if a["pid"] == 1 and a["args"]["label"] == "PP:0F0")
    ops = under[first["args"]["action_id"]]
    assert {op["args"]["depth"] for op in ops} == {2, 3}  # ProfilerStep 0 > PP: label 1 > ops
    in_label = [
        e
        for e in raw
        if e.get("ph") == "X"
        and e.get("tid") == label["tid"]
        and e.get("cat") == "cpu_op"
        and label["ts"] <= e["ts"]
        and e["ts"] + e["dur"] <= label["ts"] + label["dur"]
    ]
    counts = Counter(op["name"] for op in ops)
    raw_counts = Counter(e["name"] for e in in_label)
    # two layers per stage: their Linear and ReLU at the top, addmm inside each Linear
    assert counts["aten::linear"] == raw_counts["aten::linear"] == 2
    assert counts["aten::addmm"] == raw_counts["aten::addmm"] == 2
    assert counts["TracekitEmuCompute"] == raw_counts["TracekitEmuCompute"] == 2
    assert raw_counts["aten::as_strided"] > 0 and "aten::as_strided" not in counts  # depth 5: left out


def test_unlabelled_actions_nest_their_segment_ops(tmp_path):
    """Native Schedule1F1B has no labels: an action is a run of top-level ops; they and the
    ops directly in them go under it."""
    doc = _export(tmp_path, "1f1b", "--with-ops")
    under = _ops_under(doc)
    backward = [ops for ops in under.values() if any(op["name"].startswith("autograd::engine") for op in ops)]
    assert backward, "backward actions hold their autograd ops"
    for ops in under.values():
        depths = {op["args"]["depth"] for op in ops}
        assert max(depths) - min(depths) <= 1


def test_without_with_ops_the_export_is_unchanged(tmp_path):
    out = tmp_path / "plain.json"
    result = CliRunner().invoke(main, ["export", str(SAMPLES / "1f1b"), "-o", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_bytes())
    assert {e["cat"] for e in doc["traceEvents"] if e["ph"] == "X"} == {"compute", "bubble", "p2p", "step"}
    assert "ops" not in doc["otherData"]["counts"]


def test_with_ops_needs_the_merged_trace(tmp_path):
    result = CliRunner().invoke(main, ["export", str(SAMPLES / "1f1b"), "--tables", str(tmp_path / "t"), "--with-ops"])
    assert result.exit_code == 2
    assert result.output.strip() == "tracekit: error: --with-ops: nests the ops in the merged trace; give -o FILE"


def test_on_a_gpu_run_the_kernels_go_under_their_action(tmp_path):
    """A GENERATED GPU pipeline (tests/gpu_tracegen.py; not a real trace): on the device
    timeline an action is its kernels' span, and they nest under it."""
    from gpu_tracegen import SCENARIOS, generate

    folder, _ = generate(SCENARIOS["interleaved"], tmp_path / "gpu")
    out = tmp_path / "ops.json"
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(out), "--no-progress", "--with-ops"])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(out.read_bytes())
    under = _ops_under(doc)
    actions = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
    assert len(under) == len(actions)
    assert {op["cat"] for ops in under.values() for op in ops} == {"device"}
    assert {op["args"]["kind"] for ops in under.values() for op in ops} == {"compute"}  # P2P kernels: not an action's
    for action in actions:  # the action's span is its kernels': the first starts it, the last ends it
        ops = under[action["args"]["action_id"]]
        assert min(_ns(op)[0] for op in ops) == _ns(action)[0]
        assert max(_ns(op)[1] for op in ops) == _ns(action)[1]
