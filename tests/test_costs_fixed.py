"""Each action's fixed part (tracekit.reconstruct.fixed_part, read by the cost model through
tracekit.analyze.costs.op_fixed_ns): the share of an action's
compute outside its work ops (the small ops and the gaps between ops), which a smaller
microbatch does not shrink (``--keep global-batch``). Measured on the project's captures
of 1F1B p=4 at m=8 and at m=16 with the global batch kept (each layer's cost half)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import SAMPLES
from tracekit import LoadOptions, load
from tracekit.analyze.costs import cost_model, op_fixed_ns
from tracekit.analyze.whatif import predict
from tracekit.model.intervals import union_length


@pytest.fixture(scope="module")
def runs():
    return {
        name: load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
        for name in ("1f1b", "validation/1f1b_m16_global_batch")
    }


@pytest.mark.parametrize("name", ["1f1b", "validation/1f1b_m16_global_batch", "interleaved_zb"])
def test_every_load_carries_the_same_fixed_part(runs, name):
    # measured where each rank's actions are found: the reduce (what the command line and the
    # monitor load) keeps only the actions, and gives each the same fixed part as the working set
    full = runs[name] if name in runs else load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(SAMPLES / name, LoadOptions(jobs=2, rows="reduce"))
    assert len(reduced.events) < len(full.events)
    key = ["rank", "step", "start_ns"]
    a = full.actions.sort_values(key)[key + ["fixed_ns"]].to_numpy()
    b = reduced.actions.sort_values(key)[key + ["fixed_ns"]].to_numpy()
    assert (a == b).all()
    assert (full.actions["fixed_ns"] > 0).mean() > 0.9
    assert (full.actions["fixed_ns"] <= full.actions["end_ns"] - full.actions["start_ns"]).all()


def _forwards(run):
    acts = run.actions[(run.actions["step"] >= 0) & (run.actions["kind"] == "F")]
    fixed = op_fixed_ns(run).reindex(acts["action_id"]).to_numpy()
    return fixed, (acts["end_ns"] - acts["start_ns"]).to_numpy()


def test_the_fixed_part_stays_when_the_microbatch_halves(runs):
    fixed8, span8 = _forwards(runs["1f1b"])
    fixed16, span16 = _forwards(runs["validation/1f1b_m16_global_batch"])
    assert (fixed8 >= 0).all() and (fixed8 <= span8).all()
    # the forward halves (13.8 -> 7.6 ms), its fixed part does not (1.0 -> 0.94 ms)
    assert 0.5 < np.median(span16) / np.median(span8) < 0.6
    assert 0.8 < np.median(fixed16) / np.median(fixed8) < 1.2
    assert 0.02 < np.median(fixed8) / np.median(span8) < 0.15


def test_a_smaller_microbatch_keeps_the_fixed_part(runs):
    model = cost_model(runs["1f1b"])
    assert all(0 < model.fixed_share[(r, k)] < 0.2 for r in model.ranks for k in ("F", "B"))
    with_fixed = predict(model, "1F1B", 1, 16, "global-batch", samples=8)
    none = predict(replace(model, fixed_share={}), "1F1B", 1, 16, "global-batch", samples=8)
    assert with_fixed.step_ns > none.step_ns * 1.03
    # m kept: nothing changes
    same = predict(model, "1F1B", 1, 8, "global-batch", samples=8)
    same_none = predict(replace(model, fixed_share={}), "1F1B", 1, 8, "global-batch", samples=8)
    assert same.step_ns == same_none.step_ns


def test_m_scaled(runs):
    model = replace(cost_model(runs["1f1b"]), fixed_share={(0, "F"): 0.1, (0, "B"): 1.0})
    assert model.m_scaled((0, "F"), 0.5) == pytest.approx(0.55)
    assert model.m_scaled((0, "B"), 0.5) == 1.0
    assert model.m_scaled((1, "F"), 0.5) == 0.5  # no share known: all of it per row


@pytest.mark.parametrize("seed", range(30))
def test_union_of_generated_intervals(seed):
    # generated intervals on a small grid against a brute-force count of the covered ticks
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 12))
    starts = np.sort(rng.integers(0, 50, n))
    ends = starts + rng.integers(0, 15, n)
    covered = np.zeros(70, dtype=bool)
    for s, e in zip(starts, ends):
        covered[s:e] = True
    assert union_length(starts, ends, 0, 100) == int(covered.sum())


def _ops(rows):
    import pandas as pd

    from tracekit.reconstruct.event_arrays import EventArrays

    frame = pd.DataFrame(rows, columns=["rank", "start_ns", "end_ns", "name", "cat", "on_gpu"])
    return EventArrays.of(frame)


def test_fixed_ns_is_the_span_outside_the_work_ops():
    from tracekit.reconstruct.fixed_part import fixed_ns

    # action [0, 1000) on rank 0: a 600 ns op with a 300 ns one nested in it, a 200 ns op,
    # three 10 ns ops (each under 5% of the span), a send (never work), a Python frame over
    # everything (never work), a kernel (not a host op), and an op of rank 1 at the same time
    rows = [
        (0, 50, 650, "aten::linear", "cpu_op", False),
        (0, 100, 400, "aten::addmm", "cpu_op", False),
        (0, 700, 900, "aten::mm", "cpu_op", False),
        (0, 660, 670, "aten::view", "cpu_op", False),
        (0, 910, 920, "aten::add", "cpu_op", False),
        (0, 930, 940, "aten::t", "cpu_op", False),
        (0, 905, 1000, "gloo:send", "cpu_op", False),
        (0, 0, 1000, "module.py(12): forward", "python_function", False),
        (0, 60, 900, "gemm_kernel", "kernel", True),
        (1, 0, 1000, "aten::mm", "cpu_op", False),
        # action [2000, 3000) on rank 1: one op over all of it; action [5000, 6000): nothing inside
        (1, 2000, 3000, "aten::mm", "cpu_op", False),
        (0, 4900, 5100, "aten::mm", "cpu_op", False),  # starts before the action: not inside it
    ]
    actions = {"rank": [0, 1, 0], "start_ns": [0, 2000, 5000], "end_ns": [1000, 3000, 6000]}
    # work ops cover [50, 650) and [700, 900): 800 ns; the rest of the span is fixed
    assert fixed_ns(_ops(rows), actions).tolist() == [200, 0, 0]


@pytest.mark.parametrize("name", ["1f1b", "dualpipev", "interleaved_zb", "megatron_interleaved", "tp2_dp2_pp2"])
def test_every_action_at_once_equals_one_at_a_time(name):
    # fixed_ns finds every action's ops at once where a rank's actions lie apart; each
    # action alone (_one: its own window of the rank's ops) is the plain statement of it
    from tracekit.model.names import COMM_PREFIXES, FRAME_CATEGORY
    from tracekit.reconstruct.event_arrays import EventArrays
    from tracekit.reconstruct.fixed_part import _one, fixed_ns

    run = load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
    events = EventArrays.of(run.events)
    acts = run.actions
    got = fixed_ns(events, {c: acts[c].to_numpy() for c in ("rank", "start_ns", "end_ns")})
    host = ~events["on_gpu"] & ~events.starts_with(COMM_PREFIXES) & ~events.is_in("cat", (FRAME_CATEGORY,))
    want = []
    for rank, begin, end in zip(acts["rank"], acts["start_ns"], acts["end_ns"]):
        mine = np.flatnonzero(host & (events["rank"] == rank))
        order = np.argsort(events["start_ns"][mine], kind="stable")
        starts, ends = events["start_ns"][mine][order], events["end_ns"][mine][order]
        want.append(_one(starts, ends, int(begin), int(end)))
    assert got.tolist() == want
    assert (got > 0).any()


def test_actions_that_overlap_on_a_rank_each_get_their_own_ops():
    from tracekit.reconstruct.fixed_part import fixed_ns

    rows = [(2, 0, 600, "aten::mm", "cpu_op", False), (2, 700, 1400, "aten::mm", "cpu_op", False)]
    # [0, 1000) holds the first op only (the second ends past it); [500, 1500) the second only
    actions = {"rank": [2, 2], "start_ns": [0, 500], "end_ns": [1000, 1500]}
    assert fixed_ns(_ops(rows), actions).tolist() == [400, 300]
