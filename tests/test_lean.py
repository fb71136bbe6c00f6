"""tracekit._lean: the command loads numpy without BLAS threads and leaves the environment as
it found it. Each check runs in a fresh interpreter (a module loads once a process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_LOAD = """
import os, sys
from tracekit._lean import numpy_with_one_blas_thread
if sys.argv[1] == "hooked":
    numpy_with_one_blas_thread()
import numpy as np
a = np.ones((200, 200))
a @ a  # BLAS at work: a pool started at load would be running now
print(len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
"""


def _threads_and_env(mode: str, **env: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, mode], capture_output=True, text=True, check=True, env={**base, **env}
    )
    threads, value = out.stdout.split()
    return int(threads), value


@pytest.fixture
def several_cores():
    if not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux and 2 or more cores: with one, BLAS starts no threads anyway")


def test_numpy_loads_without_blas_threads_and_the_environment_is_put_back(several_cores):
    plain, _ = _threads_and_env("plain")
    if plain < 2:
        pytest.skip("this numpy's BLAS starts no threads of its own: nothing to check")
    assert _threads_and_env("hooked") == (1, "unset")


def test_a_thread_count_the_user_set_is_kept(several_cores):
    assert _threads_and_env("hooked", OPENBLAS_NUM_THREADS="2") == (2, "2")
