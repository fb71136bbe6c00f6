"""The bubble tables, measured for all (rank, step) pairs at once, equal the loop over
groups they replaced (one ``union_length`` per rank and step, kept below as the
reference), on every sample run and on generated intervals. The references are the bodies of
``measure_pipeline`` and ``measure_continuous`` at tracekit 1b5124f, as they were; what the
fast version left unchanged (``step_windows``, ``continuous_windows``, ``bubble_table``,
``BubbleRow``) is imported from ``tracekit.analyze.bubbles``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from conftest import sample_runs
from tracekit.analyze.bubbles import (
    BubbleRow,
    bubble_table,
    continuous_windows,
    measure_continuous,
    measure_pipeline,
    step_windows,
)
from tracekit.analyze.grouping import int_groups
from tracekit.model.intervals import subtract_intervals, union_length, union_lengths


def reference_pipeline(actions: pd.DataFrame) -> pd.DataFrame:
    """measure_pipeline as it was (tracekit 1b5124f): a union per (rank, step) group; with
    the rule added since (issue #29), stated here on its own: where a step's window runs past
    the next step's start, a rank's window of the first ends, and of the second begins, at
    the later of the next step's start and the end of the rank's own last action of the first
    (unless the rank's own second step starts before that: then both stay global)."""
    w = step_windows(actions)
    windows = {int(s): (int(lo), int(hi)) for s, lo, hi in zip(w["step"], w["window_start_ns"], w["window_end_ns"])}
    ordered = sorted(windows)
    rows: list[BubbleRow] = []
    last_end = {key: int(g["end_ns"].max()) for key, g in int_groups(actions, ["rank", "step"])}
    first_start = {key: int(g["start_ns"].min()) for key, g in int_groups(actions, ["rank", "step"])}
    for (rank, step), group in int_groups(actions, ["rank", "step"]):
        lo, hi = windows[step]
        k = ordered.index(step)

        def boundary(r: int, j: int) -> int | None:
            """Where rank r's windows of steps j and j+1 meet, if they are split there: not
            where its own step j+1 starts before that (its steps overlap on its own)."""
            nxt = ordered[j + 1]
            b = max(windows[nxt][0], last_end[(r, ordered[j])])
            return b if b <= first_start.get((r, nxt), b) else None

        if k + 1 < len(ordered) and hi > windows[ordered[k + 1]][0]:
            b = boundary(rank, k)
            hi = hi if b is None else min(hi, b)
        if k > 0 and windows[ordered[k - 1]][1] > lo and (rank, ordered[k - 1]) in last_end:
            b = boundary(rank, k - 1)
            lo = lo if b is None else max(lo, b)
        busy = union_length(group["start_ns"].to_numpy(), group["end_ns"].to_numpy(), lo, hi)
        rows.append((rank, step, lo, hi, hi - lo, busy))
    return bubble_table(rows)


def reference_continuous(actions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """measure_continuous as it was (tracekit 1b5124f)."""
    w = continuous_windows(actions, steps)
    windows = {
        (int(r), int(s)): (int(lo), int(hi))
        for r, s, lo, hi in zip(w["rank"], w["step"], w["window_start_ns"], w["window_end_ns"])
    }
    rows: list[BubbleRow] = []
    for (rank, step), group in int_groups(actions, ["rank", "step"]):
        lo, hi = windows[(rank, step)]
        busy = union_length(group["start_ns"].to_numpy(), group["end_ns"].to_numpy(), lo, hi)
        rows.append((rank, step, lo, hi, hi - lo, busy))
    return bubble_table(rows)


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_bubbles_equal_the_loop_on_every_sample(loaded_runs, run_dir):
    run, _ = loaded_runs(run_dir)
    actions = run.actions[run.actions["step"] >= 0]
    if actions.empty:
        pytest.skip(f"{run_dir.name}: no actions")
    pdt.assert_frame_equal(measure_pipeline(actions), reference_pipeline(actions))
    pdt.assert_frame_equal(measure_continuous(actions, run.steps), reference_continuous(actions, run.steps))


@pytest.mark.parametrize("seed", range(60))
def test_generated_union_lengths_equal_one_union_per_group(seed):
    # Generated (not captured) intervals: nested, touching, zero-length, some outside the window.
    rng = np.random.default_rng(seed)
    groups, n = int(rng.integers(1, 8)), int(rng.integers(0, 90))
    group = rng.integers(0, groups, n)
    starts = rng.integers(0, 60, n) * 1_000
    ends = starts + rng.integers(0, 5, n) * 1_000
    lo = rng.integers(0, 20, groups) * 1_000
    hi = lo + rng.integers(0, 50, groups) * 1_000
    expected = [union_length(starts[group == g], ends[group == g], int(lo[g]), int(hi[g])) for g in range(groups)]
    assert union_lengths(group, starts, ends, lo, hi).tolist() == expected


def _covered(starts, ends, size: int) -> np.ndarray:
    """Which of the time points 0..size-1 the [start, end) intervals cover (the reference)."""
    out = np.zeros(size, dtype=bool)
    for a, b in zip(starts.tolist(), ends.tolist()):
        out[a:b] = True
    return out


@pytest.mark.parametrize("seed", range(200))
def test_generated_subtraction_leaves_exactly_the_uncut_points(seed):
    # Generated intervals (nested, touching, empty, reversed) on a grid of 60 points: what
    # subtract_intervals returns covers exactly the points covered by the first set and not
    # by the cuts, as disjoint, non-touching stretches in time order.
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(0, 7)), int(rng.integers(0, 9))
    starts, cut_starts = rng.integers(0, 55, n), rng.integers(0, 55, k)
    ends = np.clip(starts + rng.integers(-2, 8, n), 0, 60)
    cut_ends = np.clip(cut_starts + rng.integers(-2, 8, k), 0, 60)
    lo, hi = subtract_intervals(starts, ends, cut_starts, cut_ends)
    assert (hi > lo).all() and (lo[1:] > hi[:-1]).all()
    expected = _covered(starts, ends, 60) & ~_covered(cut_starts, cut_ends, 60)
    assert _covered(lo, hi, 60).tolist() == expected.tolist()
