"""The map step's reduce on ranks with device work (``rows="reduce"``, the command line's
default): each rank sends its steps and actions (found on its host rows, with their device
spans), its device timeline reduced (tracekit.reconstruct.device_rank: steps folded, P2P calls
tied to their kernels), the host-side busy rows of a run without a pipeline and its message
rows; the client holds no row per device op, kernel, launch or other host op. The analysis
and the device summary must be the ones the working sets give (where the client reduces the
device table rank by rank with the same code).

Inputs: the real two-rank GPU capture in ``shared/real-traces/kineto-gpu`` (HTA's
``trace_filter_sampled`` ranks 0 and 1, read in place through links in a tmp folder), and
GENERATED GPU pipelines (tests/gpu_tracegen.py: not real traces) for the device pipeline
path, which no real multi-rank capture here has. Host ranks of a run without a pipeline are
reduced to their busy rows too: a GENERATED folder of the real V100 trace's first 3 MB (its CPU
ops: the file lists them before its kernels) written once per rank by benchmarks/make_input.py.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, shared_or_skip
from gpu_tracegen import SCENARIOS, generate
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.ingest.file_task import parse_file
from tracekit.ingest.working_set import working_set
from tracekit.loading import reduce_file
from tracekit.reconstruct.per_rank import gather
from tracekit.render.json import to_document

SAMPLED = [f"hta_trace_filter_sampled_rank-{r}.json.gz" for r in (0, 1)]


def _document(run) -> dict:
    doc = to_document(analyze(run))
    doc.pop("generated_at", None)
    return doc


def _assert_same_summary(reduced, kept) -> None:
    """The device summaries of two loads are equal, table by table, and only the working
    sets' load holds device-op rows."""
    a, b = reduced.device_summary, kept.device_summary
    for name in a.tables:
        for column, values in a.tables[name].items():
            assert values.tolist() == b.tables[name][column].tolist(), (name, column)
    assert a.host_ahead_ns == b.host_ahead_ns and a.n_ops == b.n_ops
    assert reduced.device.empty and len(kept.device) == sum(b.n_ops.values()) > 0


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
    _assert_same_summary(reduced, kept)
    pd.testing.assert_frame_equal(reduced.steps, kept.steps)
    # of the events, only message rows and each rank's extent: no kernel row, no launch (the
    # device table came as columns), no other CPU op; the host-side view came as rows
    assert not reduced.events["on_gpu"].any() and not (reduced.events["cat"] == "runtime").any()
    assert len(reduced.events) <= 2 * len(reduced.ranks) + 64
    assert reduced.host_busy is not None and kept.host_busy is None
    assert int((kept.device["launch_ns"] >= 0).sum()) > 0 and len(reduced.device_summary["gaps"]["rank"]) > 0


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
    for file_id, path in enumerate(sorted(p for p in folder.iterdir() if ".json" in p.name)):
        parsed = [(t, working_set(c)) for t, c in parse_file(path, file_id, None, None)]
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
    # one rank in two files: what each file holds of it is not the rank (its steps, its ops)
    assert gather([device[0], device[0]], None) is None


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_generated_gpu_pipelines_reduced_give_the_working_sets_analysis(name, tmp_path):
    folder, _ = generate(SCENARIOS[name], tmp_path)
    kept = load(folder, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(folder, LoadOptions(jobs=1, rows="reduce"))
    assert reduced.timeline == "device"
    assert _document(reduced) == _document(kept)
    _assert_same_summary(reduced, kept)
    pd.testing.assert_frame_equal(
        reduced.actions.reset_index(drop=True), kept.actions.reset_index(drop=True), check_dtype=False
    )
    assert len(reduced.events) < len(kept.events)


def test_the_report_draws_a_device_ranks_host_ops(sampled, tmp_path):
    """A run without a pipeline draws each rank's top-level CPU work beside its kernels: the
    report loads device ranks' working sets, which the reduce (reduce_device=True) drops."""
    from click.testing import CliRunner

    from tracekit.cli import main
    from tracekit.render.html import charts, views

    def bar_kinds(reduce_device: bool) -> set[str]:
        analysis = analyze(load(sampled, LoadOptions(jobs=1, rows="reduce", reduce_device=reduce_device)))
        drawn, _ = views.step_views(analysis)
        return {str(kind) for view in drawn for kind in view.bars["kind"]}

    assert bar_kinds(reduce_device=False) == {"kernel", "cpu"}
    assert "cpu" not in bar_kinds(reduce_device=True)  # why the report does not reduce device ranks
    page = tmp_path / "gpu.html"
    result = CliRunner().invoke(main, ["report", str(sampled), "-o", str(page), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f'"value":"{charts.KIND_NAMES["cpu"]}"' in page.read_text()  # the CPU bars' legend entry: they are drawn


def test_host_ranks_without_a_pipeline_reduce_to_their_busy_rows(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import make_input

    source = shared_or_skip("kineto-gpu", make_input.GPU_TRACE.name)
    folder = tmp_path / "generated_host_plain"
    make_input.build_gpu(folder, ranks=3, target_mb=3, source=source)
    kept = load(folder, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(folder, LoadOptions(jobs=2, rows="reduce"))
    assert kept.timeline == reduced.timeline == "host" and reduced.actions.empty
    assert _document(reduced) == _document(kept)
    assert reduced.host_busy is not None and len(reduced.host_busy) == len(reduced.steps)
    assert len(reduced.events) < len(kept.events)
    # the report draws their host ops: it reads the working sets
    drawn = load(folder, LoadOptions(jobs=1, rows="reduce", reduce_device=False))
    assert drawn.host_busy is None and len(drawn.events) == len(kept.events)
    # a host rank without a pipeline beside one with a pipeline: not one run's tables
    plain = _reduced(folder, device=True)
    assert all("host_busy" in part for part in plain)
    piped = _reduced_pipeline_rank()
    assert gather([plain[0], piped], None) is None


def _reduced_pipeline_rank() -> dict:
    from conftest import SAMPLES

    path = SAMPLES / "interleaved1f1b" / "rank1.json.gz"
    parsed = [(t, working_set(c)) for t, c in parse_file(path, 5, None, None)]
    ((trace, _),) = reduce_file(parsed, None)
    assert trace.reduced is not None and "host_busy" not in trace.reduced
    return trace.reduced


def _uuids_out(html: str) -> str:
    """The report with bokeh's element ids made comparable: random ones blanked, model ids
    (a counter that runs on through a process) numbered by first appearance."""
    import re

    html = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", html)
    seen: dict[str, str] = {}
    return re.sub(r"\bp\d+\b", lambda m: seen.setdefault(m.group(0), f"id{len(seen)}"), html)


# In a report's page: the legend entry of the GPU work's bars, there where kernels are drawn.
GPU_BARS = '"value":"GPU work"'


def _report(folder: Path, out: Path, one_pass_files: int, monkeypatch) -> str:
    from click.testing import CliRunner

    import tracekit.commands.common as common
    from tracekit.cli import main

    monkeypatch.setattr(common, "ONE_PASS_FILES", one_pass_files)
    result = CliRunner().invoke(main, ["report", str(folder), "-o", str(out), "--no-progress", "--no-cache"])
    assert result.exit_code == 0, result.output
    return _uuids_out(out.read_text())


@pytest.mark.parametrize("name", ["clock_offset", "fused_1f1b", "sampled", "host_plain"])
def test_a_large_runs_report_keeps_the_drawn_ops_and_draws_the_same(name, sampled, tmp_path, monkeypatch):
    """Past ONE_PASS_FILES files, report analyses the reduce, each rank keeping the ops the
    page draws (LoadOptions.draw_ops): the page is the one the working sets give (clocks
    aligned as the rest: generated_clock_offset moves two ranks' clocks; host ranks without
    a pipeline draw their host ops)."""
    if name == "sampled":
        folder = sampled
    elif name == "host_plain":
        import sys

        sys.path.insert(0, str(ROOT / "benchmarks"))
        import make_input

        folder = tmp_path / "generated_host_plain"
        make_input.build_gpu(
            folder, ranks=3, target_mb=3, source=shared_or_skip("kineto-gpu", make_input.GPU_TRACE.name)
        )
    else:
        folder = generate(SCENARIOS[name], tmp_path)[0]
    once = _report(folder, tmp_path / "once.html", 10**6, monkeypatch)
    reduced = _report(folder, tmp_path / "reduced.html", 0, monkeypatch)
    assert reduced == once
    from tracekit.render.html import charts

    drawn = f'"value":"{charts.KIND_NAMES["cpu"]}"' if name == "host_plain" else GPU_BARS
    assert drawn in reduced


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    """A GENERATED GPU pipeline of 8 replicas (benchmarks/make_input.py: tests/gpu_tracegen.py's
    run repeated): the timeline keeps up to 6 replicas."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import make_input

    folder = tmp_path_factory.mktemp("replicated") / "generated_gpu_pp32"
    make_input.build_generated_gpu_pipeline(folder, ranks=32, kernels=2, steps=2)
    return folder


def test_a_large_runs_report_reads_each_file_once(replicated, tmp_path, monkeypatch):
    """The drawn ops are asked for before loading: each file is parsed once (the report read
    the drawn replicas' files again after the analysis), and the page is the one-pass page."""
    import tracekit.ingest.read as read

    parsed: list[Path] = []
    real_parse_files = read.parse_files

    def counted(paths, *args, **kwargs):
        parsed.extend(paths)
        return real_parse_files(paths, *args, **kwargs)

    monkeypatch.setattr(read, "parse_files", counted)
    page = _report(replicated, tmp_path / "r.html", 0, monkeypatch)
    assert len(parsed) == 32 and len(set(parsed)) == 32
    monkeypatch.setattr(read, "parse_files", real_parse_files)
    assert page == _report(replicated, tmp_path / "once.html", 10**6, monkeypatch)


def test_keeping_the_drawn_ops_changes_no_figure(replicated):
    """The rows a reduced rank keeps for the drawing (its kernels) are in run.events beside
    the rows the analysis reads: the analysis is the one without them."""
    with_ops = load(replicated, LoadOptions(jobs=1, rows="reduce", draw_ops=True))
    without = load(replicated, LoadOptions(jobs=1, rows="reduce"))
    assert len(with_ops.events) > len(without.events)  # the kernels are kept
    assert _document(with_ops) == _document(without)


def test_analyze_html_draws_what_report_draws(tmp_path, monkeypatch):
    """``analyze --html`` loads as ``report`` does: a GPU run's page draws its kernels (it
    drew none when the analysis' reduce left the run without them), small run or large."""
    from click.testing import CliRunner

    import tracekit.commands.common as common
    from tracekit.cli import main

    folder, _ = generate(SCENARIOS["slow_stage"], tmp_path)
    for one_pass_files in (10**6, 0):
        monkeypatch.setattr(common, "ONE_PASS_FILES", one_pass_files)
        page = tmp_path / f"analyze{one_pass_files}.html"
        result = CliRunner().invoke(main, ["analyze", str(folder), "--html", str(page), "--no-progress", "--no-cache"])
        assert result.exit_code == 0, result.output
        drawn = _uuids_out(page.read_text())
        assert GPU_BARS in drawn
        assert drawn == _report(folder, tmp_path / "report.html", one_pass_files, monkeypatch)
