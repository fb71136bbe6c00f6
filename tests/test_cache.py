"""The parse cache: a second load reads it instead of parsing; a corrupt, stale or foreign
entry is rebuilt, never trusted; entries appear whole (temporary file + rename)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main
from tracekit.ingest import cache as cache_mod
from tracekit.ingest import discover, file_task, parse_files
from tracekit.ingest.cache import ParseCache


@pytest.fixture
def run_dir(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(SAMPLES / "1f1b", dst)
    return dst


@pytest.fixture
def parse_counter(monkeypatch):
    """Counts the files actually parsed (cache hits never reach the parser)."""
    parsed = []
    real = file_task.parse_file

    def counting(path, *args, **kwargs):
        parsed.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(file_task, "parse_file", counting)
    return parsed


def _load(run_dir: Path, cache_dir: Path, **kwargs):
    return parse_files(discover(run_dir), cache_dir=str(cache_dir), jobs=1, **kwargs)


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*.parquet"))


def _same(a, b) -> None:
    files_a, events_a = a
    files_b, events_b = b
    pd.testing.assert_frame_equal(events_a, events_b)
    assert [f.describe() for f in files_a] == [f.describe() for f in files_b]


def test_second_load_reads_the_cache_not_the_traces(run_dir, tmp_path, parse_counter):
    cache_dir = tmp_path / "cache"
    first = _load(run_dir, cache_dir)
    assert len(parse_counter) == 4 and len(_entries(cache_dir)) == 4
    second = _load(run_dir, cache_dir)
    assert len(parse_counter) == 4, "a cached file was parsed again"
    _same(first, second)
    _same(first, parse_files(discover(run_dir), jobs=1))  # and equal to no cache at all


def _silently_wrong(data: bytearray) -> bytearray:
    """The entry with one bit flipped where Parquet still decodes, to different values."""
    original = pq.read_table(io.BytesIO(bytes(data)))
    for pos in range(len(data) // 4, len(data) - 1000, 101):
        damaged = bytearray(data)
        damaged[pos] ^= 0x01
        try:
            table = pq.read_table(io.BytesIO(bytes(damaged)), page_checksum_verification=False)
        except Exception:
            continue
        if not table.equals(original):
            return damaged
    raise AssertionError("found no silent corruption to test with")


@pytest.mark.parametrize("damage", ["flip-bit", "truncate", "empty", "not-parquet"])
def test_corrupt_entry_is_rebuilt_with_no_wrong_answer(run_dir, tmp_path, parse_counter, damage):
    cache_dir = tmp_path / "cache"
    reference = _load(run_dir, cache_dir)
    victim = _entries(cache_dir)[0]
    data = bytearray(victim.read_bytes())
    if damage == "flip-bit":  # decodes fine into wrong numbers: only page checksums tell
        data = _silently_wrong(data)
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"PAR1 not really")
    victim.write_bytes(bytes(data))
    parse_counter.clear()
    again = _load(run_dir, cache_dir)
    assert len(parse_counter) == 1, "the damaged entry was not rebuilt (or others were)"
    _same(reference, again)
    parse_counter.clear()
    _same(reference, _load(run_dir, cache_dir))
    assert parse_counter == [], "the rebuilt entry is not used"


def test_entry_with_altered_file_facts_is_rebuilt(run_dir, tmp_path, parse_counter):
    """Parquet's checksums cover the pages, not the footer where the file facts are: an
    entry rewritten whole with another rank in its facts is still refused."""
    import json

    cache_dir = tmp_path / "cache"
    reference = _load(run_dir, cache_dir)
    for victim in _entries(cache_dir):
        table = pq.read_table(victim)
        meta = json.loads(table.schema.metadata[b"tracekit"])
        meta["files"][0]["rank"] += 10
        pq.write_table(
            table.replace_schema_metadata({b"tracekit": json.dumps(meta).encode()}), victim, write_page_checksum=True
        )
    parse_counter.clear()
    _same(reference, _load(run_dir, cache_dir))
    assert len(parse_counter) == 4, "an entry with altered facts was trusted"


def test_changed_file_misses_even_with_the_same_size_and_mtime(run_dir, tmp_path, parse_counter):
    cache_dir = tmp_path / "cache"
    _load(run_dir, cache_dir)
    donor, victim = run_dir / "rank3.json.gz", run_dir / "rank1.json.gz"
    stat = victim.stat()
    victim.write_bytes(donor.read_bytes()[: stat.st_size].ljust(stat.st_size, b"\0"))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a stale-looking stamp
    parse_counter.clear()
    files, events = _load(run_dir, cache_dir)
    assert parse_counter == ["rank1.json.gz"]
    fresh = parse_files([victim], jobs=1)
    assert files[1].describe() == fresh[0][0].describe()


def test_options_and_file_name_are_part_of_the_key(run_dir, tmp_path, parse_counter):
    cache_dir = tmp_path / "cache"
    _load(run_dir, cache_dir)
    parse_counter.clear()
    files, _ = _load(run_dir, cache_dir, rank_pattern=r"rank(\d+)")
    assert len(parse_counter) == 4 and {f.rank_source for f in files} == {"--rank-from"}
    (run_dir / "rank2.json.gz").rename(run_dir / "worker-2.json.gz")
    parse_counter.clear()
    files, _ = _load(run_dir, cache_dir)
    assert parse_counter == ["worker-2.json.gz"]
    assert str(files[-1].path).endswith("worker-2.json.gz")


def test_entries_are_written_to_a_temporary_name_then_renamed(run_dir, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    renames = []
    real_replace = os.replace

    def recording_replace(src, dst):
        src, dst = str(src), str(dst)
        assert not os.path.exists(dst), "an entry was overwritten in place"
        assert os.path.dirname(src) == os.path.dirname(dst) and ".tmp-" in src
        renames.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(cache_mod.os, "replace", recording_replace)
    _load(run_dir, cache_dir)
    entries = [str(p) for p in _entries(cache_dir)]
    assert entries and set(entries) <= set(renames)
    assert not list(cache_dir.rglob("*.tmp-*"))


def test_a_write_that_fails_midway_leaves_no_entry(run_dir, tmp_path, monkeypatch, parse_counter):
    cache_dir = tmp_path / "cache"

    def failing_write(table, where, **kwargs):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    import pyarrow.parquet as pq

    monkeypatch.setattr(pq, "write_table", failing_write)
    reference = _load(run_dir, cache_dir)
    assert _entries(cache_dir) == [] and not list(cache_dir.rglob("*.tmp-*"))
    monkeypatch.undo()
    _same(reference, parse_files(discover(run_dir), jobs=1))


def test_memo_is_not_trusted_for_a_file_written_just_now(run_dir, tmp_path):
    cache = ParseCache(tmp_path / "cache")
    path = run_dir / "rank0.json.gz"
    path.write_bytes(path.read_bytes())  # changed this instant
    first = cache.lookup(path, {}, 0)
    assert first.key is not None and first.parsed is None
    assert cache.lookup(path, {}, 0, hash_file=False).key is None  # racy: hash again
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 5_000_000_000))
    assert cache.lookup(path, {}, 0).key == first.key


def test_cache_root_can_be_an_fsspec_url(run_dir, tmp_path, parse_counter):
    pytest.importorskip("fsspec")
    url = (tmp_path / "remote").as_uri()  # file:///...: goes through fsspec
    first = parse_files(discover(run_dir), cache_dir=url, jobs=1)
    parse_counter.clear()
    second = parse_files(discover(run_dir), cache_dir=url, jobs=1)
    assert parse_counter == []
    _same(first, second)
    assert len(_entries(tmp_path / "remote")) == 4


def test_cli_caches_in_the_cache_dir_never_beside_the_traces(run_dir, tmp_path, monkeypatch):
    cache_dir = tmp_path / "home-cache"
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(cache_dir))
    before = sorted(p.name for p in run_dir.iterdir())
    runner = CliRunner()
    first = runner.invoke(main, ["analyze", str(run_dir), "--json"])
    second = runner.invoke(main, ["analyze", str(run_dir), "--json"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output
    assert first.stdout == second.stdout
    assert len(_entries(cache_dir)) == 4
    assert sorted(p.name for p in run_dir.iterdir()) == before
    other = tmp_path / "other"
    result = runner.invoke(main, ["analyze", str(run_dir), "--json", "--no-cache", "--cache-dir", str(other)])
    assert result.exit_code == 0 and result.stdout == first.stdout and not other.exists()


# Imported by the parsers but deciding no row: the package roots, error classes, and the
# version (which is a part of the key by itself).
_NOT_PARSER_CODE = {"tracekit", "tracekit.errors", "tracekit.version", "tracekit.model"}


def test_code_fingerprint_covers_every_module_the_parsers_load():
    """A parser split across files must not leave one outside the fingerprint: a change
    there would meet rows parsed by the old code."""
    program = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from tracekit.ingest.file_task import parse_file\n"
        "for i, p in enumerate(sys.argv[1:]):\n"
        "    parse_file(Path(p), i, None, None)\n"
        "print(json.dumps({m: getattr(sys.modules[m], '__file__', None) for m in sys.modules "
        "if m.startswith('tracekit')}))\n"
    )
    files = [SAMPLES / "nsys_1f1b" / "nsys_report.sqlite", sorted((SAMPLES / "1f1b").glob("rank*.json*"))[0]]
    out = subprocess.run(
        [sys.executable, "-c", program, *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    loaded = {
        name: Path(f).resolve() for name, f in json.loads(out.stdout).items() if f and name not in _NOT_PARSER_CODE
    }
    covered = set(cache_mod.fingerprint_sources())
    assert "tracekit.ingest.kineto_rows" in loaded and "tracekit.ingest.nsys" in loaded
    # a compiled module (the native scanner) is covered by its C source beside it
    loaded = {
        name: f.with_name(f.name.split(".")[0] + ".c") if f.suffix in (".so", ".pyd") else f
        for name, f in loaded.items()
    }
    assert {name for name, f in loaded.items() if f not in covered} == set()
