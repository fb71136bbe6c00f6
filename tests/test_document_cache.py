"""A second `tracekit analyze` of an unchanged run is answered from the stored document;
anything that could change the answer misses; the answer names the run it is asked about;
a stored document that is not exactly what was stored is recomputed, never trusted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main
from tracekit.ingest import cache as cache_mod


def _analyze(*args: str) -> str:
    # One job: _copy's monkeypatched _RACY_NS must hold where the digests are taken, and pool
    # workers that an earlier test left running (a fork server) would not see it.
    result = CliRunner().invoke(main, ["analyze", *args, "--no-progress", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    return result.output


def _stored(cache: Path) -> list[Path]:
    return sorted(cache.rglob("analyses/*/*.json"))


def _parse_entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("entries/*/*.parquet"))


def _copy(name: str, where: Path, monkeypatch) -> Path:
    """A copy of a sample run whose digests are trusted at once: a file changed within the
    last second is otherwise hashed again on every run (test_cache tests that wait)."""
    monkeypatch.setattr(cache_mod, "_RACY_NS", 0)
    shutil.copytree(SAMPLES / name, where)
    return where


def test_unchanged_run_is_served_from_the_stored_document(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    first = _analyze(str(SAMPLES / "gpipe"), "--json")
    assert len(_stored(cache)) == 1 and _parse_entries(cache)
    # served from the document, the second run parses nothing: no parse entry comes back
    for entry in _parse_entries(cache):
        entry.unlink()
    assert _analyze(str(SAMPLES / "gpipe"), "--json") == first
    assert _parse_entries(cache) == []
    # other options are another analysis
    _analyze(str(SAMPLES / "gpipe"), "--json", "--no-attribution")
    assert len(_stored(cache)) == 2


def test_a_copy_of_a_run_is_answered_with_its_own_paths(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    original = _copy("gpipe", tmp_path / "original", monkeypatch)
    copy = _copy("gpipe", tmp_path / "elsewhere" / "copy", monkeypatch)
    computed = json.loads(_analyze(str(original), "--json"))
    stored_bytes = _stored(cache)[0].read_bytes()
    assert str(original).encode() not in stored_bytes, "the stored document names a folder"
    served = json.loads(_analyze(str(copy), "--json"))
    assert len(_stored(cache)) == 1, "the copy was analysed again instead of sharing the analysis"
    assert served["source"] == str(copy)
    assert [f["path"] for f in served["files"]] == [str(copy / f"rank{r}.json.gz") for r in range(4)]
    for doc in (computed, served):
        doc.pop("source")
        for described in doc["files"]:
            described.pop("path")
    assert served == computed


def test_an_altered_document_is_recomputed_and_rewritten(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    first = _analyze(str(SAMPLES / "gpipe"), "--json")
    stored = _stored(cache)[0]
    good = stored.read_bytes()
    # a plausible lie: the same document with another bubble ratio, checksum line kept
    altered = good.replace(b'"schedule": {"name": "GPipe"', b'"schedule": {"name": "1F1B"', 1)
    assert altered != good
    stored.write_bytes(altered)
    assert _analyze(str(SAMPLES / "gpipe"), "--json") == first
    assert stored.read_bytes() == good, "the altered document was not replaced"


def test_a_truncated_document_is_recomputed_and_rewritten(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    first = _analyze(str(SAMPLES / "gpipe"))
    stored = _stored(cache)[0]
    good = stored.read_bytes()
    for damaged in (good[: len(good) // 2], b"", b"{ truncated"):
        stored.write_bytes(damaged)
        assert _analyze(str(SAMPLES / "gpipe")) == first
        assert stored.read_bytes() == good


def test_no_cache_stores_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    _analyze(str(SAMPLES / "gpipe"), "--no-cache")
    assert not _stored(cache)


def test_a_freshly_changed_trace_is_never_served_stale(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    run = _copy("gpipe", tmp_path / "run", monkeypatch)
    before = json.loads(_analyze(str(run), "--json"))
    (run / "rank3.json.gz").unlink()
    after = json.loads(_analyze(str(run), "--json"))
    assert before["summary"]["n_ranks"] == 4 and after["summary"]["n_ranks"] == 3


def test_a_stray_file_added_later_is_reported_not_served_stale(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    run = _copy("gpipe", tmp_path / "run", monkeypatch)
    _analyze(str(run), "--json")
    assert len(_stored(cache)) == 1
    (run / "config.json").write_text('{"lr": 0.1}')
    warnings = json.loads(_analyze(str(run), "--json"))["warnings"]
    assert any("config.json" in w for w in warnings)


@pytest.mark.parametrize("inside", [".", "cache", ".hidden/cache"])
def test_a_cache_inside_the_run_folder_is_refused(tmp_path, inside):
    """Found by fuzz/ (replay 7:1): --cache-dir pointing into the run wrote v1/ there."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", run)
    before = sorted(p.name for p in run.iterdir())
    result = CliRunner().invoke(main, ["analyze", str(run), "--cache-dir", str(run / inside)])
    assert result.exit_code == 2 and "inside the run folder" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == before
