"""Keep the command-line process's freed heap for its next parse instead of handing it back.

Parsing a trace allocates and frees tens of MB over and over: the scanner's per-run
columns, Python objects, numpy temporaries. Allocations under glibc's mmap threshold come
from the heap, and whenever more than 128 KB lies free at its top glibc gives that back to
the kernel, so the next file's allocations fault the same pages in again, zero-filled: 8
GPU ranks of 26 MB took ~70k page faults and ~0.2 s of kernel time on a 2-core machine, a
fifth of the analysis' CPU. Keeping 32 MB of padding at the top of the heap (glibc's
``M_TOP_PAD``) leaves those pages mapped from one file to the next: ~28k faults, ~0.1 s of
kernel time less (``benchmarks/README.md``). Nothing else about the allocator is changed.

The cost: each process may hold up to 32 MB of freed memory it would have given back, only
while it runs. Only the ``tracekit`` command asks for this (a library user's process keeps
its allocator as configured), only with glibc, and never over a ``MALLOC_TOP_PAD_`` the
user set. Forked parser workers inherit it; a program tracekit starts (``capture``) does not.
"""

from __future__ import annotations

import ctypes
import os
import sys

TOP_PAD = 32 << 20  # bytes of free heap kept at its top between frees
_M_TOP_PAD = -2  # glibc malloc.h


def keep_heap() -> bool:
    """Ask glibc to keep :data:`TOP_PAD` bytes at the top of the heap; whether it took."""
    if not sys.platform.startswith("linux") or "MALLOC_TOP_PAD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on
    except (OSError, AttributeError):  # musl, or no libc found: its allocator as it is
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_TOP_PAD, TOP_PAD) == 1
