"""tracekit._heap: the command's heap keeps its freed top for the next file's allocations.

Each check runs in a fresh interpreter: the setting lasts for the life of a process."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Rounds of 400 arrays of 64 KB (under glibc's mmap threshold, so from the heap), as a
# parse's per-run columns are; the minor page faults of the rounds after the first.
_ROUNDS = """
import resource, sys
import numpy as np
from tracekit._heap import keep_heap
kept = keep_heap() if sys.argv[1] == "keep" else None
def one_round():
    arrays = [np.ones(8_000, dtype=np.int64) for _ in range(400)]
    del arrays
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_round()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    return kept, int(faults)


def test_freed_heap_is_reused_without_faulting_it_in_again():
    kept, with_keep = _faults("keep")
    if kept != "True":
        pytest.skip("not glibc on Linux (or MALLOC_TOP_PAD_ is set): the allocator is left as it is")
    _, without = _faults("default")
    assert without > 5_000, "glibc gave the heap's top back between rounds: the baseline this test needs"
    assert with_keep < without / 10, (with_keep, without)


def test_a_top_pad_the_user_set_is_left_alone(monkeypatch):
    from tracekit._heap import keep_heap

    monkeypatch.setenv("MALLOC_TOP_PAD_", "65536")
    assert keep_heap() is False
