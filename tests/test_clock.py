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


def test_shift_ranks_moves_times_and_leaves_markers():
    """A rank's offset comes off its times; a marker (-1: "no launch recorded") is no time
    and stays -1 (it became -1 - offset: a bogus time, positive for a negative offset)."""
    import pandas as pd

    from tracekit.reconstruct.clock import shift_ranks

    frame = pd.DataFrame({"rank": [0, 1, 1, 3], "launch_ns": [10, -1, 500, -1], "end_ns": [20, 30, 600, 40]})
    shifted = shift_ranks(frame, {1: 100, 3: -2_000}, "rank", ["launch_ns"], unset=-1)
    assert shifted["launch_ns"].tolist() == [10, -1, 400, -1]
    assert shifted["end_ns"].tolist() == [20, 30, 600, 40]  # a column not named is not moved
    plain = shift_ranks(frame, {1: 100, 3: -2_000}, "rank", ["end_ns"])
    assert plain["end_ns"].tolist() == [20, -70, 500, 2_040]
    assert frame["launch_ns"].tolist() == [10, -1, 500, -1]  # the input is left as it was
