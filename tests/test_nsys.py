"""Nsight Systems reports: every real export in ../shared, NVTX naming, NCCL P2P kernels,
ranks, time normalisation, broken input, and the scrubbed nsys capture."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from tracekit.errors import TraceFormatError
from tracekit import LoadOptions, load
from tracekit.ingest import nsys, read_run
from tracekit.ingest.nsys_names import classify
from tracekit.cli import main
from tracekit.model.events import EVENT_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
SHARED_NSYS = Path(__file__).resolve().parents[2] / "shared" / "real-traces" / "nsys"
SAMPLE = ROOT / "sample_traces" / "nsys_1f1b"
PRIVATE = ("PATH=", "HOME=", "USER=", "/root", "/home/")


def shared(*parts: str) -> Path:
    path = SHARED_NSYS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared real traces are not laid beside this checkout")
    return path


def _shared_files() -> list[Path]:
    if not SHARED_NSYS.exists():
        return []
    return sorted(p for p in SHARED_NSYS.rglob("*") if p.suffix in (".sqlite", ".json"))


def _parse(path: Path, rank_map=None):
    parse = nsys.parse_nsys_json if path.suffix == ".json" else nsys.parse_nsys_sqlite
    return parse(path, 0, rank_map=rank_map)


def _all_events(pairs) -> pd.DataFrame:
    return pd.concat([events for _, events in pairs], ignore_index=True)


# --------------------------------------------------------------------------------------
# every real export
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", _shared_files() or [None], ids=lambda p: p.name if p else "absent")
def test_every_shared_nsys_file_loads(path):
    if path is None:
        pytest.skip(f"{SHARED_NSYS} is absent: the shared real traces are not laid beside this checkout")
    pairs = _parse(path)
    assert pairs
    for trace, events in pairs:
        assert list(events.columns) == EVENT_COLUMNS
        assert trace.format == ("nsys-json" if path.suffix == ".json" else "nsys-sqlite")
        assert trace.profiler["nsys_version"]
        assert len(events) > 0
        assert (events["end_ns"] >= events["start_ns"]).all()
        assert (events["rank"] == trace.rank).all()
        assert events["cat"].isin(["cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "runtime"]).all()
        if trace.clock == "unix":
            assert events["start_ns"].min() > 1.5e18  # after 2017: really epoch ns
    ranks = [t.rank for t, _ in pairs]
    assert len(set(ranks)) == len(ranks)


@pytest.mark.parametrize("name, per_gpu", [("nsysai_mfu_2gpu_before.sqlite", 33), ("nsysai_mfu_2gpu_after.sqlite", 31)])
def test_two_gpu_report_sendrecv_kernels_are_all_to_all_not_p2p(name, per_gpu):
    # README says 33 SendRecv kernels per GPU; the "after" window holds 31 (counted in the file).
    # Each runs an all_to_all: AllToAll4D -> c10d::alltoall_base_ -> nccl:all_to_all ->
    # ncclGroupStart, 2 x ncclSend + 2 x ncclRecv, ncclGroupEnd; the first kernel on each GPU
    # was launched before the capture began.
    pairs = _parse(shared(name))
    assert [t.rank for t, _ in pairs] == [0, 1]
    assert {t.rank_source for t, _ in pairs} == {"CUDA device id"}
    assert all(t.backend == "nccl" and t.clock == "unix" for t, _ in pairs)
    for trace, events in pairs:
        kernels = events[events["cat"] == "kernel"]
        sendrecv = kernels[kernels["name"].str.startswith("ncclDevKernel_SendRecv")]
        assert len(sendrecv) == per_gpu
        assert not kernels["name"].str.startswith("nccl:SendRecv|").any()
        assert set(kernels["pid"]) == {trace.rank}  # pid = CUDA device
        assert trace.profiler["nccl_p2p_kernels"] == {
            "by_launch": 0,
            "by_name": 0,
            "sendrecv_named_in_collectives": per_gpu - 1,
            "sendrecv_named_unplaced": 1,
        }
        launches = events[(events["cat"] == "runtime") & events["correlation"].isin(sendrecv["correlation"])]
        assert len(launches) == per_gpu - 1
    assert any("were not taken as P2P" in w for w in pairs[0][0].warnings)
    assert _kernel_pairs(_all_events(pairs)).empty


def _kernel_pairs(events: pd.DataFrame) -> pd.DataFrame:
    """The device P2P kernel pairs tracekit finds in a run without pipeline actions."""
    from tracekit.model.run import ACTION_COLUMNS
    from tracekit.reconstruct.device import device_ops, pair_p2p_kernels, summarise_table
    from tracekit.reconstruct.steps import find_steps

    no_actions = pd.DataFrame(columns=ACTION_COLUMNS)
    summary, _ = summarise_table(device_ops(events, find_steps(events)), events, no_actions, {})
    return pair_p2p_kernels(summary)


def _generated_p2p_events(kernels: list[tuple[int, int, int]]) -> pd.DataFrame:
    """generated_ P2P kernel rows (rank, start_ns, end_ns) between ranks 0 and 1: made up here."""
    from tracekit.model.events import conform

    n = len(kernels)
    return conform(
        pd.DataFrame(
            {
                "rank": [k[0] for k in kernels],
                "file_id": [k[0] for k in kernels],
                "source_index": range(n),
                "cat": "kernel",
                "name": "nccl:SendRecv|ncclDevKernel_SendRecv",
                "start_ns": [k[1] for k in kernels],
                "end_ns": [k[2] for k in kernels],
                "pid": 0,
                "tid": 20,
                "on_gpu": True,
                "depth": 0,
                "seq": -1,
                "peer": -1,
                "tag": -1,
                "nbytes": -1,
                "correlation": -1,
            }
        )
    )


def test_kernel_pairs_wait_is_on_the_side_that_started_first():
    table = _kernel_pairs(
        _generated_p2p_events(
            [
                (0, 100, 500),
                (1, 300, 505),  # rank 0 starts 200 ns early, rank 0 ends first
                (0, 1_000, 1_300),
                (1, 900, 1_310),  # rank 1 starts 100 ns early
                (0, 2_000, 2_100),
                (1, 2_000, 2_400),  # both start together: nobody waits
            ]
        )
    )
    assert table[["waiting_rank", "wait_ns", "transfer_ns"]].values.tolist() == [
        [0, 200, 200],
        [1, 100, 300],
        [-1, 0, 100],
    ]  # "the shorter kernel" would say 205 for the first


def test_kernel_pairs_on_real_kernel_times_agree_with_the_reference():
    # The real all_to_all SendRecv kernels of a 2-GPU report, renamed as P2P here only to run
    # the pairing on real device times; tests/device_reference.py pairs them from the raw SQLite.
    import device_reference

    path = shared("nsysai_mfu_2gpu_before.sqlite")
    events = _all_events(_parse(path))
    sendrecv = events["on_gpu"] & events["name"].str.startswith("ncclDevKernel_SendRecv")
    events = events.assign(name=events["name"].astype(object).where(~sendrecv, "nccl:SendRecv|ncclDevKernel_SendRecv"))
    table = _kernel_pairs(events).rename(
        columns={
            "send_start_ns": "start_a_ns",
            "send_end_ns": "end_a_ns",
            "recv_start_ns": "start_b_ns",
            "recv_end_ns": "end_b_ns",
        }
    )
    kernels = device_reference.nsys_reference(path).nccl_kernels
    expected = device_reference.kernel_pairs(
        *[[(k.start_ns, k.end_ns) for k in kernels if k.rank == r] for r in (0, 1)]
    )
    assert len(table) == len(expected) == 33
    got = table[["start_a_ns", "end_a_ns", "start_b_ns", "end_b_ns", "transfer_ns"]].values.tolist()
    assert got == [[p["start_a_ns"], p["end_a_ns"], p["start_b_ns"], p["end_b_ns"], p["transfer_ns"]] for p in expected]
    assert table["wait_ns"].tolist() == [p["wait_ns"] for p in expected]
    # one transfer, one clock: the two sides end within 30 us, every transfer is positive
    assert (table["end_a_ns"] - table["end_b_ns"]).abs().max() < 30_000
    assert (table["transfer_ns"] > 0).all()


def test_emit_nvtx_ranges_become_cpu_ops_with_seq():
    pairs = _parse(shared("nsysai_mfu_2gpu_before.sqlite"))
    events = pairs[0][1]
    ops = events[events["cat"] == "cpu_op"]
    assert not ops["name"].str.contains(", op_id = |, seq = ", regex=True).any()
    assert (ops[ops["name"] == "aten::add"]["seq"] >= 0).all()
    labels = set(events.loc[events["cat"] == "user_annotation", "name"])
    assert {"nccl:ncclSend", "nccl:ncclRecv", "nccl:ncclGroupEnd", "nccl:all_to_all"} <= labels
    assert "record_param_comms" in set(ops["name"])


@pytest.mark.parametrize(
    "text, domain, expected",
    [
        ("aten::mm, seq = 12, op_id = 3, sizes = [[8, 256], [256, 256]]", "", ("cpu_op", "aten::mm", 12)),
        ("aten::view, op_id = 990742", "", ("cpu_op", "aten::view", -1)),
        (
            "autograd::engine::evaluate_function: MmBackward0, seq = 5, op_id = 9",
            "",
            ("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 5),
        ),
        ("TracekitEmuCompute, seq = 352, op_id = 18, sizes = [[8, 256]]", "", ("cpu_op", "TracekitEmuCompute", 352)),
        ("PP:1F0, op_id = 4", "", ("user_annotation", "PP:1F0", -1)),
        ("ProfilerStep#3, op_id = 1", "", ("user_annotation", "ProfilerStep#3", -1)),
        ("gloo:recv, op_id = 7, sizes = [[8, 256]]", "", ("user_annotation", "gloo:recv", -1)),
        (
            "megatron.core.pipeline_parallel.schedules.forward_step",
            "",
            ("user_annotation", "megatron.core.pipeline_parallel.schedules.forward_step", -1),
        ),
        ("ncclSend", "NCCL", ("user_annotation", "nccl:ncclSend", -1)),
    ],
)
def test_nvtx_names_follow_kineto_conventions(text, domain, expected):
    assert classify(text, domain) == expected


def test_pipit_2022_2_export_with_extra_columns():
    pairs = _parse(shared("pipit_saxpy-mpi-cuda_nsys_perlmutter0.sqlite"))
    assert len(pairs) == 1
    trace, events = pairs[0]
    assert trace.profiler["meta_table"] == "EXPORT_META_DATA"
    assert trace.profiler["schema"] == "2.9.1"
    assert trace.profiler["nsys_version"].startswith("2022.2")
    assert (trace.rank, trace.rank_source) == (0, "NVTX rank marker")  # thread named "MPI Rank 0"
    assert (events["cat"] == "kernel").sum() == 5
    assert (events["cat"] == "gpu_memcpy").sum() == 15
    names = set(events.loc[events["cat"] == "user_annotation", "name"])
    assert {"MPI_Send", "MPI_Recv", "saxpy"} <= names


CPU_ONLY = [
    "pp_sim_cpuonly_export2022.4.sqlite",
    "pp_sim_cpuonly_export2023.4.sqlite",
    "pp_sim_cpuonly_export2023.4_tsnormalize.sqlite",
]


def test_cpu_only_exports_agree_on_absolute_times():
    tables = {}
    for name in CPU_ONLY:
        pairs = _parse(shared("cpu-only-nvtx", name))
        assert [t.rank for t, _ in pairs] == [0, 1]
        assert all(t.clock == "unix" for t, _ in pairs)
        events = _all_events(pairs).sort_values(["rank", "start_ns", "name"]).reset_index(drop=True)
        names = set(events["name"])
        assert {"nccl:ncclSend", "nccl:ncclGroupEnd", "startend rank0"} <= names
        assert any(n.startswith("megatron.core.pipeline_parallel") for n in names)
        tables[name] = events[["rank", "name", "start_ns", "end_ns"]]
    normalized = _parse(shared("cpu-only-nvtx", CPU_ONLY[2]))[0][0]
    assert normalized.profiler["time_normalized"] is True
    first = tables[CPU_ONLY[0]]
    for name in CPU_ONLY[1:]:
        pd.testing.assert_frame_equal(tables[name], first)


def test_json_export_is_read_relative_with_a_warning():
    json_pairs = _parse(shared("cpu-only-nvtx", "pp_sim_cpuonly_export2023.4.json"))
    sql_pairs = _parse(shared("cpu-only-nvtx", "pp_sim_cpuonly_export2023.4.sqlite"))
    trace = json_pairs[0][0]
    assert trace.format == "nsys-json" and trace.clock == "relative"
    assert any("no session start" in w for w in trace.warnings)
    start = sql_pairs[0][0].profiler["session_start_ns"]
    from_json = _all_events(json_pairs)[["rank", "name", "start_ns"]].sort_values(["rank", "start_ns", "name"])
    from_sql = _all_events(sql_pairs)[["rank", "name", "start_ns"]].sort_values(["rank", "start_ns", "name"])
    assert list(from_json["name"]) == list(from_sql["name"])
    assert ((from_sql["start_ns"].to_numpy() - from_json["start_ns"].to_numpy()) == start).all()


def test_rank_map_overrides_and_drops_unmapped_processes():
    path = shared("nsysai_mfu_2gpu_before.sqlite")
    pids = [t.profiler["pid"] for t, _ in _parse(path)]
    swapped = _parse(path, rank_map={pids[0]: 1, pids[1]: 0})
    assert {t.profiler["pid"]: t.rank for t, _ in swapped} == {pids[0]: 1, pids[1]: 0}
    assert {t.rank_source for t, _ in swapped} == {"rank_map"}
    partial = _parse(path, rank_map={pids[1]: 5})
    assert [t.rank for t, _ in partial] == [5]
    assert any("not in the rank map" in w for w in partial[0][0].warnings)


def test_read_only_and_nothing_written_beside(tmp_path):
    src = shared("nsysai_mock.sqlite")
    copy = tmp_path / "mock.sqlite"
    shutil.copyfile(src, copy)
    copy.chmod(0o444)
    before = copy.read_bytes()
    pairs = nsys.parse_nsys_sqlite(copy, 0)
    assert pairs[0][0].rank == -1  # one process, nothing says its rank: settled later
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mock.sqlite"]
    assert copy.read_bytes() == before


# --------------------------------------------------------------------------------------
# broken input: one line saying what and what to do
# --------------------------------------------------------------------------------------
def _one_line_error(path: Path, *words: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        nsys.parse_nsys_sqlite(path, 0)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message


def test_not_sqlite_is_one_line(tmp_path):
    path = tmp_path / "report.sqlite"
    path.write_text("this is not a database\n")
    _one_line_error(path, "not an SQLite file", "nsys export")


def test_sqlite_without_nsys_tables_is_one_line(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    _one_line_error(path, "not an Nsight Systems export")


def test_nsys_export_without_events_is_one_line(tmp_path):
    path = tmp_path / "empty.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        conn.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
        conn.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2024.1.1')")
    _one_line_error(path, "neither CUDA kernels nor NVTX ranges", "nsys profile")


@pytest.mark.parametrize("keep_bytes", [100, 1_000_000])
def test_truncated_sqlite_is_one_line(tmp_path, keep_bytes):
    src = shared("nsysai_mfu_2gpu_before.sqlite")
    path = tmp_path / "cut.sqlite"
    path.write_bytes(src.read_bytes()[:keep_bytes])
    _one_line_error(path, "damaged or truncated")


def test_truncated_json_export_keeps_complete_lines(tmp_path):
    src = shared("cpu-only-nvtx", "pp_sim_cpuonly_export2023.4.json")
    text = src.read_bytes()
    path = tmp_path / "cut.json"
    path.write_bytes(text[: int(len(text) * 0.6)])
    pairs = nsys.parse_nsys_json(path, 0)
    assert any("not JSON" in w for w in pairs[0][0].warnings)


def test_json_that_is_not_nsys_is_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[1, 2, 3\n")
    with pytest.raises(TraceFormatError) as info:
        nsys.parse_nsys_json(path, 0)
    assert "\n" not in str(info.value) and "nsys export --type json" in str(info.value)


# --------------------------------------------------------------------------------------
# the committed nsys capture
# --------------------------------------------------------------------------------------
def _all_text(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    texts = []
    try:
        tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for cell in row:
                    if isinstance(cell, bytes):
                        texts.append(cell.decode("latin-1"))
                    elif isinstance(cell, str):
                        texts.append(cell)
    finally:
        conn.close()
    return texts


def test_committed_nsys_sample_holds_no_private_data():
    report = SAMPLE / "nsys_report.sqlite"
    assert report.exists()
    texts = _all_text(report)
    for needle in PRIVATE:
        assert not any(needle in t for t in texts), needle
    raw = report.read_bytes().decode("latin-1")
    for needle in PRIVATE:
        assert needle not in raw, needle
    assert not list(SAMPLE.glob("*.nsys-rep")) and not list(SAMPLE.glob("*.qdstrm"))
    assert report.stat().st_size < 5_000_000


def test_committed_nsys_sample_reads_as_the_same_run_as_kineto():
    capture = json.loads((SAMPLE / "capture.json").read_text())
    kineto = json.loads((ROOT / "sample_traces" / "1f1b" / "capture.json").read_text())
    for key in ("schedule", "p", "v", "m", "steps", "compute", "seed"):
        if key == "compute":
            assert capture[key]["layer_ms"] == kineto[key]["layer_ms"]
        else:
            assert capture[key] == kineto[key], key
    run = read_run(SAMPLE)
    assert sorted(t.rank for t in run.files) == [0, 1, 2, 3]
    assert {t.rank_source for t in run.files} == {"NVTX rank marker"}
    assert {t.world_size for t in run.files} == {4}
    events = run.events
    for rank in range(4):
        mine = events[events["rank"] == rank]
        steps = mine.loc[mine["name"].str.startswith("ProfilerStep#"), "name"]
        assert sorted(steps) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
        sends = (mine["name"] == "c10d::send").sum()
        recvs = (mine["name"] == "c10d::recv_").sum()
        assert sends == (0 if rank == 3 else 24) + (0 if rank == 0 else 24)
        assert recvs == sends
        assert (mine["name"] == "gloo:recv").sum() == recvs
        backward = mine[mine["name"].str.startswith("autograd::engine::evaluate_function")]
        assert len(backward) > 0 and (backward["depth"] == 1).mean() > 0.99


# --------------------------------------------------------------------------------------
# scrubbing and a live capture
# --------------------------------------------------------------------------------------
def test_scrub_removes_environment_paths_and_other_processes(tmp_path):
    from tracekit.capture.nsys import scrub_report

    raw = tmp_path / "raw.sqlite"
    with sqlite3.connect(raw) as conn:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        conn.executemany(
            "INSERT INTO StringIds VALUES (?, ?)",
            [
                (1, "aten::mm, op_id = 1"),
                (2, "/root/.config/nsys-config.ini"),
                (3, "HOME=/root"),
                (4, "sshd"),
                (5, "python"),
            ],
        )
        conn.execute(
            "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT, "
            "globalTid INT, textId INT, domainId INT)"
        )
        conn.execute("INSERT INTO NVTX_EVENTS VALUES (1, 2, 59, NULL, ?, 1, 0)", ((42 << 24) + 42,))
        conn.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT, value TEXT)")
        conn.executemany(
            "INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
            [
                ("PROCESS_0:ENVIRONMENT_VARIABLE", 'PATH="/usr/bin"'),
                ("PROCESS_0:ARGUMENT_0", "--secret"),
                ("RATE_HZ", "0"),
            ],
        )
        conn.execute("CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT, value TEXT)")
        conn.executemany(
            "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?)",
            [
                ("DeviceEnvironment", "USER=me;HOME=/home/me"),
                ("Hostname", "my-laptop"),
                ("CpuCores", "2"),
            ],
        )
        conn.execute("CREATE TABLE PROCESSES (globalPid INT, pid INT, name TEXT)")
        conn.executemany(
            "INSERT INTO PROCESSES VALUES (?, ?, ?)", [(42 << 24, 42, "/opt/py/bin/python"), (7 << 24, 7, "sshd")]
        )
        conn.execute("CREATE TABLE ThreadNames (nameId INT, priority INT, globalTid INT)")
        conn.executemany("INSERT INTO ThreadNames VALUES (?, ?, ?)", [(5, 0, (42 << 24) + 42), (4, 0, (7 << 24) + 7)])
        conn.execute("CREATE TABLE OSRT_API (start INT, end INT, nameId INT)")
        conn.execute("CREATE TABLE ANALYSIS_FILE (id INT, filename TEXT)")
        conn.execute("INSERT INTO ANALYSIS_FILE VALUES (0, '/tmp/nvidia/stdout.log')")
    out = tmp_path / "clean.sqlite"
    removed = scrub_report(raw, out, {42})
    assert removed["other processes"] == 1
    texts = _all_text(out)
    for needle in PRIVATE + ("my-laptop", "sshd", "--secret", "/opt/py", "/tmp/"):
        assert not any(needle in t for t in texts), needle
    assert "aten::mm, op_id = 1" in texts and "RATE_HZ" in texts
    with sqlite3.connect(out) as conn:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "OSRT_API" not in tables and "ANALYSIS_FILE" not in tables
    assert raw.exists()  # the raw export is left alone (the caller deletes it)


def test_live_nsys_capture(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("nvtx")
    if shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems CLI) is not installed")
    from tracekit.capture.config import CaptureConfig
    from tracekit.capture.nsys import REPORT_NAME, run_nsys_capture

    cfg = CaptureConfig(schedule="GPipe", ranks=2, microbatches=2, steps=1, layers=4, layer_ms=1.0)
    out = run_nsys_capture(cfg, tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["capture.json", REPORT_NAME]
    capture = json.loads((out / "capture.json").read_text())
    assert capture["profiler"]["tool"] == "nsys" and capture["files"] == [REPORT_NAME]
    texts = _all_text(out / REPORT_NAME)
    for needle in PRIVATE + (str(tmp_path),):
        assert not any(needle in t for t in texts), needle
    run = read_run(out)
    assert sorted(t.rank for t in run.files) == [0, 1]
    names = set(run.events["name"])
    assert {"ProfilerStep#2", "Forward 0", "Backward 1", "c10d::send", "c10d::recv_", "gloo:recv"} <= names


def test_nsys_sample_gives_the_kineto_schedule_and_bubbles_within_two_points():
    """The same configuration captured under torch.profiler and under nsys: same schedule,
    bubble ratios within 2 points (run and every rank), messages matched in both."""
    from tracekit.analyze import analyze

    kineto = analyze(load(ROOT / "sample_traces" / "1f1b"))
    nsys = analyze(load(SAMPLE))
    k_sched, n_sched = kineto.run.schedule, nsys.run.schedule
    assert (n_sched.name, n_sched.p, n_sched.v, n_sched.m) == (k_sched.name, k_sched.p, k_sched.v, k_sched.m)
    assert abs(nsys.summary.bubble_ratio - kineto.summary.bubble_ratio) <= 0.02
    for rank, info in kineto.summary.per_rank.items():
        assert abs(nsys.summary.per_rank[rank].bubble_ratio - info.bubble_ratio) <= 0.02, rank
    assert len(nsys.run.messages) == len(kineto.run.messages) == 144


def test_mixed_folder_of_kineto_and_nsys_ranks(tmp_path):
    """Ranks 0-1 from the Kineto capture, ranks 2-3 from the nsys report (the other two
    processes in that report are left out with --rank-map): one run of four ranks."""
    import shutil

    run = tmp_path / "mixed"
    run.mkdir()
    for rank in (0, 1):
        shutil.copy(ROOT / "sample_traces" / "1f1b" / f"rank{rank}.json.gz", run)
    shutil.copy(SAMPLE / "nsys_report.sqlite", run)
    rank_of_pid = json.loads((SAMPLE / "capture.json").read_text())["profiler"]["rank_of_pid"]
    keep = {int(pid): rank for pid, rank in rank_of_pid.items() if rank in (2, 3)}
    loaded = load(run, LoadOptions(rank_map=keep))
    formats = {t.rank: t.format for t in loaded.files}
    assert formats == {0: "kineto", 1: "kineto", 2: "nsys-sqlite", 3: "nsys-sqlite"}
    assert sorted(loaded.events["rank"].unique().tolist()) == [0, 1, 2, 3]
    assert loaded.schedule is not None and loaded.schedule.p == 4
    assert any("not in the rank map" in w for w in loaded.warnings)
    # Kineto's sends carry tags, nsys's receives none: they still pair across formats
    cross = loaded.messages[(loaded.messages["src_rank"] == 1) & (loaded.messages["dst_rank"] == 2)]
    assert len(cross) == 24


def test_all_to_all_sendrecv_kernels_are_paired_as_collectives_with_the_reference_times():
    # The 2-GPU report's SendRecv kernels ran all_to_alls: tracekit pairs them as collectives
    # (never pipeline messages), with wait and transfer as tests/device_reference.py has them.
    import device_reference
    from tracekit import LoadOptions, load
    from tracekit.analyze import analyze

    path = shared("nsysai_mfu_2gpu_before.sqlite")
    run = load(path, LoadOptions(rows="analysis"))
    assert run.device_pairs.empty
    pairs = run.collective_pairs
    kernels = device_reference.nsys_reference(path).nccl_kernels
    expected = device_reference.kernel_pairs(
        *[[(k.start_ns, k.end_ns) for k in kernels if k.rank == r] for r in (0, 1)]
    )
    assert len(pairs) == len(expected) == 33
    assert set(pairs["direction"]) == {"collective"}
    assert pairs[
        ["send_start_ns", "send_end_ns", "recv_start_ns", "recv_end_ns", "wait_ns", "transfer_ns"]
    ].values.tolist() == [
        [p["start_a_ns"], p["end_a_ns"], p["start_b_ns"], p["end_b_ns"], p["wait_ns"], p["transfer_ns"]]
        for p in expected
    ]
    doc_device = analyze(run).device
    assert doc_device.pairs.empty


# --------------------------------------------------------------------------------------
# damage found by fuzzing real exports (issue #28)
# --------------------------------------------------------------------------------------
def _damaged_copy(tmp_path: Path, *sql: str) -> Path:
    """generated_: a copy of the real 2-GPU report with ``sql`` run on it, in a run folder."""
    from test_ingest_validation import generated_nsys

    return generated_nsys(tmp_path, *sql, source=shared("nsysai_mfu_2gpu_before.sqlite"))


def _analysis_json(path: Path) -> dict:
    result = CliRunner().invoke(main, ["analyze", str(path), "--json", "--no-cache", "--no-progress"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_a_table_that_is_a_view_over_the_same_rows_reads_the_same(tmp_path, table):
    """A view has no rowid: each row read as NULL (an internal TypeError before)."""
    reference = _analysis_json(shared("nsysai_mfu_2gpu_before.sqlite"))
    path = _damaged_copy(
        tmp_path, f"ALTER TABLE {table} RENAME TO raw_{table}", f"CREATE VIEW {table} AS SELECT * FROM raw_{table}"
    )
    doc = _analysis_json(path)
    assert doc["summary"] == reference["summary"] and doc["ranks"] == reference["ranks"]


@pytest.mark.parametrize(
    "table", ["CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_KERNEL"]
)
def test_times_before_the_capture_began_are_dropped_and_said_in_every_table(tmp_path, table):
    """start = -start made a memset span 120 s: the bubble 0.23 -> 0.000001 and the window
    0.6 s -> 293 s, without a word. Times count from the session start: none is negative."""
    reference = _analysis_json(shared("nsysai_mfu_2gpu_before.sqlite"))
    conn = sqlite3.connect(shared("nsysai_mfu_2gpu_before.sqlite"))
    (n_rows,) = conn.execute(f"SELECT count(*) FROM {table} WHERE rowid % 7 = 0").fetchone()
    conn.close()
    doc = _analysis_json(_damaged_copy(tmp_path, f"UPDATE {table} SET start = -start WHERE rowid % 7 = 0"))
    dropped = [w for w in doc["warnings"] if "cannot be real" in w]
    assert len(dropped) == 1 and f"{n_rows:,} with a time that is not a number" in dropped[0], doc["warnings"]
    window = sum(r["window_ns"] for r in doc["ranks"])
    assert window <= sum(r["window_ns"] for r in reference["ranks"])  # no 120 s span
    if table != "CUPTI_ACTIVITY_KIND_KERNEL":  # a seventh of the kernels dropped is busy time gone
        assert abs(doc["summary"]["bubble_ratio"] - reference["summary"]["bubble_ratio"]) < 0.05
