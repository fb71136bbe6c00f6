"""The working set (the rows the command line keeps of each file) gives exactly the analysis
that all rows give, on every sample run and every shared real trace; and it is small. So do
the per-rank steps and actions the map step sends back with ``rows="reduce"``."""

from __future__ import annotations

import pytest

from conftest import SAMPLES, SHARED_TRACES
from tracekit.analyze import analyze
from tracekit import LoadOptions, load
from tracekit.render.json import to_document

# every sample folder, and those grouped one level down (sample_traces/validation/<name>)
SAMPLE_RUNS = sorted(
    str(run.relative_to(SAMPLES))
    for folder in SAMPLES.iterdir()
    if folder.is_dir()
    for run in ([folder] if (folder / "capture.json").is_file() else sorted(folder.iterdir()))
    if run.is_dir()
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
