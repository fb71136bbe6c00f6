"""Closed-form bubbles of the known schedules, as their papers give them (GPipe: Huang et al.
2019; 1F1B and interleaved 1F1B: Narayanan et al., SC'21; ZB-H1, ZB-V: Qi et al., "Zero
Bubble Pipeline Parallelism"; DualPipe: DeepSeek's DualPipe README).

Each formula gives the idle time per device and the bubble share of the step for balanced
stages and free communication. ``t_f``, ``t_b`` (= ``t_I + t_W``) are one microbatch's
forward and backward time on one stage (one model chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Theory:
    schedule: str
    formula: str
    bubble_ratio: float | None  # None when no closed form applies
    note: str = ""


def theoretical_bubble(
    schedule: str, p: int, v: int, m: int, t_f: float = 1.0, t_b: float = 2.0, t_w: float | None = None
) -> Theory:
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
    work = v * m * (t_f + t_b)  # one device's compute in a step
    if schedule in ("ZeroBubble (ZB-H1)", "ZB-H1", "InterleavedZeroBubble"):
        # Exact for torch's order (ZB-H1 is its interleaved zero-bubble class with v=1):
        # dependency-driven replays of it idle exactly this, with chunk times, while W is no
        # longer than F or I (tests/test_whatif_zb.py); interleaving shrinks the chunk times.
        idle = max(0.0, (p - 1) * (t_f + t_i - t_w))
        note = "" if t_w <= min(t_f, t_i) else "W longer than F or I: the formula undercounts the idle"
        return Theory(schedule, "idle = (p-1)(t_f+t_I-t_W) per device", idle / (idle + work), note)
    if schedule == "ZBVZeroBubble":
        idle = max(0.0, (p - 1) * (t_f + t_i - 2 * t_w))
        return Theory(
            schedule,
            "idle = max(0, (p-1)(t_f+t_I-2t_W)) per device",
            idle / (idle + work),
            "the paper's ZB-V bound; torch's ZBVZeroBubble order idles (p-1)t_f at t_f=t_I=t_W (its replay)",
        )
    if schedule == "DualPipeV":
        # DualPipe's 2p stages folded onto p ranks (PP = 2p in the README's (PP/2-1)(...));
        # tracekit replays a fused pair's halves back to back: t_F&B = t_f + t_b
        idle = max(0.0, (p - 1) * ((t_f + t_b) + t_b - 3 * t_w))
        return Theory(
            schedule,
            "idle = (p-1)(t_F&B+t_B-3t_W) per device",
            idle / (idle + work),
            "t_F&B = t_f + t_B, a forward and a backward fused in one range; DeepSeek's DualPipe README "
            "with PP = 2p stages; equals the replay of torch's order at t_f=t_I=t_W",
        )
    return Theory(schedule, "", None, f"no closed form known for {schedule}")


def flush_free_bubble(schedule: str, p: int, m: int, steps: int, fill_recorded: bool) -> Theory:
    """A pipeline with no flush (PipeDream-2BW), over ``steps`` recorded steps of m
    microbatches each.

    In steady state 1F1B with balanced stages keeps every rank busy: no bubble. The only
    schedule idle is the initial fill, once per run: rank r waits r*t_f for its first input
    and, after its p-r forwards, (p-1-r)*t_b for its first gradient, so
    (p-1)(t_f+t_b)/2 per rank on average. Over a recorded window holding that fill, the
    share is (p-1)/((p-1) + 2*steps*m) (t_f and t_b cancel); a window that starts later,
    in steady state, has none. There is no drain until training ends."""
    if p < 1 or m < 1 or steps < 1:
        return Theory(schedule, "", None, "needs p, m and steps >= 1")
    if not fill_recorded:
        return Theory(
            schedule,
            "0 (steady state, no flush)",
            0.0,
            "the trace starts after the pipeline's fill; a flush-free pipeline has no bubble in steady state",
        )
    return Theory(
        schedule,
        "fill once: (p-1)/((p-1)+2*steps*m)",
        (p - 1) / ((p - 1) + 2 * steps * m),
        f"no flush: only the initial fill idles (rank r: r*t_f + (p-1-r)*t_b), over the "
        f"{steps} recorded steps; steady state has no bubble",
    )


def sliced_bubble(schedule: str, p: int, t_f: Sequence[float], t_b: Sequence[float]) -> Theory:
    """GPipe's order over microbatches that cost differently (TeraPipe's token slices),
    backwards last slice first, stages balanced, messages free.

    The fill and the drain are set by the dearest slice, not the mean: for costs growing
    with the slice index, rank r's forward of slice i waits for rank r-1's (dearer slices
    come later), so the last rank ends its forwards (p-1)*t_f[m-1] after the first; the
    reversed backwards start with the dearest slice, adding (p-1)*t_b[m-1]. Idle per device
    = (p-1)(max t_f + max t_b) (exact for monotone costs); uniform slices of the same mean
    would idle (p-1)(mean t_f + mean t_b), GPipe's bubble."""
    if p < 1 or not t_f or len(t_f) != len(t_b):
        return Theory(schedule, "", None, "needs p >= 1 and per-slice forward and backward times")
    work = sum(t_f) + sum(t_b)
    idle = (p - 1) * (max(t_f) + max(t_b))
    m = len(t_f)
    uniform = (p - 1) * (work / m)
    return Theory(
        schedule,
        "idle = (p-1)(max_i t_f[i] + max_i t_b[i]) per device",
        idle / (idle + work),
        f"uniform slices of the same mean cost: {uniform / (uniform + work):.1%} (GPipe's (p-1)/(m+p-1))",
    )
