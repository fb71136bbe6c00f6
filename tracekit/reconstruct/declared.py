"""The schedule a run's manifest declares against the one its traces show.

``capture.json`` (written by ``tracekit capture`` and by :func:`tracekit.trace_handler`) says
what ran: the schedule's name, p, v, m and the rank of each stage. The recognised schedule
comes from the order of the actions alone, so a difference means the manifest belongs to
another run, or the traces are not what the user meant to record (a schedule object that was
built but not stepped, a microbatch count changed after the manifest was written); either is
worth one warning. The traces' reading stands: they are what ran.
"""

from __future__ import annotations

import re
from typing import Any

from tracekit.model.run import UNRECOGNISED, ScheduleInfo

# Declared names (torch's class names without "Schedule", tracekit capture's --schedule
# names) -> the name tracekit gives what it recognises, where the two differ.
_RECOGNISED_AS = {"pipedream2bw": "PipeDream-2BW (no flush)", "terapipe": "TeraPipe (token slices)"}
# Names tracekit can recognise; a declared name outside them (a schedule of one's own, the
# generic _PipelineScheduleRuntime) is not compared.
_KNOWN = {
    "gpipe",
    "1f1b",
    "interleaved1f1b",
    "loopedbfs",
    "interleavedzerobubble",
    "zbvzerobubble",
    "dualpipev",
    "zerobubblezbh1",
    *_RECOGNISED_AS,
}


def _key(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def declared_mismatch(capture: dict[str, Any] | None, schedule: ScheduleInfo | None) -> str | None:
    """One warning naming every fact the manifest declares that the traces contradict, or None."""
    if not capture or schedule is None or schedule.name == UNRECOGNISED:
        return None
    declared: list[str] = []
    seen: list[str] = []
    name = capture.get("schedule")
    if isinstance(name, str) and _key(name) in _KNOWN:
        expected = _RECOGNISED_AS.get(_key(name), name)
        # InterleavedZeroBubble with one stage per rank is what tracekit calls ZB-H1
        if _key(expected) == "interleavedzerobubble" and schedule.v == 1:
            expected = "ZeroBubble (ZB-H1)"
        if _key(expected) != _key(schedule.name):
            declared.append(f"schedule {name}")
            seen.append(f"schedule {schedule.name}")
    for fact in ("p", "v", "m"):
        value = capture.get(fact)
        if isinstance(value, int) and not isinstance(value, bool) and value != getattr(schedule, fact):
            declared.append(f"{fact}={value}")
            seen.append(f"{fact}={getattr(schedule, fact)}")
    listed = capture.get("stage_to_rank")
    if isinstance(listed, list) and schedule.stage_to_rank and not declared:
        stated = {s: r for s, r in enumerate(listed) if isinstance(r, int)}
        if stated != schedule.stage_to_rank:
            declared.append(f"stages on ranks {listed}")
            seen.append(f"stages on ranks {[schedule.stage_to_rank.get(s, -1) for s in range(len(listed))]}")
    if not declared:
        return None
    return (
        f"capture.json declares {', '.join(declared)}; the traces show {', '.join(seen)}: the analysis "
        "follows the traces; check that capture.json belongs to this run"
    )
