"""The map step's reduce on ranks with device work (``rows="reduce"``, the command line's
default): each rank sends its steps and actions (found on its host rows), its device rows,
the CUDA API calls that launched them and its message rows; the client builds the device
timeline from those and holds no other host op. The analysis must be the one the working
sets give.

Inputs: the real two-rank GPU capture in ``shared/real-traces/kineto-gpu`` (HTA's
``trace_filter_sampled`` ranks 0 and 1, read in place through links in a tmp folder), and
GENERATED GPU pipelines (tests/gpu_tracegen.py: not real traces) for the device pipeline
path, which no real multi-rank capture here has."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import shared_or_skip
from gpu_tracegen import SCENARIOS, generate
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.ingest import _parse_file
from tracekit.ingest.working_set import working_set
from tracekit.loading import reduce_file
from tracekit.reconstruct.per_rank import gather
from tracekit.render.json import to_document

SAMPLED = [f"hta_trace_filter_sampled_rank-{r}.json.gz" for r in (0, 1)]


def _document(run) -> dict:
    doc = to_document(analyze(run))
    doc.pop("generated_at", None)
    return doc


@pytest.fixture(scope="module")
def sampled(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sampled")
    for name in SAMPLED:
        (folder / name).symlink_to(shared_or_skip("kineto-gpu", name))  # read in place
    return folder


def test_a_real_gpu_run_reduced_gives_the_analysis_of_its_working_sets(sampled):
    kept = load(sampled, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(sampled, LoadOptions(jobs=1, rows="reduce"))
    assert kept.timeline == reduced.timeline == "device"
    assert _document(reduced) == _document(kept)
    pd.testing.assert_frame_equal(reduced.device, kept.device)
    pd.testing.assert_frame_equal(reduced.steps, kept.steps)
    # of the host, only message rows and the extents: no CPU op or annotation beyond those
    host = reduced.events[~reduced.events["on_gpu"] & (reduced.events["cat"] != "runtime")]
    assert len(host) <= 2 * len(reduced.ranks) + 64
    assert len(reduced.events) < 0.6 * len(kept.events)
    # every launch the device table reads is there: one per linked op
    assert int((reduced.events["cat"] == "runtime").sum()) == int((reduced.device["launch_ns"] >= 0).sum())


def test_device_ranks_reduce_in_pool_workers_and_through_the_cache(sampled, tmp_path):
    expected = _document(load(sampled, LoadOptions(jobs=1, rows="analysis")))
    cache = tmp_path / "cache"
    first = load(sampled, LoadOptions(jobs=2, rows="reduce", cache_dir=str(cache)))
    again = load(sampled, LoadOptions(jobs=2, rows="reduce", cache_dir=str(cache)))
    assert _document(first) == _document(again) == expected
    assert len(again.events) == len(first.events)
    # the report's loading (reduce_device=False) keeps the working sets: other cache entries
    n = len(list(cache.rglob("*.parquet")))
    drawn = load(sampled, LoadOptions(jobs=2, rows="reduce", cache_dir=str(cache), reduce_device=False))
    assert len(list(cache.rglob("*.parquet"))) == 2 * n
    assert len(drawn.events) == len(load(sampled, LoadOptions(jobs=1, rows="analysis")).events)


def _reduced(folder: Path, device: bool) -> list:
    out = []
    for file_id, path in enumerate(sorted(folder.glob("*.json.gz"))):
        parsed = [(t, working_set(c)) for t, c in _parse_file(path, file_id, None, None)]
        out.extend(trace.reduced for trace, _ in reduce_file(parsed, None, device=device))
    return out


def test_device_and_host_reductions_are_not_gathered_together(sampled):
    device = _reduced(sampled, device=True)
    assert all(part is not None and part["device"] for part in device)
    assert gather(device, None) is not None
    # without device=True a device rank sends its working set (None: nothing reduced)
    assert _reduced(sampled, device=False) == [None, None]
    # a rank reduced on the host beside one reduced on the device: not one run's tables
    host_like = {**device[1], "device": False}
    assert gather([device[0], host_like], None) is None


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_generated_gpu_pipelines_reduced_give_the_working_sets_analysis(name, tmp_path):
    folder, _ = generate(SCENARIOS[name], tmp_path)
    kept = load(folder, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(folder, LoadOptions(jobs=1, rows="reduce"))
    assert reduced.timeline == "device"
    assert _document(reduced) == _document(kept)
    pd.testing.assert_frame_equal(reduced.device.reset_index(drop=True), kept.device.reset_index(drop=True))
    assert len(reduced.events) < len(kept.events)


def test_the_report_draws_a_device_ranks_host_ops(sampled, tmp_path):
    """A run without a pipeline draws each rank's top-level CPU work beside its kernels: the
    report loads device ranks' working sets (reduce_device=False), which the reduce drops."""
    from click.testing import CliRunner

    from tracekit.cli import main
    from tracekit.render.html import views

    def bar_kinds(reduce_device: bool) -> set[str]:
        analysis = analyze(load(sampled, LoadOptions(jobs=1, rows="reduce", reduce_device=reduce_device)))
        drawn, _ = views.step_views(analysis)
        return {str(kind) for view in drawn for kind in view.bars["kind"]}

    assert bar_kinds(reduce_device=False) == {"kernel", "cpu"}
    assert bar_kinds(reduce_device=True) == {"kernel"}  # why the report does not reduce device ranks
    page = tmp_path / "gpu.html"
    result = CliRunner().invoke(main, ["report", str(sampled), "-o", str(page), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert page.read_text().count('"cpu"') > 100  # the CPU bars' kind, one per drawn bar
