"""tracekit cache info|clear: what the parse cache holds, and removing tracekit's files only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main
from tracekit.commands.cache_contents import cache_usage, clear_cache
from tracekit.ingest import discover, parse_files
from tracekit.ingest.cache import ParseCache

KEY = "ab" + "0" * 62


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def filled(tmp_path) -> Path:
    """A cache folder filled by analysing sample_traces/1f1b (4 ranks) through the command (the
    run read in place: a fresh copy's files are too new for their digests to be trusted, and
    its analysis would not be kept)."""
    cache_dir = tmp_path / "cache"
    result = cli("analyze", SAMPLES / "1f1b", "--cache-dir", cache_dir, "--no-progress", "-j", "1")
    assert result.exit_code == 0, result.output
    return cache_dir


def _files(folder: Path) -> dict[str, int]:
    return {
        p.relative_to(folder).as_posix(): p.lstat().st_size for p in folder.rglob("*") if p.is_file() or p.is_symlink()
    }


def test_info_says_where_how_many_and_how_big(filled):
    stored = _files(filled)
    result = cli("cache", "info", "--cache-dir", filled)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"cache: {filled} (--cache-dir)"
    # 4 rank files parsed (an entry and a digest memo each) and the analysis document
    assert lines[1].startswith("  4 parsed files, 1 analysis, 4 file digests: ")
    usage = cache_usage(filled)
    assert usage.n_files == len(stored) == 9 and usage.bytes == sum(stored.values())
    assert usage.others == 0 and len(lines) == 2


def test_info_of_the_default_cache_and_of_none_yet(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "not-made-yet"))
    result = cli("cache", "info")
    assert result.exit_code == 0, result.output
    assert result.output == f"cache: {tmp_path / 'not-made-yet'} ($TRACEKIT_CACHE_DIR)\n  empty: nothing cached yet\n"
    assert not (tmp_path / "not-made-yet").exists()  # looking makes nothing


def test_clear_removes_tracekits_files_and_nothing_else(filled, tmp_path):
    outside = tmp_path / "precious.parquet"
    outside.write_text("the user's own")
    planted = {
        "notes.txt": "mine",  # beside the format folders
        "v1/entries/ab/readme.txt": "mine",  # inside, not an entry's name
        f"v1/entries/cd/{KEY}.parquet": "mine",  # an entry's name in the wrong folder
        f"backup/entries/ab/{KEY}.parquet": "mine",  # not under a format folder
        f"v1/hashes/{KEY}.json.bak": "mine",
    }
    for relative, text in planted.items():
        (filled / relative).parent.mkdir(parents=True, exist_ok=True)
        (filled / relative).write_text(text)
    link = filled / "v1" / "entries" / "ab" / f"{KEY}.parquet"  # an entry's name, but a link
    link.symlink_to(outside)
    leftover = filled / "v1" / "analyses" / "ab" / f"{KEY}.json.tmp-4242-0123abcd"  # a write cut short
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_text("{")
    before = cache_usage(filled)
    # notes.txt and backup/ at the top, three planted files and the link inside v1/
    assert before.files["temporary"] == 1 and before.others == 6

    result = cli("cache", "clear", "--cache-dir", filled)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        f"removed from the cache {filled}: 4 parsed files, 1 analysis, 4 file digests, 1 unfinished write: "
    )
    left = _files(filled)
    assert set(left) == set(planted) | {link.relative_to(filled).as_posix()}
    assert outside.read_text() == "the user's own" and link.is_symlink()
    assert not (filled / "v1" / "analyses").exists()  # emptied folders go too
    again = cli("cache", "clear", "--cache-dir", filled)
    assert again.exit_code == 0 and "nothing removed" in again.output


def test_a_cleared_cache_parses_again_and_fills_again(tmp_path, monkeypatch):
    from tracekit.ingest import file_task

    parsed = []
    real = file_task.parse_file
    monkeypatch.setattr(file_task, "parse_file", lambda path, *a, **k: parsed.append(path) or real(path, *a, **k))
    run, cache_dir = discover(SAMPLES / "1f1b"), str(tmp_path / "cache")
    for _ in range(2):
        parse_files(run, cache_dir=cache_dir, jobs=1)
    assert len(parsed) == 4  # the second load: all from the cache
    assert clear_cache(cache_dir).files["entries"] == 4
    parse_files(run, cache_dir=cache_dir, jobs=1)
    assert len(parsed) == 8 and cache_usage(cache_dir).files["entries"] == 4


def test_a_clear_during_a_write_costs_that_entry_only(tmp_path):
    """The writer holds its temporary open when clear removes it: the rename fails, the
    writer skips storing, and neither a half entry nor a temporary is left."""
    root = tmp_path / "cache"
    cache = ParseCache(root)
    target = cache.entry_path(KEY)

    def write_while_cleared(fh):
        fh.write(b"first half")
        assert clear_cache(root).files["temporary"] == 1
        fh.write(b"second half")

    cache.write_file(cache.entry_path("cd" + "1" * 62), b"an older entry")
    cache._write(target, write_while_cleared)
    assert not os.path.exists(target)
    assert cache_usage(root).n_files == 0 and not root.joinpath("v1").exists()


def test_an_entry_that_cannot_be_removed_is_one_line(filled, monkeypatch):
    real_unlink = os.unlink
    refused = []

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".json") and "/hashes/" in str(path) and not refused:
            refused.append(path)
            raise PermissionError(13, "Permission denied", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    result = cli("cache", "clear", "--cache-dir", filled)
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tracekit: error: cache {filled}: cannot remove {refused[0]} (Permission denied); removed "
    )
    assert os.path.exists(refused[0])


@pytest.mark.parametrize(
    "make_root, message",
    [
        (lambda d: (d / "file").write_text("x") and d / "file", "is a file, not a cache folder"),
        (lambda d: "nosuchscheme://bucket/cache", "not a cache location fsspec knows"),
    ],
)
def test_a_cache_dir_that_is_no_cache_is_one_line(tmp_path, make_root, message):
    for action in ("info", "clear"):
        result = cli("cache", action, "--cache-dir", make_root(tmp_path))
        assert result.exit_code == 2, result.output
        lines = result.output.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and message in lines[0], lines


def test_a_cache_url_through_fsspec():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = "memory://tracekit-cache-test"
    fs.pipe(
        {
            f"/tracekit-cache-test/v1/entries/ab/{KEY}.parquet": b"12345",
            f"/tracekit-cache-test/v1/hashes/{KEY}.json": b"{}",
            "/tracekit-cache-test/mine.txt": b"keep me",
        }
    )
    try:
        info = cli("cache", "info", "--cache-dir", root)
        assert info.exit_code == 0, info.output
        assert "1 parsed file, 1 file digest: 7 B" in info.output and "1 other file" in info.output
        cleared = cli("cache", "clear", "--cache-dir", root)
        assert cleared.exit_code == 0, cleared.output
        assert fs.cat("/tracekit-cache-test/mine.txt") == b"keep me"
        assert not fs.exists(f"/tracekit-cache-test/v1/entries/ab/{KEY}.parquet")
    finally:
        fs.rm("/tracekit-cache-test", recursive=True)
