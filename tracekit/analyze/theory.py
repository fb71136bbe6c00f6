"""Closed-form bubbles of the known schedules (``shared/docs/pipeline-theory.md``).

Each formula gives the idle time per device and the bubble share of the step for balanced
stages and free communication. ``t_f``, ``t_b`` (= ``t_I + t_W``) are one microbatch's
forward and backward time on one stage (one model chunk).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Theory:
    schedule: str
    formula: str
    bubble_ratio: float | None     # None when no closed form applies
    note: str = ""

    def to_dict(self) -> dict:
        return {"schedule": self.schedule, "formula": self.formula,
                "bubble_ratio": self.bubble_ratio, "note": self.note}


def theoretical_bubble(schedule: str, p: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0,
                       t_w: float | None = None) -> Theory:
    """The bubble share of a step for ``schedule`` with p ranks, v chunks, m microbatches."""
    if p < 1 or m < 1:
        return Theory(schedule, "", None, "needs p >= 1 and m >= 1")
    if schedule in ("GPipe", "1F1B"):
        return Theory(schedule, "(p-1)/(m+p-1)", (p - 1) / (m + p - 1))
    if schedule in ("Interleaved1F1B", "LoopedBFS"):
        note = "" if schedule == "Interleaved1F1B" else "breadth-first looping has the interleaved bubble"
        return Theory(schedule, "(p-1)/(v*m+p-1)", (p - 1) / (v * m + p - 1), note)
    t_w = t_b / 2 if t_w is None else t_w
    t_i = t_b - t_w
    work = v * m * (t_f + t_b)          # one device's compute in a step
    if schedule in ("ZeroBubble (ZB-H1)", "InterleavedZeroBubble"):
        idle = max(0.0, (p - 1) * (t_f + t_i - t_w)) / v
        return Theory(schedule, "idle = (p-1)(t_f+t_I-t_W)/v per device", idle / (idle + work),
                      "ZB-H1 bound; torch's interleaved zero-bubble schedule aims lower")
    if schedule == "ZBVZeroBubble":
        idle = max(0.0, (p - 1) * (t_f + t_i - 2 * t_w))
        return Theory(schedule, "idle = max(0, (p-1)(t_f+t_I-2t_W)) per device", idle / (idle + work))
    if schedule == "DualPipeV":
        idle = max(0.0, (p / 2 - 1) * ((t_f + t_b) + t_b - 3 * t_w))
        return Theory(schedule, "idle = (p/2-1)(t_F&B + t_B - 3t_W) per device", idle / (idle + work),
                      "DeepSeek-V3 DualPipe README")
    return Theory(schedule, "", None, f"no closed form known for {schedule}")
