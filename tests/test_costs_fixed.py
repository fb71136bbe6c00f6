"""The cost model's fixed part (tracekit.analyze.costs.op_fixed_ns): the share of an action's
compute outside its work ops (the small ops and the gaps between ops), which a smaller
microbatch does not shrink (``--keep global-batch``). Measured on the project's captures
of 1F1B p=4 at m=8 and at m=16 with the global batch kept (each layer's cost half)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import SAMPLES
from tracekit import LoadOptions, load
from tracekit.analyze.costs import _union_ns, cost_model, op_fixed_ns
from tracekit.analyze.whatif import predict


@pytest.fixture(scope="module")
def runs():
    return {
        name: load(SAMPLES / name, LoadOptions(jobs=1, rows="analysis"))
        for name in ("1f1b", "validation/1f1b_m16_global_batch")
    }


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
    assert _union_ns(starts, ends) == int(covered.sum())
