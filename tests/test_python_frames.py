"""Python frames (torch.profiler ``with_stack``), issue #29: ingest keeps Megatron's
``forward_step`` / ``backward_step`` frames and the ``nn.Module`` frames (issue #32: the
model's layer names) and nothing else of them, every other row as it was without frames; the ``megatron-torch`` table reads them into actions whose stage and
microbatch come out as the run executed them, on GENERATED frames
(``tests/generated_python_frames.py``) over a generated GPU pipeline and over the real
Megatron-core CPU samples (1F1B and interleaved)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLES, native_scanner
from generated_python_frames import BACKWARD_STEP, FORWARD_STEP, megatron_cpu, megatron_gpu
from gpu_tracegen import SCENARIOS
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.ingest import kineto_native
from tracekit.ingest.kineto import read_kineto
from tracekit.model.names import MODULE_FRAME
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.plain import plain_busy
from tracekit.reconstruct.steps import step_table
from tracekit.render.json import to_document

# name -> how its frames are made: over a generated GPU pipeline, or over a real CPU sample
RUNS = {
    "gpu_1f1b": lambda out: megatron_gpu(SCENARIOS["unlabelled_1f1b"], out),
    "gpu_interleaved": lambda out: megatron_gpu(SCENARIOS["unlabelled_interleaved"], out),
    "cpu_1f1b": lambda out: megatron_cpu(SAMPLES / "megatron_1f1b", out),
    "cpu_interleaved": lambda out: megatron_cpu(SAMPLES / "megatron_interleaved", out),
}


@pytest.fixture(scope="module")
def framed_run(tmp_path_factory):
    """Each generated run with frames, made once: (folder, truth)."""
    made: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in made:
            made[name] = RUNS[name](tmp_path_factory.mktemp(name))
        return made[name]

    return get


def _source(folder: Path, name: str, rank: int) -> Path:
    """The trace the frames were added to."""
    if name.startswith("gpu"):
        return folder.parent / "source" / folder.name.removesuffix("_with_stack") / f"rank{rank}.json.gz"
    return SAMPLES / folder.name.removeprefix("generated_").removesuffix("_with_stack") / f"rank{rank}.json.gz"


def _rows(path: Path, native: bool) -> tuple[list[tuple], list[tuple]]:
    """A file's rows but its frames, as (name, cat, start, end, pid, tid, depth, seq, peer,
    nbytes), sorted; and its frames as (name, depth, start, end, tid)."""
    with native_scanner(native):
        _, columns = read_kineto(path, 0)
    n = columns.numbers
    cats = np.array(columns.values["cat"])[columns.codes["cat"]]
    names = np.array(columns.values["name"], dtype=object)[columns.codes["name"]]
    frame = cats == "python_function"
    keys = ("start_ns", "end_ns", "pid", "tid", "depth", "seq", "peer", "nbytes")
    others = sorted(zip(names[~frame], cats[~frame], *(n[k][~frame].tolist() for k in keys)))
    frames = list(zip(names[frame], *(n[k][frame].tolist() for k in ("depth", "start_ns", "end_ns", "tid"))))
    return others, frames


@pytest.mark.parametrize("native", [True, False], ids=["scanner", "python"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_ingest_keeps_the_action_and_module_frames_only_and_every_other_row_as_it_was(framed_run, name, native):
    """Of the frames, Megatron's forward_step / backward_step (labels) and the nn.Module calls
    (layer names, tracekit.analyze.layers) are kept; none pushes an op deeper."""
    if native and not kineto_native.available():
        pytest.skip("the native scanner is not built (no C compiler at install)")
    folder, truth = framed_run(name)
    for rank in range(truth["p"]):
        others, frames = _rows(folder / f"rank{rank}.json.gz", native)
        before, none = _rows(_source(folder, name, rank), native)
        assert others == before and not none, rank  # depth too: frames push no op deeper
        kinds = [kind for step in truth["order"][str(rank)].values() for kind, _, _ in step]
        modules = [f[0] for f in frames if f[0].startswith("nn.Module: ")]
        actions = [f[0] for f in frames if not f[0].startswith("nn.Module: ")]
        assert sorted(actions) == sorted(FORWARD_STEP if k == "F" else BACKWARD_STEP for k in kinds)
        assert modules and all(MODULE_FRAME.match(m) for m in modules)


@pytest.mark.parametrize("name", ["gpu_interleaved", "cpu_1f1b"])
def test_a_frame_is_as_deep_as_the_ops_it_holds(framed_run, name):
    """A forward's frame holds its ops on its thread (a backward's, on a GPU, none: the engine
    runs them on its own thread), right under the step mark, at depth 1 as the frame."""
    folder, _ = framed_run(name)
    others, frames = _rows(folder / "rank1.json.gz", native=False)
    for frame_name, depth, start, end, tid in frames:
        held = [row for row in others if row[5] == tid and start <= row[2] and row[3] <= end]
        if frame_name.startswith("nn.Module: "):  # no rule reads a module frame's depth, only its span
            continue
        assert depth == 1 and (held or frame_name == BACKWARD_STEP)
        assert min((row[6] for row in held), default=1) == depth


def _by_step(run) -> dict[str, dict[str, list[list]]]:
    acts = run.actions.sort_values(["rank", "step", "order"])
    out: dict[str, dict[str, list[list]]] = {}
    for (rank, step), group in acts.groupby(["rank", "step"]):
        out.setdefault(str(rank), {})[str(step)] = [
            [k, int(s), int(m)] for k, s, m in zip(group["kind"], group["stage"], group["microbatch"])
        ]
    return out


@pytest.mark.parametrize("rows", ["all", "reduce"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_megatron_frames_name_every_action_with_its_stage_and_microbatch(framed_run, name, rows):
    folder, truth = framed_run(name)
    run = load(folder, LoadOptions(rows=rows))
    schedule = "Interleaved1F1B" if truth["v"] > 1 else "1F1B"
    assert (run.schedule.name, run.schedule.p, run.schedule.v, run.schedule.m) == (
        schedule,
        truth["p"],
        truth["v"],
        truth["m"],
    )
    assert (run.labels, run.actions_from) == ("megatron-torch", "labels")
    assert _by_step(run) == truth["order"]
    doc = to_document(analyze(run))
    assert doc["labels"]["table"] == "megatron-torch" and doc["labels"]["actions_from"] == "labels"
    assert not [w for w in run.warnings if "do not add up" in w or "no partner" in w], run.warnings


@pytest.mark.parametrize("name", ["gpu_interleaved", "cpu_interleaved"])
def test_the_working_set_analyses_a_framed_run_as_all_rows_do(framed_run, name):
    folder, _ = framed_run(name)
    docs = []
    for rows in ("all", "analysis", "reduce"):
        doc = to_document(analyze(load(folder, LoadOptions(jobs=1, rows=rows))))
        doc.pop("generated_at", None)
        docs.append(json.dumps(doc, sort_keys=True))
    assert docs[0] == docs[1] == docs[2]


def test_host_busy_without_a_pipeline_counts_no_frame_as_work(framed_run):
    """What a run without a pipeline measures on the host (the union of its CPU ops and
    annotations in each step) is the same with frames: a frame spans the Python time between
    its ops, and it is no op."""
    folder, _ = framed_run("cpu_1f1b")
    busy = []
    for path in (folder / "rank1.json.gz", _source(folder, "cpu_1f1b", 1)):
        events = EventArrays.of(read_kineto(path, 0)[1])
        busy.append(plain_busy(events, step_table(events)))
    assert busy[0] == busy[1] and all(row[5] < row[4] for row in busy[0])
