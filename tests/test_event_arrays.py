"""Steps and actions from plain columns (tracekit.reconstruct.event_arrays): a parser worker
finds them on a parsed file's columns (names in the order the parser met them, no pandas),
the whole-run path on the events table's (categorical codes, names sorted); the two must
give the same tables, however the names are coded."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import SAMPLES, shared_or_skip
from tracekit.ingest.file_task import parse_file
from tracekit.ingest.columns import EventColumns, events_frame
from tracekit.ingest.working_set import working_set
from tracekit.model.run import ACTION_COLUMNS, FIXED_COLUMN, STEP_COLUMNS
from tracekit.reconstruct.actions import action_table, annotation_counts, find_actions
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.steps import find_steps, step_table

# both paths of the finders: segmentation (native, DeepSpeed, Megatron under nsys) and labels
# (torch-pp, GPipe, the fused OVERLAP_F_B of DualPipeV, hand-labelled layers)
RUNS = ["1f1b", "deepspeed_1f1b", "megatron_interleaved_nsys", "interleaved1f1b", "gpipe", "dualpipev"]
RUNS += ["1f1b_layer_labels", "zbv"]


def _files(name: str) -> list[EventColumns]:
    paths = sorted(p for p in (SAMPLES / name).iterdir() if p.name.startswith("rank") or p.suffix == ".sqlite")
    return [working_set(c) for file_id, path in enumerate(paths) for _, c in parse_file(path, file_id, None, None)]


def generated_recoded(columns: EventColumns) -> EventColumns:
    """Generated: the same rows with the names coded the other way round and a name no row
    has, as another parser could have coded them."""
    values = list(reversed(columns.values["name"])) + ["never-seen"]
    position = {v: i for i, v in enumerate(values)}
    remap = np.array([position[v] for v in columns.values["name"]], dtype=np.int32)
    codes = {**columns.codes, "name": remap[columns.codes["name"]]}
    return EventColumns(columns.numbers, codes, {**columns.values, "name": values})


def _as_frame(table: dict, columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(table, columns=columns)


@pytest.mark.parametrize("name", RUNS)
def test_a_parsed_file_and_the_events_table_give_the_same_steps_and_actions(name):
    for columns in _files(name):
        frame = events_frame([columns.copy()])
        steps = find_steps(frame)
        actions, choice, _ = find_actions(frame, steps)
        assert len(actions), name
        for coded in (columns, generated_recoded(columns)):
            arrays = EventArrays.of(coded)
            plain_steps = step_table(arrays)
            pd.testing.assert_frame_equal(_as_frame(plain_steps, STEP_COLUMNS[:4]), steps[STEP_COLUMNS[:4]])
            table, plain_choice, _ = action_table(arrays, plain_steps)
            pd.testing.assert_frame_equal(_as_frame(table, [*ACTION_COLUMNS, FIXED_COLUMN]), actions)
            assert plain_choice.name == choice.name
            counts = annotation_counts(arrays)
            assert counts == annotation_counts(frame) and list(counts) == sorted(counts)


def generated_steps() -> EventColumns:
    """Generated: rank 0 marks step 2 twice (two threads) and once without a number; rank 1
    has no step mark."""
    names = ["ProfilerStep#x", "aten::mm", "ProfilerStep#2"]
    rows = [  # rank, cat, name, start, end, tid
        (0, 0, 2, 500, 900, 2),
        (0, 0, 0, 0, 50, 1),
        (0, 1, 1, 10, 20, 1),
        (0, 0, 2, 100, 400, 1),
        (1, 1, 1, 30, 70, 1),
        (1, 1, 1, 5, 60, 1),
    ]
    n = len(rows)
    rank, cat, name, start, end, tid = (np.array(c) for c in zip(*rows))
    numbers = {
        "rank": rank.astype(np.int32),
        "file_id": rank.astype(np.int32),
        "source_index": np.arange(n, dtype=np.int64),
        "start_ns": start.astype(np.int64),
        "end_ns": end.astype(np.int64),
        "pid": np.ones(n, dtype=np.int64),
        "tid": tid.astype(np.int64),
        "on_gpu": np.zeros(n, dtype=bool),
        "depth": np.zeros(n, dtype=np.int16),
    }
    for column in ("seq", "peer", "tag", "nbytes", "correlation"):
        numbers[column] = np.full(n, -1, dtype=np.int64)
    codes = {"cat": cat.astype(np.int32), "name": name.astype(np.int32)}
    return EventColumns(numbers, codes, {"cat": ["user_annotation", "cpu_op"], "name": names})


def test_steps_keep_row_order_where_a_number_repeats_and_span_an_unmarked_rank():
    columns = generated_steps()
    expected = {"rank": [0, 0, 1], "step": [2, 2, 0], "step_start_ns": [500, 100, 5], "step_end_ns": [900, 400, 70]}
    assert {c: v.tolist() for c, v in step_table(EventArrays.of(columns)).items()} == expected
    frame = find_steps(events_frame([columns.copy()]))
    assert {c: frame[c].tolist() for c in expected} == expected and frame["n_actions"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("device", [False, True], ids=["host", "gpu"])
def test_a_reducing_parser_worker_never_imports_pandas(device):
    """Workers fork before the parent loads pandas; the reduce they run on each file must not
    load it either (~75 MB and 0.4 s a worker): a pipeline sample's rank, and a real GPU
    rank (device ops and the host-side busy rows are found there too)."""
    if device:
        path = shared_or_skip("kineto-gpu", "hta_trace_filter_sampled_rank-1.json.gz")
        found = "len(parsed[0][0].reduced['device_summary']['steps']['rank']) and parsed[0][0].reduced['host_busy']"
    else:
        path = SAMPLES / "interleaved1f1b" / "rank1.json.gz"
        found = "parsed[0][0].reduced['actions']['kind']"
    code = (
        "import functools, sys\n"
        "from tracekit.ingest.file_task import IngestTask, parse_one\n"
        "from tracekit.ingest.options import Reducer\n"
        "from tracekit.loading import reduce_file\n"
        "reducer = Reducer(functools.partial(reduce_file, labels=None))\n"
        f"parsed, _ = parse_one(IngestTask({str(path)!r}, 1, rows='reduce', reducer=reducer))\n"
        f"assert parsed[0][0].reduced is not None and {found}\n"
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
