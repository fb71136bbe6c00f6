"""A capture's files are written whole or not at all (tracekit.capture.files)."""

from __future__ import annotations

import gzip

import pytest

from tracekit.capture.files import gzip_file, write_text
from tracekit.errors import TracekitError


def test_gzip_file_round_trips_and_leaves_no_temporary(tmp_path):
    src = tmp_path / "rank0.json"
    src.write_bytes(b'{"traceEvents": []}' * 1000)
    gz = tmp_path / "rank0.json.gz"
    gzip_file(src, gz)
    assert gzip.decompress(gz.read_bytes()) == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank0.json.gz"]


def test_gzip_file_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(b"earlier capture")
    with pytest.raises(FileNotFoundError):
        gzip_file(tmp_path / "missing.json", gz)
    assert gz.read_bytes() == b"earlier capture"
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.json.gz"]


def test_write_text_refuses_a_folder_in_one_line(tmp_path):
    (tmp_path / "capture.json").mkdir()
    with pytest.raises(TracekitError, match="capture.json: is a folder"):
        write_text(tmp_path / "capture.json", "{}")
    write_text(tmp_path / "losses.json", "[1.0]")
    assert (tmp_path / "losses.json").read_text() == "[1.0]"
