"""StepGraph.balanced_durations and slices.equalised_durations, computed for all groups at
once, equal the group-by-group definitions they replaced (written out here as the
reference) on real captures and on GENERATED graphs (a unit-test fixture: random
durations, even and odd stage counts, ties)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLES
from tracekit import load
from tracekit.analyze.replay import step_graphs
from tracekit.analyze.schedules import graph_from_orders, interleaved_1f1b, one_f_one_b
from tracekit.analyze.slices import equalised_durations


def _balanced_reference(graph, by_microbatch: bool) -> np.ndarray:
    out = np.zeros(len(graph.dur), dtype=np.int64)
    groups = (
        [(k, m) for k, m in sorted(set(zip(graph.kind.astype(str).tolist(), graph.microbatch.tolist())))]
        if by_microbatch
        else [(k, None) for k in np.unique(graph.kind)]
    )
    for kind, mb in groups:
        of_kind = (graph.kind == kind) if mb is None else (graph.kind == kind) & (graph.microbatch == mb)
        stages, inverse = np.unique(graph.stage[of_kind], return_inverse=True)
        means = np.bincount(inverse, weights=graph.dur[of_kind]) / np.bincount(inverse)
        out[of_kind] = int(round(float(np.median(means))))
    return out


def _equalised_reference(graph, dur) -> np.ndarray:
    means = pd.Series(dur).groupby(graph.kind.astype(str)).transform("mean")
    return np.round(means.to_numpy()).astype(np.int64)


def _graphs():
    for name in ("1f1b_slow_stage2", "zbv", "terapipe", "interleaved1f1b"):
        yield from step_graphs(load(SAMPLES / name)).values()
    rng = np.random.default_rng(3)
    for trial in range(60):
        orders = [one_f_one_b(3, 5), interleaved_1f1b(4, 2, 8), one_f_one_b(2, 3), one_f_one_b(5, 4)][trial % 4]
        graph = graph_from_orders(orders, {"F": 10, "B": 20}, latency_ns=3)
        graph.dur = rng.integers(0, 7, len(graph.dur)) * int(rng.choice([1, 3, 1_000_003]))  # ties, odd halves
        yield graph


@pytest.mark.parametrize("by_microbatch", [False, True])
def test_balanced_durations_equal_the_group_by_group_definition(by_microbatch):
    for graph in _graphs():
        got = graph.balanced_durations(by_microbatch=by_microbatch)
        assert got.dtype == np.int64
        assert np.array_equal(got, _balanced_reference(graph, by_microbatch))


def test_equalised_durations_equal_the_group_by_group_definition():
    for graph in _graphs():
        dur = graph.balanced_durations(by_microbatch=True)
        assert np.array_equal(equalised_durations(graph, dur), _equalised_reference(graph, dur))
        assert np.array_equal(equalised_durations(graph, graph.dur), _equalised_reference(graph, graph.dur))
