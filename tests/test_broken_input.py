"""Broken input never ends in a traceback: damaged copies of a real sample trace (a
generated fixture) either analyse, with a warning where data was lost, or fail with one
line and exit status 2."""

from __future__ import annotations

import gzip
import random
import shutil

import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit.cli import main


def _damage(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "truncate":
        return data[: rng.randrange(1, len(data))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if how == "splice":  # a chunk cut out of the middle
        a = rng.randrange(len(data))
        b = min(len(data), a + rng.randrange(1, 5000))
        return data[:a] + data[b:]
    raise ValueError(how)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("layer", ["json", "gzip"])
def test_damaged_trace_is_read_or_refused_in_one_line(tmp_path, seed, layer):
    rng = random.Random(seed)
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "gpipe", run)
    victim = run / f"rank{rng.randrange(4)}.json.gz"
    how = ("truncate", "flip", "splice")[seed % 3]
    if layer == "json":
        victim.write_bytes(gzip.compress(_damage(gzip.decompress(victim.read_bytes()), how, rng)))
    else:
        victim.write_bytes(_damage(victim.read_bytes(), how, rng))
    result = CliRunner().invoke(main, ["analyze", str(run), "--no-progress", "--no-cache"])
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 2), (how, result.output[-500:], result.exception)
    if result.exit_code == 2:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("tracekit: error:") and victim.name in lines[0]
