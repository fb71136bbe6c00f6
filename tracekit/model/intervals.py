"""Lengths of sets of time intervals (ns), shared by reconstruction and the analyses."""

from __future__ import annotations

import numpy as np


def union_length(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Total length of the union of [start, end) intervals clipped to [lo, hi)."""
    if len(starts) == 0:
        return 0
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    total = 0
    cur_s, cur_e = int(s[0]), int(e[0])
    for a, b in zip(s[1:], e[1:]):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = int(a), int(b)
        elif b > cur_e:
            cur_e = int(b)
    return total + (cur_e - cur_s)
