"""The words and number formats every stage shares: the idle causes, their names, and how a
time, a size, a share or a list of ranks is written.

Here, below the analyses and the renderers, so that an analysis that writes a sentence
(a finding, a comparison's headline) and a renderer that writes a table say the same
thing, and so that rendering a stored document imports no analysis code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    """One cause idle time is attributed to: every output that lists causes reads it here.

    Adding a cause is an entry in :data:`IDLE_CAUSES` plus its computation (a switch in the
    attribution's replay for a ``removable`` one, a share of the all-causes-removed replay's
    idle for a ``schedule`` one); the JSON, the console, the tables, the HTML report, the
    merged trace and the gate list it from here.
    """

    key: str  # in JSON fields and table columns (``{key}_ns``), check limits and tags
    name: str  # in sentences and the console's "where the idle time goes"
    label: str  # the console rank table's narrow column heading
    legend: str  # the HTML report's legend and table heading
    # The HTML report's fill, light enough for the action bars to stand out: from Paul Tol's
    # colour-blind safe light and muted schemes, every two differing by at least 16 (CIE76
    # delta E) as drawn, also as people with protanopia, deuteranopia or tritanopia see them
    # (tests/test_html.py checks it).
    color: str
    # schedule: what the schedule itself forces (the idle left with every removable cause
    # switched off); removable: switched off in a replay, valued by its Shapley value
    kind: str
    # where the timeline lays the cause's idle within a rank's step: "front" (earliest idle
    # first), "back" (latest first) or "middle" (what is left, in this order)
    drawn: str
    description: str  # what the idle is: the attribution table's column documentation
    blamed_on: str = ""  # what the report puts its idle down to where no stage or link is named
    aliases: tuple[str, ...] = ()  # other spellings ``tracekit check`` accepts

    @property
    def column(self) -> str:
        """The cause's column (JSON field) of nanoseconds: ``comm_ns``."""
        return f"{self.key}_ns"


# The causes idle time is attributed to, in the order every output lists them. Columns: key,
# name, label, legend, colour, kind, drawn, description; then, where a cause has them, what
# the report blames it on and the other spellings check accepts.
# fmt: off
IDLE_CAUSES: tuple[Cause, ...] = (
    Cause("warmup",        "pipeline warm-up", "warmup", "warm-up",        "#99DDFF", "schedule",  "front",
          "idle before the rank's first backward that the schedule itself forces (pipeline filling)",
          blamed_on="the schedule: pipeline fill", aliases=("warm-up",)),
    Cause("drain",         "pipeline drain",   "drain",  "drain",          "#77AADD", "schedule",  "back",
          "idle after the rank's last forward that the schedule itself forces (pipeline emptying)",
          blamed_on="the schedule: pipeline drain"),
    Cause("schedule_gaps", "schedule gaps",    "gaps",   "schedule gaps",  "#EEDD88", "schedule",  "middle",
          "idle between those that the schedule itself forces (interleaved, zero-bubble holes)",
          blamed_on="the schedule: waits between its actions", aliases=("gaps", "schedule-gaps")),
    Cause("imbalance",     "stage imbalance",  "imbal",  "imbalance",      "#EE99AA", "removable", "middle",
          "idle caused by stages or actions slower than the typical one",
          aliases=("imbal",)),
    Cause("comm",          "comm latency",     "comm",   "comm latency",   "#CCDDAA", "removable", "middle",
          "idle caused by message latency and transfer"),
    Cause("overhead",      "overhead/other",   "ovhd",   "overhead/other", "#CC6677", "removable", "middle",
          "idle with the data there and the rank free (host overhead, replay residual)",
          blamed_on="host overhead between this rank's actions", aliases=("ovhd", "other")),
)
# fmt: on
CATEGORIES = tuple(c.key for c in IDLE_CAUSES)
CAUSE_NAMES = {c.key: c.name for c in IDLE_CAUSES}


# The kinds of pipeline action (F, B, or a backward split into I and W), as the outputs name them.
ACTION_KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}
# Where a schedule puts its p*v stages on the p ranks (tracekit.reconstruct.schedule), said
# plainly; a "custom" placement is the trace's own and needs no legend.
PLACEMENT_LEGENDS = {"loop": "stage s on rank s mod p", "v": "rank r holds stages r and 2p-1-r"}


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds, one decimal: ``12.3``."""
    return f"{ns / 1e6:.1f}"


def in_ms(ns: float) -> str:
    """Nanoseconds as milliseconds with the unit: ``12.3 ms``."""
    return f"{ms(ns)} ms"


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
