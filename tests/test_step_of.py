"""``step_of`` (which step a rank's time falls in) against the plain rule it implements: the
first row of the step table, in table order, of the time's rank whose window holds the time.
Step tables here are generated (overlapping, touching and out-of-order windows, repeated
numbers, ranks with no steps); the real ones come from every sample."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLES
from tracekit.loading import load
from tracekit.model.run import STEP_COLUMNS
from tracekit.reconstruct.steps import step_of


def _reference(ranks: np.ndarray, times: np.ndarray, steps: dict) -> np.ndarray:
    """One mask over all times per step row, last row first, so the first row wins."""
    out = np.full(len(times), -1, dtype=np.int64)
    rows = list(zip(*(np.asarray(steps[c]).tolist() for c in STEP_COLUMNS[:4])))
    for rank, step, start, end in reversed(rows):
        out[(ranks == rank) & (times >= start) & (times <= end)] = step
    return out


@pytest.mark.parametrize("seed", range(40))
def test_generated_step_tables(seed):
    rng = np.random.default_rng(seed)
    n_steps = int(rng.integers(0, 12))
    steps = {
        "rank": rng.integers(0, 4, n_steps),
        "step": rng.integers(-1, 5, n_steps),  # repeated numbers, and a -1 that is a real row
        "step_start_ns": rng.integers(0, 100, n_steps),
    }
    steps["step_end_ns"] = steps["step_start_ns"] + rng.integers(0, 40, n_steps)
    n = int(rng.integers(0, 300))
    ranks, times = rng.integers(-1, 6, n), rng.integers(-10, 150, n)
    np.testing.assert_array_equal(step_of(ranks, times, steps), _reference(ranks, times, steps))


@pytest.mark.parametrize("sample", ["1f1b", "interleaved1f1b", "dualpipev", "deepspeed_1f1b"])
def test_every_action_of_a_sample(sample):
    run = load(SAMPLES / sample)
    steps = {c: run.steps[c].to_numpy() for c in STEP_COLUMNS[:4]}
    ranks, times = run.actions["rank"].to_numpy(), run.actions["start_ns"].to_numpy()
    # the windows' edges too: a time where two steps touch goes to the earlier one
    edges = np.concatenate([steps["step_start_ns"], steps["step_end_ns"], steps["step_end_ns"] + 1])
    ranks = np.concatenate([ranks, np.tile(steps["rank"], 3)])
    times = np.concatenate([times, edges])
    got = step_of(ranks, times, steps)
    np.testing.assert_array_equal(got, _reference(ranks, times, steps))
    assert (got[: len(run.actions)] == run.actions["step"].to_numpy()).all()
