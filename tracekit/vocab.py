"""The words and number formats every stage shares: the idle causes, their names, and how a
time, a size, a share or a list of ranks is written.

Here, below the analyses and the renderers, so that an analysis that writes a sentence
(a finding, a comparison's headline) and a renderer that writes a table say the same
thing, and so that rendering a stored document imports no analysis code.
"""

from __future__ import annotations

# The causes idle time is attributed to, in the order every output lists them.
CATEGORIES = ("warmup", "drain", "schedule_gaps", "imbalance", "comm", "overhead")
CAUSE_NAMES = {
    "warmup": "pipeline warm-up",
    "drain": "pipeline drain",
    "schedule_gaps": "schedule gaps",
    "imbalance": "stage imbalance",
    "comm": "comm latency",
    "overhead": "overhead/other",
}


# The kinds of pipeline action (F, B, or a backward split into I and W), as the outputs name them.
ACTION_KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
# Where a schedule puts its p*v stages on the p ranks (tracekit.reconstruct.schedule), said
# plainly; a "custom" placement is the trace's own and needs no legend.
PLACEMENT_LEGENDS = {"loop": "stage s on rank s mod p", "v": "rank r holds stages r and 2p-1-r"}


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds, one decimal: ``12.3``."""
    return f"{ns / 1e6:.1f}"


def format_bytes(n: float) -> str:
    """A size in bytes, binary units, one decimal: ``512 B``, ``40.0 KiB``, ``2.5 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def signed_ms(ns: float) -> str:
    """A change in nanoseconds as signed milliseconds: ``+12.3``."""
    return f"{ns / 1e6:+.1f}"


def pct(share: float | None) -> str:
    """A share 0..1 as a percentage, one decimal: ``31.2%`` (``n/a`` for None)."""
    return "n/a" if share is None else f"{100 * share:.1f}%"


def points(delta: float) -> str:
    """A change of a share in percentage points, signed: ``+10.3 points``."""
    return f"{100 * delta:+.1f} points"


def rank_list(ranks: list[int], shown: int = 4) -> str:
    """ "ranks 2,6" or, for many replicas, "32 ranks 2,6,10,...,126"."""
    if len(ranks) <= shown:
        return "ranks " + ",".join(map(str, ranks))
    return f"{len(ranks)} ranks " + ",".join(map(str, ranks[: shown - 1])) + f",...,{ranks[-1]}"
