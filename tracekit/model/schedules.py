"""The pipeline schedules tracekit knows, and their traits, in one table.

Capture (which schedules it runs, with which class), what-if (which orders it generates,
which split the backward, which place stages in a V) and the command line (its choices and
each target's chunks per rank) all read :data:`SCHEDULES`. A new schedule is one row here,
plus its order generator (tracekit/analyze/schedules.py) or its capture loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: chunks (stages) a rank holds: "one"; "several" (v of them, loop placement: stage c*p + r on
#: rank r); "two" (a V: rank r holds stages r and 2p-1-r)
Chunks = Literal["one", "several", "two"]


@dataclass(frozen=True)
class Schedule:
    name: str  # as the command line and the outputs spell it
    chunks: Chunks
    split_backward: bool  # the backward split into input-grad (I) and weight-grad (W) actions
    runner: str  # torch.distributed.pipelining's class that runs or orders it, or tracekit's own loop
    captured: bool  # ``tracekit capture`` runs it
    generated: bool  # what-if generates its order (and replays it)
    design: bool = False  # run by tracekit's own loop (tracekit.capture.designs), not a torch class
    offered: bool = True  # in what-if's default grid of targets (else on request, -s)

    @property
    def v_shaped(self) -> bool:
        return self.chunks == "two"


# In the order the command line lists them.
SCHEDULES: tuple[Schedule, ...] = (
    Schedule("GPipe", "one", False, "ScheduleGPipe", captured=True, generated=True),
    Schedule("1F1B", "one", False, "Schedule1F1B", captured=True, generated=True),
    Schedule("Interleaved1F1B", "several", False, "ScheduleInterleaved1F1B", captured=True, generated=True),
    # v >= 1: with one chunk a rank it is GPipe's order (backwards reversed). On request only:
    # at the same v it has Interleaved1F1B's bubble and holds every microbatch's activations
    Schedule("LoopedBFS", "several", False, "ScheduleLoopedBFS", captured=True, generated=True, offered=False),
    # torch has no class of that name: ScheduleInterleavedZeroBubble with one stage a rank
    Schedule("ZB-H1", "one", True, "ScheduleInterleavedZeroBubble", captured=False, generated=True),
    Schedule("InterleavedZeroBubble", "several", True, "ScheduleInterleavedZeroBubble", captured=True, generated=True),
    Schedule("ZBVZeroBubble", "two", True, "ScheduleZBVZeroBubble", captured=True, generated=True),
    # forward/backward pairs fused in one range (OVERLAP_F_B)
    Schedule("DualPipeV", "two", True, "ScheduleDualPipeV", captured=True, generated=True),
    # 1F1B with no flush between steps (two weight versions)
    Schedule("PipeDream2BW", "one", False, "PipeDream2BWLoop", captured=True, generated=False, design=True),
    # GPipe's order over token slices of one sequence
    Schedule("TeraPipe", "one", False, "TeraPipeLoop", captured=True, generated=False, design=True),
)
BY_NAME = {s.name: s for s in SCHEDULES}


def names(**traits: object) -> tuple[str, ...]:
    """The schedules whose traits are all as given, in table order: ``names(generated=True,
    split_backward=False)``; ``v_shaped`` may be given too."""
    return tuple(s.name for s in SCHEDULES if all(getattr(s, k) == want for k, want in traits.items()))


def chunks_per_rank(name: str, several: int) -> int:
    """The v a target of ``name`` takes: 1, ``several`` (an interleaved schedule's v) or the V's 2."""
    return {"one": 1, "two": 2, "several": several}[BY_NAME[name].chunks]
