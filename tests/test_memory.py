"""Activation memory from the order: microbatches in flight per rank, generated and measured
orders agreeing, and the size of one microbatch's activations with its source."""

from __future__ import annotations

import pytest

from conftest import SAMPLES
from tracekit import LoadOptions, load
from tracekit.analyze.memory import (
    SOURCE_P2P,
    SOURCE_USER,
    ActivationSize,
    activation_size,
    in_flight,
    in_flight_per_rank,
    orders_of_graph,
    parse_bytes,
    peak_activation_bytes,
)
from tracekit.analyze.replay import step_graphs
from tracekit.vocab import format_bytes
from tracekit.analyze.schedules import GENERATORS, graph_from_orders, gpipe, interleaved_1f1b, one_f_one_b
from tracekit.errors import TracekitError


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16), (4, 2)])
def test_gpipe_holds_every_microbatch_and_1f1b_p_minus_r(p, m):
    assert in_flight_per_rank(gpipe(p, m)) == {r: m for r in range(p)}
    # PipeDream-Flush: rank r runs p-r-1 warm-up forwards and one more before its first backward
    assert in_flight_per_rank(one_f_one_b(p, m)) == {r: min(p - r, m) for r in range(p)}


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 4, 8), (2, 2, 4), (4, 2, 4)])
def test_interleaved_holds_its_warm_up_plus_one(p, v, m):
    """Megatron's interleaved warm-up: (p-r-1)*2 + (v-1)*p forwards, then one more before the
    first backward (all v*m chunks when the warm-up covers them)."""
    want = {r: min((p - r - 1) * 2 + (v - 1) * p + 1, v * m) for r in range(p)}
    assert in_flight_per_rank(interleaved_1f1b(p, v, m)) == want


def test_split_backward_releases_at_w_not_at_i():
    """A generated order (not a trace): with the backward split, the input-grad I keeps the
    activations (W still needs the layer inputs); W releases them."""
    order = [("F", 0, 0), ("F", 0, 1), ("I", 0, 0), ("F", 0, 2), ("W", 0, 0), ("I", 0, 1), ("W", 0, 1), ("F", 0, 3)]
    assert in_flight(order) == 3
    fused = [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("F", 0, 2)]  # a full B releases at once
    assert in_flight(fused) == 2


def test_order_of_a_generated_graph_is_the_generated_order():
    orders = interleaved_1f1b(4, 2, 8)
    graph = graph_from_orders(orders, {"F": 1, "B": 1})
    assert orders_of_graph(graph) == orders


def _sample(name: str):
    path = SAMPLES / name
    if not list(path.glob("rank*.json.gz")):
        pytest.skip(f"{path} holds no traces")
    return load(path, LoadOptions(jobs=1, rows="analysis"))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved1f1b", "megatron_interleaved"])
def test_measured_orders_hold_what_their_generated_orders_hold(name):
    run = _sample(name)
    sched = run.schedule
    want = in_flight_per_rank(GENERATORS[sched.name](sched.p, sched.v, sched.m))
    for graph in step_graphs(run).values():
        assert in_flight_per_rank(orders_of_graph(graph)) == want


def test_zero_bubble_v_holds_as_much_as_1f1b():
    """ZB-V keeps 1F1B's activation memory (p microbatches = 2p chunks of half a rank)."""
    run = _sample("zbv")
    for graph in step_graphs(run).values():
        assert in_flight_per_rank(orders_of_graph(graph)) == {r: 2 * run.schedule.p for r in range(run.schedule.p)}


def test_activation_size_from_the_p2p_messages_is_a_stated_proxy():
    # every message in these samples is an [8, 256] float32 tensor
    one = activation_size(_sample("1f1b"))
    assert one == ActivationSize(8 * 256 * 4, SOURCE_P2P) and "proxy" in one.source
    two = activation_size(_sample("interleaved1f1b"))  # two chunks a rank: two boundary tensors
    assert two.bytes_per_microbatch == 2 * 8 * 256 * 4
    assert activation_size(_sample("1f1b"), 3 << 20) == ActivationSize(3 << 20, SOURCE_USER)


def test_peak_bytes_scale_with_chunks_and_the_kept_global_batch():
    size = ActivationSize(1 << 20, SOURCE_USER)
    # 1F1B at the measured m: rank 0 holds 4 microbatches of a whole rank's layers
    assert peak_activation_bytes(one_f_one_b(4, 8), size, 1, 8, 8, "global-batch") == (4, 4 << 20)
    # twice the microbatches with the global batch kept: each half as large
    assert peak_activation_bytes(one_f_one_b(4, 16), size, 1, 16, 8, "global-batch") == (4, 2 << 20)
    assert peak_activation_bytes(one_f_one_b(4, 16), size, 1, 16, 8, "microbatch") == (4, 4 << 20)
    # interleaved v=2: 11 chunks of half a rank
    assert peak_activation_bytes(interleaved_1f1b(4, 2, 8), size, 2, 8, 8, "global-batch") == (11, 11 << 19)


def test_sizes_parse_and_bad_ones_are_one_line_errors():
    assert parse_bytes("2GiB", "--memory-budget") == 2 << 30
    assert parse_bytes("512MB", "--memory-budget") == 512 * 10**6
    assert parse_bytes("1.5KiB", "--memory-budget") == 1536
    assert parse_bytes("4096", "--memory-budget") == 4096
    for bad in ("", "two GiB", "-1GiB", "3PB", "0", "nanGiB"):
        with pytest.raises(TracekitError, match="--memory-budget"):
            parse_bytes(bad, "--memory-budget")
    assert format_bytes(2 << 30) == "2.0 GiB" and format_bytes(1536) == "1.5 KiB" and format_bytes(12) == "12 B"


def _generated_memory_trace(path, events) -> None:
    """A generated Kineto document (not a trace): the given events only."""
    import gzip
    import json

    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_memory_events_are_read_with_the_step_starts_and_bad_entries_skipped(tmp_path):
    from tracekit.ingest.kineto_memory import read_memory_events

    def mem(ts, nbytes, total, **args):
        return {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "ts": ts,
            "tid": 7,
            "pid": 7,
            "args": {"Bytes": nbytes, "Total Allocated": total, "Device Type": 0, **args},
        }

    path = tmp_path / "rank0.json.gz"
    _generated_memory_trace(
        path,
        [
            {"ph": "X", "name": "ProfilerStep#2", "ts": 10.0, "dur": 100.0, "pid": 7, "tid": 7},
            mem(12.5, 4096, 4096),
            mem(11.0, 1024, 1024),
            mem(13.0, -1024, 3072),
            {"ph": "i", "name": "[memory]", "ts": 14.0, "args": {"Bytes": "lots"}},  # not a number: skipped
            {"ph": "i", "name": "[memory]", "ts": float("nan"), "args": {"Bytes": 1, "Total Allocated": 1}},
            {"ph": "X", "name": "ProfilerStep#x", "ts": 20.0, "dur": 1.0},
        ],
    )
    found = read_memory_events(path)
    assert found.step_starts_ns == {2: 10_000}
    assert found.events["ts_ns"].tolist() == [11_000, 12_500, 13_000]  # by time
    assert found.events["total_allocated"].tolist() == [1024, 4096, 3072]
    assert found.events["bytes"].tolist() == [1024, 4096, -1024]
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b not gzip")
    assert len(read_memory_events(broken).events) == 0


def test_capture_profile_memory_is_on_the_command_line_and_refused_where_it_cannot_record():
    from tracekit.capture.config import CaptureConfig
    from tracekit.errors import CaptureError

    cfg = CaptureConfig(profile_memory=True).validate()
    assert "--profile-memory" in cfg.command_line("out")
    assert "--profile-memory" not in CaptureConfig().validate().command_line("out")
    with pytest.raises(CaptureError, match="--profile-memory"):
        CaptureConfig(profile_memory=True, framework="deepspeed").validate()
    with pytest.raises(CaptureError, match="--profile-memory"):
        CaptureConfig(profile_memory=True, p2p_delay_ms=5).validate()


MEMORY_SAMPLE = "1f1b_profile_memory"


def test_activations_from_the_profiler_s_memory_events_of_a_real_capture():
    """sample_traces/1f1b_profile_memory: 1F1B, 4 layers of Linear(256, 256) + ReLU a stage, 8
    rows a microbatch. What a rank holds at its first backward grows with the forwards in
    flight the order says (4, 3, 2, 1), one size per forward on every rank but the last
    (which also keeps its loss)."""
    from tracekit.analyze.memory import SOURCE_MEMORY, activation_size_from_memory
    from tracekit.ingest.kineto_memory import read_memory_events

    run = _sample(MEMORY_SAMPLE)
    memory = {f.rank: read_memory_events(f.path) for f in run.files}
    size = activation_size_from_memory(run, memory)
    assert size is not None and size.source == SOURCE_MEMORY
    tensor = 8 * 256 * 4
    # four saved tensors of [8, 256] float32 per stage and microbatch: far above the P2P proxy
    assert [size.per_rank[r] for r in range(3)] == [4 * tensor] * 3
    assert size.per_rank[3] >= 4 * tensor
    assert activation_size(run, memory=memory) == size
    assert activation_size(run).source == SOURCE_P2P  # without the events: the proxy, said so


def test_a_fused_pair_holds_and_releases_like_its_two_actions():
    """A generated order (not a trace) with DualPipeV's fused OVERLAP_F_B entries: the forward
    half adds one, the backward half releases its own pair."""
    order = [("F", 0, 0), ("F", 0, 1), (("F", 0, 2), ("B", 0, 0)), (("F", 0, 3), ("B", 0, 1)), ("B", 0, 2)]
    assert in_flight(order) == 3
