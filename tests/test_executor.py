"""Where files are parsed: in process, in a local process pool, on a Dask cluster. Every
executor must give exactly the rows of the plain in-process parse."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit.cli import main
from tracekit.errors import TraceFormatError, TracekitError
from tracekit import LoadOptions, load
from tracekit.ingest import discover, parse_files


def _mixed_run(tmp_path: Path) -> Path:
    """A copy of a 4-rank sample run."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    return run


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a[1], b[1])
    assert [f.describe() for f in a[0]] == [f.describe() for f in b[0]]


def test_process_pool_equals_in_process(tmp_path):
    paths = discover(_mixed_run(tmp_path))
    serial = parse_files(paths, jobs=1)
    done = []
    pooled = parse_files(paths, jobs=2, progress=done.append)
    _same(serial, pooled)
    assert sorted(done) == sorted(paths)


def test_pool_handles_gpu_traces_and_nsys_reports(tmp_path):
    gpu = shared_or_skip("kineto-gpu", "hta_trace_filter_sampled_rank-0.json.gz")
    nsys = shared_or_skip("nsys", "nsysai_mock.sqlite")
    paths = [gpu, nsys, SAMPLES / "1f1b" / "rank1.json.gz"]
    _same(parse_files(paths, jobs=1), parse_files(paths, jobs=3))


def test_bytes_read_adds_up_to_the_input_size(tmp_path):
    paths = discover(_mixed_run(tmp_path))
    total = sum(p.stat().st_size for p in paths)
    for jobs in (1, 2):
        seen = []
        parse_files(paths, jobs=jobs, bytes_read=seen.append)
        assert sum(seen) == total, jobs


def test_a_bad_file_in_the_pool_is_one_clear_error(tmp_path):
    run = _mixed_run(tmp_path)
    (run / "rank9.json").write_bytes(b"this is not json at all")
    with pytest.raises(TraceFormatError) as err:
        parse_files(discover(run), jobs=2)
    assert "rank9.json" in str(err.value) and "\n" not in str(err.value)


def test_bad_executor_options_are_refused(tmp_path):
    paths = discover(_mixed_run(tmp_path))
    with pytest.raises(TracekitError, match="--executor"):
        parse_files(paths, executor="spark")
    with pytest.raises(TracekitError, match="--jobs"):
        parse_files(paths, jobs=0)
    result = CliRunner().invoke(main, ["analyze", str(SAMPLES / "1f1b"), "--scheduler", "tcp://x:1"])
    assert result.exit_code == 2 and "--executor dask" in result.stderr


def test_cli_jobs_do_not_change_the_analysis(tmp_path):
    run = _mixed_run(tmp_path)
    runner = CliRunner()
    one = runner.invoke(main, ["analyze", str(run), "--json", "--no-cache", "-j", "1"])
    two = runner.invoke(main, ["analyze", str(run), "--json", "--no-cache", "--jobs", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert one.stdout == two.stdout


def test_dask_executor_equals_local(tmp_path, dask_client):
    paths = discover(_mixed_run(tmp_path))
    _same(parse_files(paths, jobs=1), parse_files(paths, executor="dask", scheduler=dask_client))


def test_dask_by_scheduler_address_with_a_shared_cache(tmp_path, dask_client):
    run = _mixed_run(tmp_path)
    cache = tmp_path / "shared-cache"
    address = dask_client.scheduler.address
    first = load(run, LoadOptions(executor="dask", scheduler=address, cache_dir=str(cache)))
    assert len(list(cache.rglob("*.parquet"))) == 4  # written by the workers
    second = load(run, LoadOptions(executor="dask", scheduler=address, cache_dir=str(cache)))
    local = load(run, LoadOptions(jobs=1))
    pd.testing.assert_frame_equal(first.events, local.events)
    pd.testing.assert_frame_equal(second.events, local.events)
    pd.testing.assert_frame_equal(second.actions, local.actions)
    assert second.schedule.to_dict() == local.schedule.to_dict()


def test_parser_workers_never_import_pandas_or_pyarrow(tmp_path):
    """Pool workers fork before the parent loads pandas; the parse path (and a cache miss)
    must not load it either, or every worker pays ~75 MB and 0.4 s for it."""
    import subprocess
    import sys

    run = _mixed_run(tmp_path)
    code = (
        "import sys\n"
        "from tracekit.ingest.file_task import IngestTask, parse_one\n"
        f"task = IngestTask({str(run / 'rank1.json.gz')!r}, 0, cache_dir={str(tmp_path / 'cache')!r})\n"
        "parsed, pending = parse_one(task)\n"
        "assert len(parsed[0][1]) > 1000 and pending is not None\n"
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_pool_fills_the_cache_from_the_parent(tmp_path):
    """Workers hand their rows back; the parent writes the entries; the next load is all hits."""
    from tracekit.ingest.cache import ParseCache

    paths = discover(_mixed_run(tmp_path))
    cache = tmp_path / "cache"
    first = parse_files(paths, jobs=2, cache_dir=str(cache))
    assert len(list(cache.rglob("*.parquet"))) == len(paths)
    assert not list(cache.rglob("*.tmp-*"))
    for file_id, path in enumerate(paths):
        assert ParseCache(cache).lookup(path, {"rank_pattern": None, "rank_map": None}, file_id).parsed is not None
    _same(first, parse_files(paths, jobs=2, cache_dir=str(cache)))


def test_the_parent_imports_what_the_caller_needs_while_the_workers_parse(tmp_path):
    """``warm_up`` modules are imported by the parent while its workers parse: before its
    own first parse when the queue holds two files per core (4 files, 2 jobs), so that
    import is not left for after the last file; not at all without a pool."""
    import subprocess
    import sys

    run = _mixed_run(tmp_path)
    code = (
        "import sys\n"
        "import tracekit.ingest.file_task as ex\n"
        "from tracekit.ingest import discover, parse_files\n"
        "seen = []\n"
        "real = ex.parse_one\n"
        "def spy(task, *args, **kwargs):\n"
        "    seen.append('email.mime.text' in sys.modules)\n"
        "    return real(task, *args, **kwargs)\n"
        "ex.parse_one = spy\n"
        f"paths = discover({str(run)!r})\n"
        "jobs = int(sys.argv[1])\n"
        "parse_files(paths, jobs=jobs, warm_up=('email.mime.text',))\n"
        "print(len(seen), all(seen), any(seen), 'email.mime.text' in sys.modules)\n"
    )
    # every file the parent parsed came after the import (it may parse none: the worker can
    # end all four while the parent imports, on a busy machine)
    pooled = subprocess.run([sys.executable, "-c", code, "2"], capture_output=True, text=True, check=True)
    assert pooled.stdout.split()[1:] == ["True", str(bool(int(pooled.stdout.split()[0]))), "True"]
    alone = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, check=True)
    assert alone.stdout.split() == ["4", "False", "False", "False"]


def test_a_worker_socket_holds_a_whole_answer_as_far_as_the_system_allows():
    """The worker's end of its socket is given room for a GPU rank's ~0.8 MB answer (so the
    worker never waits mid-send for the parent to drain it); a pipe is left as it is."""
    import multiprocessing
    import os
    import socket

    from tracekit.ingest.pool import ANSWER_BUFFER, _room_for_answers

    here, there = multiprocessing.Pipe(duplex=True)
    try:
        probe = socket.socket(fileno=os.dup(there.fileno()))
    except OSError:
        pytest.skip("this platform's pipes are no sockets")
    before = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    _room_for_answers(there)
    after = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    probe.close()
    try:
        cap = int(open("/proc/sys/net/core/wmem_max").read())
    except OSError:
        cap = None
    if cap is not None and cap <= before:
        pytest.skip(f"net.core.wmem_max ({cap}) allows no more than the default ({before})")
    assert after > before
    assert after >= min(ANSWER_BUFFER, cap or ANSWER_BUFFER)
    here.close()
    there.close()
    reader, writer = multiprocessing.Pipe(duplex=False)
    _room_for_answers(writer)  # no socket: nothing to do, no error
    writer.send("still works")
    assert reader.recv() == "still works"
