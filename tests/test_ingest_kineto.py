"""Reading PyTorch profiler traces: real GPU traces, rank discovery, broken input."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from conftest import SAMPLES, shared_or_skip
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.errors import RunLayoutError, TraceFormatError
from tracekit.ingest import read_run


def _gpu_traces() -> list[Path]:
    folder = shared_or_skip("kineto-gpu")
    return sorted(folder.glob("*.json.gz"))


def test_every_shared_gpu_trace_loads_and_says_it_is_not_a_pipeline():
    for path in _gpu_traces():
        run = load(path)
        assert not run.is_pipeline, path.name
        assert any("not a pipeline run" in w for w in run.warnings), path.name
        analysis = analyze(run)
        assert len(analysis.bubbles) >= 1, path.name
        assert (analysis.bubbles["busy_ns"] <= analysis.bubbles["window_ns"]).all()
        assert (analysis.bubbles["busy_ns"] > 0).any(), f"{path.name}: no busy time found"


def test_gpu_trace_keeps_kernels_and_nccl_comm_ops():
    path = shared_or_skip("kineto-gpu", "hta_nccl_parser_config_nccl_data.json.gz")
    run = read_run(path)
    events = run.events
    assert (events["cat"] == "kernel").sum() == 2700  # every kernel in the file
    comm = events[events["name"].str.startswith("record_param_comms:")]
    assert len(comm) > 0
    assert run.files[0].rank == 0 and run.files[0].world_size == 2
    assert run.files[0].clock == "unix"


def test_old_trace_without_base_time_is_read_as_epoch_microseconds():
    path = shared_or_skip("kineto-gpu", "hta_trace_filter_sampled_rank-1.json.gz")
    run = read_run(path)
    assert run.files[0].clock == "unix"
    # 2023-04-29 in epoch ns
    assert 1.6e18 < run.events["start_ns"].min() < 1.8e18


def test_lone_file_without_rank_is_rank_zero_with_a_warning():
    path = shared_or_skip("kineto-gpu", "hta_distributed_info_unavailable_distributed_info_not_found.json.gz")
    run = read_run(path)
    assert run.files[0].rank == 0
    assert any("read as rank 0" in w for w in run.warnings)


def _copy_sample(tmp_path: Path, name: str = "1f1b") -> Path:
    dst = tmp_path / name
    shutil.copytree(SAMPLES / name, dst)
    return dst


def test_truncated_trace_yields_what_it_holds_with_a_warning(tmp_path):
    run_dir = _copy_sample(tmp_path)
    victim = run_dir / "rank2.json.gz"
    raw = gzip.decompress(victim.read_bytes())
    victim.write_bytes(gzip.compress(raw[: int(len(raw) * 0.6)]))
    run = load(run_dir)
    assert run.files[2].truncated
    assert any("ends early" in w for w in run.warnings)
    assert (run.events["rank"] == 2).sum() > 1000


def test_gzip_cut_mid_stream_is_salvaged(tmp_path):
    run_dir = _copy_sample(tmp_path)
    victim = run_dir / "rank1.json.gz"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    run = load(run_dir)
    assert run.files[1].truncated
    assert (run.events["rank"] == 1).sum() > 100


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"this is not json at all", "traceEvents"),
        (b'{"hello": 1}', "not a Chrome trace"),
    ],
)
def test_bad_files_raise_one_line_errors(tmp_path, content, message):
    bad = tmp_path / "rank0.json"
    bad.write_bytes(content)
    with pytest.raises(TraceFormatError) as err:
        load(bad)
    text = str(err.value)
    assert message in text and "\n" not in text and str(bad) in text


def test_duplicate_ranks_are_refused(tmp_path):
    run_dir = _copy_sample(tmp_path)
    shutil.copy(run_dir / "rank0.json.gz", run_dir / "rank0_again.json.gz")
    with pytest.raises(RunLayoutError, match="rank 0 appears in both"):
        load(run_dir)


def test_missing_ranks_are_reported(tmp_path):
    run_dir = _copy_sample(tmp_path)
    (run_dir / "rank3.json.gz").unlink()
    run = load(run_dir)
    assert run.warnings[0].startswith("INCOMPLETE RUN: rank 3 of 4 has no trace")


def test_rank_from_regex_overrides(tmp_path):
    run_dir = _copy_sample(tmp_path)
    for f in run_dir.glob("rank*.json.gz"):
        f.rename(run_dir / f.name.replace("rank", "worker-"))
    run = load(run_dir, LoadOptions(rank_from=r"worker-(\d+)"))
    assert sorted(t.rank for t in run.files) == [0, 1, 2, 3]
    assert {t.rank_source for t in run.files} == {"--rank-from"}


def test_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(RunLayoutError, match="no trace files found"):
        load(tmp_path)


def test_inputs_are_never_modified():
    run_dir = SAMPLES / "1f1b"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir())}
    load(run_dir)
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir())}
    assert before == after
