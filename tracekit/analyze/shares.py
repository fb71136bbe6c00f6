"""Shares of a whole (bubble ratios, cause shares, costs): the one place they are divided.

Every share tracekit reports is a part of a whole it lies inside (idle inside a window, a
cause's idle inside all idle), so it is in [0, 1] by construction. Inputs that break the
construction (a window that ends before it starts, a part larger than its whole) would
print a ratio such as 130% or -4%; :func:`share` refuses them instead, in one line that
names what was being divided.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tracekit.errors import TracekitError


class ShareError(TracekitError):
    """A share would fall outside [0, 1]: the inputs contradict each other."""


def share(part: float, whole: float, what: str) -> float:
    """``part / whole`` (0 for an empty whole); a :class:`ShareError` unless 0 <= part <= whole."""
    if whole <= 0 and part == 0:
        return 0.0
    if not 0 <= part <= whole:
        raise ShareError(
            f"{what} would be {part:.0f} of {whole:.0f} ns, not a share between 0 and 1 "
            "(the trace's clocks or step marks contradict each other); check the traces' "
            "timestamps, or report it if they look right"
        )
    return float(part / whole)


def shares(parts: np.ndarray, wholes: np.ndarray, what: Callable[[int], str]) -> np.ndarray:
    """Element-wise :func:`share` of two arrays (0 where the whole is empty); ``what(i)``
    names the i-th share for the error."""
    parts, wholes = np.asarray(parts, dtype=np.float64), np.asarray(wholes, dtype=np.float64)
    bad = ~((parts >= 0) & (parts <= np.maximum(wholes, 0)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        share(float(parts[i]), float(wholes[i]), what(i))
    out = np.zeros_like(parts)
    np.divide(parts, wholes, out=out, where=wholes > 0)
    return out
