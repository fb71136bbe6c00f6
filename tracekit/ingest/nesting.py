"""Nesting depth of intervals on each thread, shared by every parser."""
from __future__ import annotations

import numpy as np


def nesting_depth(pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray,
                  transparent: np.ndarray | None = None) -> np.ndarray:
    """Depth of each interval within the intervals of its (pid, tid): 0 = top level.

    An interval is nested in another when it starts inside it and does not outlast it;
    intervals that merely overlap (ill-formed traces) are treated as siblings.
    ``transparent`` marks async spans (gloo's send/recv annotations run from posting to
    the wait's return, across unrelated ops): they get a depth but are nobody's parent.
    """
    n = len(start)
    depth = np.zeros(n, dtype=np.int16)
    if n == 0:
        return depth
    # Sort by thread, then start ascending, then longer first so parents precede children.
    order = np.lexsort((-(end - start), start, tid, pid))
    stack_ends: list[int] = []
    prev_key = None
    for idx in order:
        key = (pid[idx], tid[idx])
        if key != prev_key:
            stack_ends.clear()
            prev_key = key
        s, e = start[idx], end[idx]
        while stack_ends and (s >= stack_ends[-1] or e > stack_ends[-1]):
            stack_ends.pop()
        depth[idx] = len(stack_ends)
        if transparent is None or not transparent[idx]:
            stack_ends.append(e)
    return depth
