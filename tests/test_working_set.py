"""The working set (the rows the command line keeps of each file) gives exactly the analysis
that all rows give, on every sample run and every shared real trace; and it is small. So do
the per-rank steps and actions the map step sends back with ``rows="reduce"``."""

from __future__ import annotations

import pytest

from conftest import SAMPLES, SHARED_TRACES
from tracekit.analyze import analyze
from tracekit import LoadOptions, load
from tracekit.render.json import to_document

# every sample folder, and those grouped one level down (sample_traces/validation/<name>);
# not validation/quiet/<name>: the same commands as the folders above, captured again on an
# idle machine for the what-if table (test_reconstruct reads each of them)
SAMPLE_RUNS = sorted(
    str(run.relative_to(SAMPLES))
    for folder in SAMPLES.iterdir()
    if folder.is_dir()
    for run in ([folder] if (folder / "capture.json").is_file() else sorted(folder.iterdir()))
    if run.is_dir() and (run / "capture.json").is_file()
)


def _document(path, rows: str) -> tuple[dict, int]:
    run = load(path, LoadOptions(jobs=1, rows=rows))
    doc = to_document(analyze(run))
    doc.pop("generated_at", None)
    return doc, len(run.events)


def _same_analysis(path) -> tuple[int, int]:
    full, n_all = _document(path, "all")
    kept, n_kept = _document(path, "analysis")
    assert kept == full
    reduced, _ = _document(path, "reduce")
    assert reduced == full
    return n_all, n_kept


@pytest.mark.parametrize("name", SAMPLE_RUNS)
def test_sample_runs_analyse_the_same_from_the_working_set(name):
    n_all, n_kept = _same_analysis(SAMPLES / name)
    # and it is a real reduction, less so where ranges label every layer (the ops inside each
    # label are its compute, so nearly everything is read) or wrap the ops (Megatron's phase
    # and P2P ranges under nsys put the ops one level deeper)
    limit = {"1f1b_layer_labels": 0.95, "megatron_interleaved_nsys": 0.8}.get(name, 0.7)
    assert n_kept < limit * n_all


def _shared_gpu_traces():
    folder = SHARED_TRACES / "kineto-gpu"
    return sorted(folder.glob("*.json*")) if folder.is_dir() else []


@pytest.mark.skipif(not _shared_gpu_traces(), reason=f"{SHARED_TRACES / 'kineto-gpu'} is absent")
@pytest.mark.parametrize("path", _shared_gpu_traces(), ids=lambda p: p.name[:40])
def test_shared_gpu_traces_analyse_the_same_from_the_working_set(path):
    _same_analysis(path)


def test_shared_nsys_reports_analyse_the_same_from_the_working_set():
    folder = SHARED_TRACES / "nsys"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent: the shared real traces are not laid beside this checkout")
    for path in sorted(folder.glob("*.sqlite")):
        _same_analysis(path)


def test_thread_limits_by_comparison_equal_the_sorts():
    """The few-threads way of finding each row's deepest annotation equals the sorts of
    every row, on GENERATED ids (a unit-test fixture, not a trace): threads with and without
    annotations, negative and huge ids, a pid shared by several tids, more threads than the
    comparison takes (which then take the sorts)."""
    import numpy as np

    from tracekit.ingest import working_set as ws

    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        n_threads = int(rng.integers(1, 2 * ws._FEW_THREADS + 3))
        ids = rng.choice([-(2**62), -7, 0, 1, 3, 2**40, 2**62], size=(n_threads, 2))
        thread = rng.integers(0, n_threads, n)
        pid, tid = ids[thread, 0].astype(np.int64), ids[thread, 1].astype(np.int64)
        depth = rng.integers(0, 6, n).astype(np.int64)
        anchor = rng.random(n) < (0.0 if trial % 7 == 0 else 0.2)
        got = ws._thread_limits(pid, tid, anchor, depth)
        want = ws._thread_limits_sorted(pid, tid, anchor, depth) if anchor.any() else np.zeros(n, np.int64)
        assert np.array_equal(got, want), trial


def test_each_rank_keeps_its_first_and_last_row():
    """A file holding two ranks (an Nsight report does) keeps each rank's earliest-starting
    and latest-ending row even where nothing else would keep them (deep CPU ops); GENERATED
    columns, a unit-test fixture."""
    import numpy as np

    from tracekit.ingest.columns import EventColumns
    from tracekit.ingest.working_set import _kept

    # rank 0: rows 0-2, rank 1: rows 3-5; the middle row of each is a top-level op
    start = np.array([0, 5, 8, 100, 105, 110], dtype=np.int64)
    end = np.array([3, 9, 20, 104, 109, 150], dtype=np.int64)
    numbers = {
        "rank": np.array([0, 0, 0, 1, 1, 1], dtype=np.int32),
        "start_ns": start,
        "end_ns": end,
        "pid": np.ones(6, dtype=np.int64),
        "tid": np.ones(6, dtype=np.int64),
        "on_gpu": np.zeros(6, dtype=bool),
        "depth": np.array([3, 0, 4, 5, 0, 2], dtype=np.int16),
        "seq": np.full(6, -1, dtype=np.int64),
        "correlation": np.full(6, -1, dtype=np.int64),
    }
    columns = EventColumns(
        numbers,
        {"cat": np.zeros(6, np.int32), "name": np.zeros(6, np.int32)},
        {"cat": ["cpu_op"], "name": ["aten::mul"]},
    )
    assert _kept(columns).tolist() == [True, True, True, True, True, True]
    numbers["rank"] = np.zeros(6, dtype=np.int32)  # one rank: only its own first and last
    assert _kept(columns).tolist() == [True, True, False, False, True, True]
