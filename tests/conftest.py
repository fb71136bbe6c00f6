"""Shared test fixtures: where the project's sample runs and the shared real traces live."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
# Real traces from public projects live beside the checkout, never inside it.
SHARED_TRACES = ROOT.parent / "shared" / "real-traces"


def sample_runs() -> list[Path]:
    """Every captured Kineto sample run (a folder with capture.json and rank files)."""
    return sorted(
        p for p in SAMPLES.iterdir() if p.is_dir() and (p / "capture.json").is_file() and list(p.glob("rank*.json.gz"))
    )


def capture_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "capture.json").read_text())


def shared_or_skip(*parts: str) -> Path:
    path = SHARED_TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared real traces are not laid beside this checkout")
    return path


@contextmanager
def native_scanner(on: bool, chunk_bytes: int | None = None):
    """The native scanner on or off (TRACEKIT_NATIVE), and the Kineto stream's chunk size,
    for a block; both as they were after it."""
    from tracekit.ingest import kineto_stream

    saved_env, saved_chunk = os.environ.get("TRACEKIT_NATIVE"), kineto_stream.CHUNK_BYTES
    os.environ["TRACEKIT_NATIVE"] = "1" if on else "0"
    if chunk_bytes:
        kineto_stream.CHUNK_BYTES = chunk_bytes
    try:
        yield
    finally:
        kineto_stream.CHUNK_BYTES = saved_chunk
        if saved_env is None:
            del os.environ["TRACEKIT_NATIVE"]
        else:
            os.environ["TRACEKIT_NATIVE"] = saved_env


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Tests never read or write the user's ~/.cache/tracekit."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tracekit-cache"))


@pytest.fixture(scope="session")
def loaded_runs():
    """Each sample run loaded and analysed once for the whole session."""
    from tracekit import load
    from tracekit.analyze import analyze

    cache = {}

    def get(run_dir: Path):
        if run_dir not in cache:
            run = load(run_dir)
            cache[run_dir] = (run, analyze(run))
        return cache[run_dir]

    return get


@pytest.fixture(scope="module")
def dask_client():
    """An in-process Dask cluster (two workers, one thread each) for one test module."""
    distributed = pytest.importorskip(
        "distributed", reason="dask[distributed] is not installed (pip install 'tracekit[dask]')"
    )
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()
