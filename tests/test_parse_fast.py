"""The Kineto parser's fast paths equal their references: the column-wise row builder equals
the event-by-event one on real traces and on generated odd batches, the one-pass time
conversion equals the general one, adding an offset to times equals adding it row by row
with int64's limits, selecting rows by indices equals selecting them by a mask, and record_param_comms's fields worked out once per
distinct value equal working them out per event. (Generated values and events are unit-test
fixtures, not traces.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import SAMPLES, SHARED_TRACES
from generated_python_frames import FORWARD_STEP
from tracekit.ingest.kineto import read_kineto
from tracekit.ingest.kineto_comm import _gloo_p2p_args, _nccl_comm_args
from tracekit.ingest.kineto_document import read_json_document
from tracekit.ingest.kineto_rows import _Irregular, _ns, _numbers, _RowBuilder
from tracekit.ingest.kineto_stream import ChromeTraceStream, decode_elements, event_from_object
from tracekit.ingest.columns import take_rows
from tracekit.ingest.validate import MAX_DISTANCE_NS, NOT_A_TIME, add_ns, drop_impossible, ns_from_us


def _columns(builder: _RowBuilder) -> dict:
    """A builder's columns, names decoded (codes depend on the order names were met)."""
    out = builder.columns(1_700_000_000_000_000_000, {"0": [0, 1, 2, 3]}, 0, 0)
    numbers = {k: v.tolist() for k, v in out.numbers.items()}
    for col, codes in out.codes.items():
        numbers[col] = [out.values[col][c] for c in codes.tolist()]
    return {
        "columns": numbers,
        "odd": builder.odd_identities,
        "bad_cats": builder.bad_categories,
        "complete": builder.n_complete,
        "first_ts": builder.first_x_ts,
        "dropped": builder.dropped.counts,
    }


def _both_ways(batches: list[list]) -> tuple[dict, dict, int]:
    """Columns built column-wise (batches it refuses go event by event, as in ``add``) and
    event by event only; and how many batches the column-wise path took."""
    fast, each = _RowBuilder(), _RowBuilder()
    taken = 0
    for batch in batches:
        try:
            fast._add_columns(batch)
            taken += 1
        except _Irregular:
            fast._add_each(batch)
        fast.n_elements += len(batch)
        each._add_each(batch)
        each.n_elements += len(batch)
    return _columns(fast), _columns(each), taken


def _real_files():
    files = [SAMPLES / "1f1b" / "rank1.json.gz", SAMPLES / "megatron_1f1b" / "rank0.json.gz"]
    gpu = SHARED_TRACES / "kineto-gpu"
    if gpu.is_dir():
        files += sorted(gpu.glob("*.json.gz"))
    return files


@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name)
def test_column_wise_rows_equal_event_by_event_rows_on_real_traces(path):
    batches = list(ChromeTraceStream(path, whole_document=read_json_document))
    fast, each, taken = _both_ways(batches)
    assert taken == len(batches)  # real traces take the fast path
    assert fast == each


def _generated_events(rng) -> list[dict]:
    """Complete events with odd but legal values, other phases between them."""
    cats = ["cpu_op", "kernel", "Kernel", "cuda_runtime", "python_function", "", 7, None, True, "gpu_memcpy"]
    names = ["aten::mm", "c10d::send", "record_param_comms", "gloo:send", "ProfilerStep#3", "x", FORWARD_STEP]
    out: list[dict] = []
    for i in range(int(rng.integers(1, 60))):
        if rng.random() < 0.2:
            out.append({"ph": str(rng.choice(["s", "f", "i", "M"])), "name": "flow", "ts": 1.0})
            continue
        event = {"ph": "X", "cat": cats[int(rng.integers(len(cats)))], "name": names[int(rng.integers(len(names)))]}
        event["ts"] = [float(1000 + i), 1000 + i, 1000.25 + i, True][int(rng.integers(4))]
        if rng.random() < 0.9:
            event["dur"] = [2.5, 3, 0.0, 1.0005][int(rng.integers(4))]
        event["pid"] = [1, 2, "stream 7", 0][int(rng.integers(4))]
        event["tid"] = [1, 5, 3.0, "t"][int(rng.integers(4))] if rng.random() < 0.5 else 1
        if rng.random() < 0.8:
            args = {"External id": int(rng.integers(0, 9)), "Sequence number": [1, 2.0, "3"][int(rng.integers(3))]}
            if rng.random() < 0.5:
                args["correlation"] = [-1, 4, -1.0][int(rng.integers(3))]
            if event["name"] == "record_param_comms":
                args.update({"Collective name": "send", "Dst Rank": 1, "In msg nelems": 10, "dtype": "Float"})
            if event["name"] == "c10d::send":
                args.update({"Concrete Inputs": ["", "", "1", "0"], "Input Dims": [[[4, 4]]], "Input type": ["f"]})
            event["args"] = args
        out.append(event)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_column_wise_rows_equal_event_by_event_rows_on_generated_batches(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        events = _generated_events(rng)
        typed = decode_elements(json.dumps(events).encode())
        generic = [event_from_object(e) for e in events]  # as a generically decoded batch
        fast, each, _ = _both_ways([typed, generic])
        assert fast == each, events


def test_one_pass_times_equal_the_general_conversion():
    """Plain floats take one pass; anything else the general way, with the same values."""
    cases = [
        [1.5, 2.25, 1e12, -3.0],
        [0.0004, 0.0005, 0.0015, 2.5e-4],
        [9.0e12, 9.007e12, 1.0],  # around 2**53 / 1000
        [1.0, math.nan, 2.0],
        [math.inf],
        [1, 2, 3],
        [1.5, 2**60],
        [True, 2.5],
        [1e19, 1.0],
        [1.7e15 + 0.125, 1.7e15 + 1.5],  # epoch microseconds, as older Kineto writes them
        [1.7e15, 1_700_000_000_000_001],  # an int beyond 2**53 among them: rounded by float math
        [9.2e15, 9.3e15, 9.223372036854775e15, -9.3e15],  # around the int64 ns limit
        [1, 2**62],
        [False, True],
        [],
    ]
    for values in cases:
        try:
            want = ns_from_us(_numbers(values))
        except _Irregular:
            with pytest.raises(_Irregular):
                _ns(values)
            continue
        got = _ns(values)
        assert got.dtype == want.dtype and np.array_equal(got, want), values


def _comm_events() -> list[dict]:
    """record_param_comms events whose fields repeat, with values of every JSON type."""
    values = {
        "Collective name": ["send", "recv", "allreduce", 1, 1.0, True, None, ["x"], -0.0, 0.0],
        "Dst Rank": [1, 1.0, "1", True, 2**40, None],
        "Src Rank": [0, "0", 0.0],
        "In msg nelems": [10, 10.0, "10", 2**62, -1],
        "Out msg nelems": [10, 20],
        "dtype": ["Float", "BFloat16", 1, 1.0, True],
        "Global rank start": [0, 4, -1, "2", 1.0],
        "Global rank stride": [1, 2, -1, 0, "2", 2.0, None],
    }
    rng = np.random.default_rng(3)
    events = []
    for i in range(400):
        args = {k: v[int(rng.integers(len(v)))] for k, v in values.items() if rng.random() < 0.85}
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 10.0 + i, "dur": 0.5, "args": args}
        )
    return events


def test_comm_fields_worked_out_once_equal_per_event(tmp_path):
    events = _comm_events()
    path = tmp_path / "generated_comms.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    _, columns = read_kineto(path, 0)
    names = [columns.values["name"][c] for c in columns.codes["name"].tolist()]
    order = np.argsort(columns.numbers["source_index"], kind="stable")
    for row in order.tolist():
        event = events[columns.numbers["source_index"][row]]
        want_name, want_peer, want_bytes, want_stride = _nccl_comm_args(event["args"], {})
        got = (names[row], columns.numbers["peer"][row], columns.numbers["nbytes"][row], columns.numbers["tag"][row])
        assert got == (want_name, want_peer, want_bytes, want_stride), event


def _reference_drop(start_ns, end_ns, identity):
    """drop_impossible as it was written first (every row's distance in float64; times tied
    by one lexsort of all rows): the reference for the version that skips what cannot change."""
    n = len(start_ns)
    keep = (start_ns != NOT_A_TIME) & (end_ns != NOT_A_TIME)
    counts = {"not_a_time": int(n - keep.sum())}
    backwards = keep & (end_ns < start_ns)
    counts["end_before_start"] = int(backwards.sum())
    keep &= ~backwards
    if keep.any():
        median = float(np.median(start_ns[keep]))
        far = keep & (
            (np.abs(start_ns.astype(np.float64) - median) > MAX_DISTANCE_NS)
            | (np.abs(end_ns.astype(np.float64) - median) > MAX_DISTANCE_NS)
        )
        counts["far"] = int(far.sum())
        keep &= ~far
    rows = np.flatnonzero(keep)
    repeats = np.zeros(n, dtype=bool)
    order = rows[np.lexsort((end_ns[rows], start_ns[rows]))]
    tie = (start_ns[order][1:] == start_ns[order][:-1]) & (end_ns[order][1:] == end_ns[order][:-1])
    if tie.any():
        tied = np.unique(np.concatenate([order[1:][tie], order[:-1][tie]]))
        columns = [start_ns[tied], end_ns[tied]] + [np.asarray(c)[tied] for c in identity]
        order = tied[np.lexsort([tied] + columns[::-1])]
        same = np.ones(len(order) - 1, dtype=bool)
        for column in [start_ns, end_ns] + [np.asarray(c) for c in identity]:
            same &= column[order][1:] == column[order][:-1]
        repeats[order[1:][same]] = True
    counts["duplicate"] = int(repeats.sum())
    keep &= ~repeats
    return (None if keep.all() else keep), counts


@pytest.mark.parametrize("seed", range(4))
def test_dropping_impossible_rows_equals_the_reference(seed):
    """Generated times: repeats, shared starts, NOT_A_TIME, ends before starts, and rows
    just inside, at and beyond 24 h from the median (in float64, where it rounds), and runs
    spanning just under 24 h (where the median is not looked for)."""
    rng = np.random.default_rng(seed)
    day = MAX_DISTANCE_NS
    for trial in range(300):
        n = int(rng.integers(1, 80))
        base = int(rng.choice([0, 1_700_000_000_000_000_000, -(2**62)]))
        start = base + rng.integers(0, 50, n) * int(rng.choice([1, 1000]))
        end = start + rng.integers(-1 if trial % 7 == 0 else 0, 4, n)
        wild = rng.random(n) < (0.1 if trial % 2 else 0.0)
        near = [day - 8193, day - 8192, day - 8191, day - 1]  # spans the median need not be found for
        offsets = rng.choice(near + [day, day + 1, day + 4096, -day - 1, 2**62, -(2**62)], n)
        start = np.where(wild, start + offsets // 2, start)
        end = np.where(wild & (rng.random(n) < 0.5), end + offsets, end)
        start[rng.random(n) < 0.03] = NOT_A_TIME
        ident = [rng.integers(0, 2, n), rng.integers(0, 2, n)]
        keep, dropped = drop_impossible(start, end, ident)
        want_keep, want_counts = _reference_drop(start, end, ident)
        assert dropped.counts == want_counts, trial
        assert (keep is None) == (want_keep is None) and (keep is None or np.array_equal(keep, want_keep)), trial


def _p2p_events() -> list[dict]:
    """gloo send/recv ops whose args repeat, with odd lists among them."""
    inputs = [["", "", "1", "0"], ["", "", "3", "7"], ["", "", 1.5, "x"], "notalist", None, [[]]]
    dims = [[[[8, 256]], [], [], []], [[8, 256]], [[-1, 3]], [], "x", [[[2**40, 2**40]]], None]
    types = [["TensorList", "", "Scalar", "Scalar"], ["float"], ["c10::BFloat16"], [], [1]]
    rng = np.random.default_rng(5)
    events = []
    for i in range(300):
        args = {"External id": i, "Sequence number": i}
        for key, values in (("Concrete Inputs", inputs), ("Input Dims", dims), ("Input type", types)):
            value = values[int(rng.integers(len(values)))]
            if value is not None:
                args[key] = value
        name = str(rng.choice(["c10d::send", "c10d::recv_"]))
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": 10.0 + i, "dur": 0.5, "args": args})
    return events


def test_p2p_fields_worked_out_once_equal_per_event(tmp_path):
    events = _p2p_events()
    path = tmp_path / "generated_p2p.json"
    group = [10, 11, 12, 13]
    path.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "distributedInfo": {"pg_config": [{"pg_name": "0", "ranks": group}]},
                "traceEvents": events,
            }
        )
    )
    _, columns = read_kineto(path, 0)
    n = columns.numbers
    for row in range(len(columns)):
        event = events[n["source_index"][row]]
        want = _gloo_p2p_args(event["args"], group)
        assert (n["peer"][row], n["tag"][row], n["nbytes"][row]) == want, event


_INT64_MAX = np.iinfo(np.int64).max


def _add_ns_reference(times: list[int], offsets: list[int]) -> list[int]:
    """Row by row in Python ints: NOT_A_TIME where either side is one or the sum leaves int64."""
    out = []
    for t, o in zip(times, offsets):
        total = t + o
        out.append(NOT_A_TIME if NOT_A_TIME in (t, o) or not -_INT64_MAX - 1 <= total <= _INT64_MAX else total)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_adding_an_offset_equals_adding_it_row_by_row(seed):
    """Both ways through add_ns (the extremes settling it, and the per-row checks) give the
    reference, whether the offset is one number or one per row."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50))
    edges = np.array([NOT_A_TIME, -_INT64_MAX, -1, 0, 1, _INT64_MAX - 1, _INT64_MAX], dtype=np.int64)
    scale = 10 ** int(rng.integers(0, 19))
    times = rng.integers(-scale, scale, n, dtype=np.int64, endpoint=True)
    offsets = rng.integers(-scale, scale, n, dtype=np.int64, endpoint=True)
    if seed % 2:  # an extreme or two among ordinary rows
        times[rng.integers(0, n)] = rng.choice(edges)
        offsets[rng.integers(0, n)] = rng.choice(edges)
    assert add_ns(times, offsets).tolist() == _add_ns_reference(times.tolist(), offsets.tolist())
    one = int(offsets[0])
    assert add_ns(times, one).tolist() == _add_ns_reference(times.tolist(), [one] * n)


def test_adding_an_offset_at_int64s_edges():
    edges = [NOT_A_TIME, -_INT64_MAX, -(2**40), -1, 0, 1, 2**40, _INT64_MAX - 1, _INT64_MAX]
    for t in edges:
        for o in edges:
            assert add_ns(np.array([t, 5], dtype=np.int64), o).tolist() == _add_ns_reference([t, 5], [o, o]), (t, o)


def test_selecting_rows_by_indices_equals_selecting_them_by_the_mask():
    rng = np.random.default_rng(3)
    columns = {
        "start_ns": rng.integers(0, 10**15, 1000),
        "depth": rng.integers(0, 9, 1000).astype(np.int16),
        "on_gpu": rng.random(1000) < 0.5,
    }
    for mask in (rng.random(1000) < 0.3, np.zeros(1000, dtype=bool), np.ones(1000, dtype=bool)):
        picked = take_rows(columns, mask)
        for name, values in columns.items():
            assert picked[name].dtype == values.dtype
            assert picked[name].tolist() == values[mask].tolist()
    order = rng.permutation(1000)[:400]
    assert take_rows(columns, order)["start_ns"].tolist() == columns["start_ns"][order].tolist()
