"""Issue #29's acceptance on GENERATED traces from an independent writer
(tests/independent_tracegen.py, not tests/gpu_tracegen.py): torch's native Schedule1F1B on
NCCL over 4 GPUs, no labels, the host up to two steps ahead of the GPU, in every variant a
real torch could write (with or without record_shapes, composite ops with or without
autograd numbers, a user range around each forward, both, the host synchronised each step).

tracekit must read the schedule (1F1B p=4 v=1 m=8), every action with its stage and
microbatch, every message with its kernels, each rank's device bubble within 0.01 of the
writer's truth, and say nothing is wrong.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

from device_reference import bubble_rows, kineto_rank_ops
from independent_tracegen import BASE_TIME_NS, VARIANTS, generate
from tracekit import load
from tracekit.cli import main
from tracekit.loading import LoadOptions

BUBBLE_TOLERANCE = 0.01
KERNEL_TOLERANCE_NS = 1_000


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each variant written, loaded and analysed once as the command line does (each file's
    working set reduced where it is parsed): (folder, truth, run, document)."""
    out = tmp_path_factory.mktemp("independent")
    cache = {}

    def get(name: str):
        if name not in cache:
            folder, truth = generate(name, out)
            result = CliRunner().invoke(main, ["analyze", str(folder), "--json"])
            assert result.exit_code == 0, result.output
            cache[name] = (folder, truth, load(folder, LoadOptions(rows="reduce")), json.loads(result.output))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_writers_truth_is_the_reference_definition(written, name):
    """The truth is what tests/device_reference.py reads off the written files: the writer
    and the reference agree on every step's window, busy and idle."""
    folder, truth, _, _ = written(name)
    reference = bubble_rows([kineto_rank_ops(folder / f"rank{r}.json.gz") for r in range(4)])
    assert [(r.rank, r.step, r.window_ns, r.busy_ns, r.idle_ns) for r in reference] == [
        (r["rank"], r["step"], r["window_ns"], r["busy_ns"], r["idle_ns"])
        for r in sorted(truth["bubbles"], key=lambda r: (r["step"], r["rank"]))
    ]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_schedule_is_read(written, name):
    _, truth, run, doc = written(name)
    assert run.actions_from == "segmentation"
    schedule = doc["schedule"]
    assert (schedule["name"], schedule["p"], schedule["v"], schedule["m"]) == tuple(truth["schedule"])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_action_is_found_with_its_stage_and_microbatch(written, name):
    _, truth, run, _ = written(name)
    expected = defaultdict(list)
    for a in truth["actions"]:
        expected[(a["rank"], a["step"])].append((a["stage"], a["kind"], a["microbatch"]))
    found = {
        (int(rank), int(step)): [(int(a.stage), a.kind, int(a.microbatch)) for a in group.itertuples()]
        for (rank, step), group in run.actions.sort_values("start_ns").groupby(["rank", "step"])
    }
    assert sorted(found) == sorted(expected)
    for key, actions in expected.items():
        assert found[key] == actions, f"{name}: rank {key[0]} step {key[1]}"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_message_is_found_with_its_kernels(written, name):
    _, truth, run, doc = written(name)
    links = sorted((int(m.step), int(m.src_rank), int(m.dst_rank)) for m in run.messages.itertuples())
    assert links == sorted((m["step"], m["src_rank"], m["dst_rank"]) for m in truth["messages"])
    got, expected = defaultdict(list), defaultdict(list)
    for row in doc["device"]["p2p_pairs"]:
        got[(row["step"], row["src_rank"], row["dst_rank"])].append((row["send_start_ns"], row["recv_start_ns"]))
    for m in truth["messages"]:
        sides = (BASE_TIME_NS + m["send_start_ns"], BASE_TIME_NS + m["recv_start_ns"])
        expected[(m["step"], m["src_rank"], m["dst_rank"])].append(sides)
    assert sorted(got) == sorted(expected)
    for key, sides in expected.items():
        pairs = list(zip(sorted(sides), sorted(got[key])))
        assert len(got[key]) == len(sides), f"{name} {key}"
        off = [
            (want, have) for want, have in pairs if max(abs(w - h) for w, h in zip(want, have)) > KERNEL_TOLERANCE_NS
        ]
        assert not off, f"{name} {key}: kernels (send, recv start) expected vs found: {off[:3]}"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_ranks_bubble_is_within_a_hundredth_of_the_truth(written, name):
    """Over the run and in every step."""
    _, truth, _, doc = written(name)
    got = {(row["rank"], None): row["bubble_ratio"] for row in doc["ranks"]}
    got |= {(row["rank"], step["step"]): row["bubble_ratio"] for step in doc["steps"] for row in step["ranks"]}
    expected = {(row["rank"], None): row["bubble_ratio"] for row in truth["ranks"]}
    expected |= {(row["rank"], row["step"]): row["bubble_ratio"] for row in truth["bubbles"]}
    assert sorted(got, key=str) == sorted(expected, key=str)
    wrong = [
        f"rank {rank} step {step}: expected {ratio:.4f}, got {got[(rank, step)]:.4f}"
        for (rank, step), ratio in expected.items()
        if abs(got[(rank, step)] - ratio) > BUBBLE_TOLERANCE
    ]
    assert not wrong, f"{name}: " + "; ".join(wrong)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_nothing_is_said_to_be_wrong(written, name):
    _, _, run, doc = written(name)
    assert doc["warnings"] == []
    assert run.warnings == ()
