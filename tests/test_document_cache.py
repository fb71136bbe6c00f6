"""A second `tracekit analyze` of an unchanged run is answered from the stored document;
anything that could change the answer misses."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main


def _analyze(*args: str) -> str:
    result = CliRunner().invoke(main, ["analyze", *args, "--no-progress"])
    assert result.exit_code == 0, result.output
    return result.output


def _stored(cache: Path) -> list[Path]:
    return sorted(cache.rglob("analyses/*/*.json"))


def test_unchanged_run_is_served_from_the_stored_document(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    first = _analyze(str(SAMPLES / "gpipe"), "--json")
    assert len(_stored(cache)) == 1
    # the stored document is what the second run prints: spoil it and the spoiled copy shows
    stored = _stored(cache)[0]
    doc = json.loads(stored.read_text())
    assert doc == json.loads(first)
    doc["source"] = "served-from-cache"
    stored.write_text(json.dumps(doc))
    assert json.loads(_analyze(str(SAMPLES / "gpipe"), "--json"))["source"] == "served-from-cache"
    # other options are another analysis
    _analyze(str(SAMPLES / "gpipe"), "--json", "--no-attribution")
    assert len(_stored(cache)) == 2


def test_unreadable_document_is_recomputed(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    first = _analyze(str(SAMPLES / "gpipe"))
    _stored(cache)[0].write_text("{ truncated")
    assert _analyze(str(SAMPLES / "gpipe")) == first


def test_no_cache_stores_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    _analyze(str(SAMPLES / "gpipe"), "--no-cache")
    assert not _stored(cache)


def test_a_freshly_changed_trace_is_never_served_stale(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache))
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "gpipe", run)
    before = json.loads(_analyze(str(run), "--json"))
    (run / "rank3.json.gz").unlink()
    after = json.loads(_analyze(str(run), "--json"))
    assert before["summary"]["n_ranks"] == 4 and after["summary"]["n_ranks"] == 3
