"""``tracekit.trace_handler``: a live 2-rank pipelining run profiled through it, then analysed
with no options; the schedule the manifest declares checked against the traces; the handler's
refusals (never a trace written over, bad facts one clear error)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLES, capture_of

import tracekit
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.handler import placement_of, schedule_facts
from tracekit.reconstruct.declared import declared_mismatch


def _analyze_json(run_dir) -> dict:
    result = CliRunner().invoke(main, ["analyze", str(run_dir), "--json", "--no-progress"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


# --------------------------------------------------------------------------------------
# live: torch.distributed.pipelining, 2 ranks, gloo
# --------------------------------------------------------------------------------------
def test_live_run_through_the_handler_is_analysed_without_guessing(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tracekit[capture]')")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "handler_ranks.py"), str(out), "Interleaved1F1B", "2", "2", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # one profiling cycle: iteration_<step when the trace was ready>, torchtitan's layout
    traces = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert traces == ["capture.json", "iteration_4/rank0.json.gz", "iteration_4/rank1.json.gz"]
    manifest = json.loads((out / "capture.json").read_text())
    assert manifest["written_by"] == "tracekit.trace_handler"
    assert {k: manifest[k] for k in ("world_size", "schedule", "p", "v", "m", "stage_to_rank", "placement")} == {
        "world_size": 2,
        "schedule": "Interleaved1F1B",
        "p": 2,
        "v": 2,
        "m": 4,
        "stage_to_rank": [0, 1, 0, 1],
        "placement": "loop",
    }
    assert manifest["schedule_class"] == "torch.distributed.pipelining.ScheduleInterleaved1F1B"

    document = _analyze_json(out)
    schedule = document["schedule"]
    assert (schedule["name"], schedule["p"], schedule["v"], schedule["m"]) == ("Interleaved1F1B", 2, 2, 4)
    assert schedule["stage_to_rank"] == {"0": 0, "1": 1, "2": 0, "3": 1}
    assert document["warnings"] == []
    assert (
        document["completeness"]["world_size"] == 2
        and document["completeness"]["world_size_source"] == "distributedInfo"
    )
    assert document["capture"]["schedule"] == "Interleaved1F1B"


# --------------------------------------------------------------------------------------
# the declared schedule against the recognised one (sample runs, read in place)
# --------------------------------------------------------------------------------------
def test_every_sample_agrees_with_its_capture_json(loaded_runs):
    for run_dir in (SAMPLES / name for name in ("1f1b", "zbv", "pipedream_2bw", "terapipe", "megatron_interleaved")):
        run, _ = loaded_runs(run_dir)
        assert declared_mismatch(run.capture, run.schedule) is None, run_dir.name
        assert not [w for w in run.warnings if "declares" in w]


def test_a_declaration_the_traces_contradict_is_one_warning(loaded_runs):
    run, _ = loaded_runs(SAMPLES / "interleaved1f1b")
    capture = capture_of(SAMPLES / "interleaved1f1b")
    assert declared_mismatch({**capture, "schedule": "LoopedBFS", "m": 16}, run.schedule) == (
        "capture.json declares schedule LoopedBFS, m=16; the traces show schedule Interleaved1F1B, m=8: the "
        "analysis follows the traces; check that capture.json belongs to this run"
    )
    moved = declared_mismatch({**capture, "stage_to_rank": [0, 1, 2, 3, 3, 2, 1, 0]}, run.schedule)
    assert moved is not None and "stages on ranks [0, 1, 2, 3, 3, 2, 1, 0]" in moved
    # names tracekit cannot recognise (a schedule of one's own) are not compared
    assert declared_mismatch({**capture, "schedule": "_PipelineScheduleRuntime"}, run.schedule) is None


def test_analyze_warns_when_the_manifest_declares_another_schedule(tmp_path):
    """The traces are the 1f1b sample's (linked, read in place); the manifest is generated:
    it declares GPipe with 16 microbatches."""
    run = tmp_path / "run"
    run.mkdir()
    for trace in sorted((SAMPLES / "1f1b").glob("rank*.json.gz")):
        (run / trace.name).symlink_to(trace)
    (run / "capture.json").write_text(
        json.dumps(
            {"written_by": "tracekit.trace_handler", "world_size": 4, "schedule": "GPipe", "p": 4, "v": 1, "m": 16}
        )
    )
    document = _analyze_json(run)
    assert document["schedule"]["name"] == "1F1B"
    assert [w for w in document["warnings"] if "declares" in w] == [
        "capture.json declares schedule GPipe, m=16; the traces show schedule 1F1B, m=8: the analysis follows "
        "the traces; check that capture.json belongs to this run"
    ]


def test_world_size_counts_replicas(tmp_path):
    """A manifest's world_size (data-parallel replicas included) is the rank count, not p: three
    of the 1f1b sample's traces (world size 4) with a generated manifest of a p=2 pipeline in 2
    replicas: no "capture.json is from another run" warning."""
    run = tmp_path / "run"
    run.mkdir()
    for trace in sorted((SAMPLES / "1f1b").glob("rank*.json.gz"))[:3]:
        (run / trace.name).symlink_to(trace)
    (run / "capture.json").write_text(json.dumps({"world_size": 4, "p": 2}))
    document = _analyze_json(run)
    assert (document["completeness"]["world_size"], document["completeness"]["missing_ranks"]) == (4, [3])
    assert not [w for w in document["warnings"] if "capture.json says" in w], document["warnings"]


# --------------------------------------------------------------------------------------
# the handler itself (no torch needed)
# --------------------------------------------------------------------------------------
class _Profiler:
    """Stands in for torch.profiler.profile: what the handler calls on it."""

    def __init__(self, step_num: int, payload: bytes = b"\x1f\x8b trace"):
        self.step_num = step_num
        self.payload = payload

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(self.payload)


def test_each_cycle_gets_its_iteration_folder_and_rank0_the_manifest(tmp_path):
    on_trace_ready = tracekit.trace_handler(tmp_path / "run", {"schedule": "1F1B", "p": 2, "m": 4}, rank=0)
    on_trace_ready(_Profiler(5))
    on_trace_ready(_Profiler(10))
    files = sorted(p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").rglob("*"))
    assert files == [
        "capture.json",
        "iteration_10",
        "iteration_10/rank0.json.gz",
        "iteration_5",
        "iteration_5/rank0.json.gz",
    ]
    manifest = json.loads((tmp_path / "run" / "capture.json").read_text())
    assert (manifest["schedule"], manifest["p"], manifest["m"]) == ("1F1B", 2, 4)
    tracekit.trace_handler(tmp_path / "run", rank=1)(_Profiler(5))  # another rank: its own file, no manifest
    assert (tmp_path / "run" / "iteration_5" / "rank1.json.gz").read_bytes() == b"\x1f\x8b trace"


def test_an_earlier_runs_trace_is_refused_when_the_handler_is_made(tmp_path):
    (tmp_path / "iteration_5").mkdir()
    (tmp_path / "iteration_5" / "rank1.json.gz").write_bytes(b"earlier")
    with pytest.raises(TracekitError, match=r"rank1\.json\.gz is already there, from an earlier run"):
        tracekit.trace_handler(tmp_path, rank=1)
    tracekit.trace_handler(tmp_path, rank=2)  # other ranks are not in the way
    (tmp_path / "capture.json").write_text("{}")
    with pytest.raises(TracekitError, match="capture.json is already there"):
        tracekit.trace_handler(tmp_path, rank=0)


def test_a_trace_that_appears_meanwhile_is_not_written_over(tmp_path):
    on_trace_ready = tracekit.trace_handler(tmp_path, rank=3)
    (tmp_path / "iteration_7").mkdir()
    (tmp_path / "iteration_7" / "rank3.json.gz").write_bytes(b"the other process's")
    with pytest.raises(TracekitError, match="another process has the same rank"):
        on_trace_ready(_Profiler(7))
    assert (tmp_path / "iteration_7" / "rank3.json.gz").read_bytes() == b"the other process's"
    assert sorted(p.name for p in (tmp_path / "iteration_7").iterdir()) == ["rank3.json.gz"]  # no temp left


@pytest.mark.parametrize(
    "facts, words",
    [
        ({"schedule": "1F1B", "microbatches": 8}, "unknown key 'microbatches'"),
        ({"m": 0}, "m must be a positive integer"),
        ({"p": True}, "p must be a positive integer"),
        ({"placement": "zigzag"}, "placement must be 'loop' or 'v'"),
        ({"stage_to_rank": [0, -1]}, "stage_to_rank must be a list of ranks"),
        ({"stage_to_rank": {"0": 0, "2": 1}}, "the rank of every stage"),
    ],
)
def test_bad_facts_are_one_clear_error(tmp_path, facts, words):
    with pytest.raises(TracekitError, match=words):
        tracekit.trace_handler(tmp_path / "run", facts)
    assert not (tmp_path / "run").exists()


def test_facts_from_a_dict_fill_stage_count_and_placement():
    assert schedule_facts(
        {"schedule": "ZBVZeroBubble", "p": 2, "v": 2, "m": 4, "stage_to_rank": {"0": 0, "1": 1, "2": 1, "3": 0}}
    ) == {
        "schedule": "ZBVZeroBubble",
        "p": 2,
        "v": 2,
        "m": 4,
        "n_stages": 4,
        "placement": "v",
        "stage_to_rank": [0, 1, 1, 0],
    }
    assert placement_of([0, 1, 0, 1]) == "loop" and placement_of([0, 1, 2, 2, 1, 0]) == "v"
    with pytest.raises(TracekitError, match="is not a torch.distributed.pipelining schedule"):
        schedule_facts(object())


def test_import_tracekit_does_not_import_torch():
    code = "import sys, tracekit; tracekit.trace_handler; import tracekit.handler; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
