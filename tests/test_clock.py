"""Clock alignment across hosts, from message timing. The skewed runs here are copies of a
real sample run with two ranks' clocks moved on purpose (a generated fixture)."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from conftest import SAMPLES
from tracekit import load
from tracekit.analyze import analyze


def _skewed_copy(tmp_path, offset_ns: int, ranks=(2, 3), host="hostB"):
    dst = tmp_path / "skewed_1f1b"
    shutil.copytree(SAMPLES / "1f1b", dst)
    for rank in ranks:
        path = dst / f"rank{rank}.json.gz"
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["host_name"] = host
        doc["baseTimeNanoseconds"] += offset_ns
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


@pytest.mark.parametrize("offset_ns", [3_000_000, -40_000_000])
def test_skewed_host_is_realigned(tmp_path, offset_ns):
    original = analyze(load(SAMPLES / "1f1b"))
    run = load(_skewed_copy(tmp_path, offset_ns))
    notes = [w for w in run.warnings if "aligned clocks" in w]
    assert notes and "hostB" in notes[0]
    skewed = analyze(run)
    for rank, info in original.summary.per_rank.items():
        assert skewed.summary.per_rank[rank].bubble_ratio == pytest.approx(info.bubble_ratio, abs=0.01)
    # every message arrives after it was sent once aligned
    msgs = run.messages
    assert (msgs["recv_done_ns"] >= msgs["send_post_ns"]).all()


def test_one_host_needs_no_alignment():
    run = load(SAMPLES / "1f1b")
    assert not [w for w in run.warnings if "aligned clocks" in w]
