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
    pid_s, tid_s = pid[order], tid[order]
    new_thread = np.empty(n, dtype=bool)
    new_thread[0] = True
    new_thread[1:] = (pid_s[1:] != pid_s[:-1]) | (tid_s[1:] != tid_s[:-1])
    # Plain Python lists: the loop below is ~2x faster on them than on numpy scalars.
    starts, ends = start[order].tolist(), end[order].tolist()
    fresh = new_thread.tolist()
    parent = [True] * n if transparent is None else (~np.asarray(transparent)[order]).tolist()
    out = [0] * n
    stack: list[int] = []
    for i in range(n):
        if fresh[i]:
            stack.clear()
        s, e = starts[i], ends[i]
        while stack and (s >= stack[-1] or e > stack[-1]):
            stack.pop()
        out[i] = len(stack)
        if parent[i]:
            stack.append(e)
    depth[order] = out
    return depth
