"""Measured bubbles: per rank and step, the window, busy time, idle time and bubble ratio.

The step window is global: from the first compute start to the last compute end over all
ranks in that step (``pipeline-theory.md``). A flush-free pipeline (PipeDream-2BW) has no
global step: see :func:`measure_continuous`. Busy is the union of the rank's compute spans
inside it; idle is the rest. For runs with no pipeline actions, each rank's busy time is
its GPU kernels (or, without a GPU, any CPU op or annotation) inside its own step windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyze.shares import share, shares
from tracekit.model.groups import reduce_by
from tracekit.model.intervals import union_lengths
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.plain import BubbleRow, plain_busy


BUBBLE_COLUMNS = ["rank", "step", "window_start_ns", "window_end_ns", "window_ns", "busy_ns", "idle_ns", "bubble_ratio"]


def step_windows(actions: pd.DataFrame) -> pd.DataFrame:
    """Global window of each step: first compute start to last compute end, all ranks."""
    grouped = actions.groupby("step")
    return pd.DataFrame(
        {
            "window_start_ns": grouped["start_ns"].min(),
            "window_end_ns": grouped["end_ns"].max(),
        }
    ).reset_index()


def measure_pipeline(actions: pd.DataFrame) -> pd.DataFrame:
    """Bubble table of a pipeline run (one row per rank and step), over
    :func:`rank_windows`."""
    rank, step, group = _rank_steps(actions)
    lo, hi = rank_windows(actions, rank, step)
    return _bubble_rows(actions, rank, step, group, lo, hi)


def rank_windows(actions: pd.DataFrame, rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each (rank, step) pair's window: the step's global one (:func:`step_windows`), except
    where consecutive steps overlap (ranks without a barrier between steps, as ZBV's, start
    the next step before others finish this one).

    There each rank's two windows meet at its own boundary, the later of the next step's
    global start and the end of its own last action of this step: its work stays in its
    step, its wait before the next step's work goes to the next step, and no stretch of the
    rank's timeline is counted in two steps (which global windows did)."""
    w = step_windows(actions)
    steps = w["step"].to_numpy(np.int64)
    g_lo, g_hi = w["window_start_ns"].to_numpy(np.int64), w["window_end_ns"].to_numpy(np.int64)
    at = np.searchsorted(steps, step)
    lo, hi = g_lo[at].copy(), g_hi[at].copy()
    overlapping = g_hi[:-1] > g_lo[1:]  # step k's window runs past step k+1's start
    if not overlapping.any():
        return lo, hi
    spans = actions.groupby(["rank", "step"]).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    ends = spans["last"].reindex(pd.MultiIndex.from_arrays([rank, step])).to_numpy(np.int64)
    idx = spans.index
    keys = zip(idx.get_level_values(0).tolist(), idx.get_level_values(1).tolist())
    first_of: dict[tuple[int, int], int] = {
        (int(r), int(s)): int(t) for (r, s), t in zip(keys, spans["first"].tolist())
    }
    boundary = {}
    for i, (r, k) in enumerate(zip(rank.tolist(), at.tolist())):
        if k + 1 < len(steps) and overlapping[k]:
            b = max(int(g_lo[k + 1]), int(ends[i]))
            # a rank whose own next step starts before that (its steps overlap on its own
            # device) keeps the global windows: each must hold the rank's actions of its step
            if b <= first_of.get((r, int(steps[k + 1])), b):
                boundary[(r, k)] = b
                hi[i] = min(hi[i], b)
    for i, (r, k) in enumerate(zip(rank.tolist(), at.tolist())):
        if k > 0 and (r, k - 1) in boundary:
            lo[i] = max(lo[i], boundary[(r, k - 1)])
    return lo, hi


def _rank_steps(actions: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (rank, step) pairs of the actions, ascending, and each action's pair's number."""
    pairs, group = np.unique(
        np.stack([actions["rank"].to_numpy(np.int64), actions["step"].to_numpy(np.int64)], axis=1),
        axis=0,
        return_inverse=True,
    )
    return pairs[:, 0], pairs[:, 1], group.reshape(-1)


def _bubble_rows(
    actions: pd.DataFrame, rank: np.ndarray, step: np.ndarray, group: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> pd.DataFrame:
    """The bubble table of each (rank, step) pair over its window [lo, hi): busy is the
    union of its actions (``group``: each action's pair) clipped to the window."""
    busy = union_lengths(group, actions["start_ns"].to_numpy(np.int64), actions["end_ns"].to_numpy(np.int64), lo, hi)
    return bubble_table(
        list(zip(rank.tolist(), step.tolist(), lo.tolist(), hi.tolist(), (hi - lo).tolist(), busy.tolist()))
    )


def continuous_windows(actions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per-rank step windows of a flush-free pipeline (rank, step, window_start_ns,
    window_end_ns).

    With no flush, a rank's step is the stretch between two of its own weight updates and
    the ranks' updates are staggered (the last stage's come first), so one global window
    per step would put the same stretch in two steps. Instead each rank's windows tile its
    own timeline: step N runs from the end of the rank's last compute in step N-1 to the
    end of its last compute in step N, so the wait for the step's first input and the
    weight update itself fall into it. The rank's first recorded step starts at its
    ``ProfilerStep`` start, but no earlier than the first compute over all ranks: where the
    trace holds the pipeline's start, the ranks' wait for their first inputs (the fill)
    is idle, and a profiler started early on one rank is not."""
    first_compute = int(actions["start_ns"].min())
    step_start = {(int(r), int(s)): int(t) for r, s, t in zip(steps["rank"], steps["step"], steps["step_start_ns"])}
    spans = (
        actions.groupby(["rank", "step"], sort=True)
        .agg(first_start_ns=("start_ns", "min"), last_end_ns=("end_ns", "max"))
        .reset_index()
    )
    rows = []
    previous_end: dict[int, int] = {}  # rank: end of its last compute in the step before
    for rank, step, first_start, last_end in zip(
        spans["rank"], spans["step"], spans["first_start_ns"], spans["last_end_ns"]
    ):
        rank, step = int(rank), int(step)
        if rank in previous_end:
            start = previous_end[rank]
        else:
            start = max(step_start.get((rank, step), first_compute), first_compute)
            start = min(start, int(first_start))
        rows.append((rank, step, start, int(last_end)))
        previous_end[rank] = int(last_end)
    return pd.DataFrame(rows, columns=["rank", "step", "window_start_ns", "window_end_ns"])


def measure_continuous(actions: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Bubble table of a flush-free pipeline: per-rank windows (:func:`continuous_windows`)."""
    w = continuous_windows(actions, steps)  # one row per (rank, step) of the actions, in that order
    rank, step, group = _rank_steps(actions)
    lo, hi = w["window_start_ns"].to_numpy(np.int64), w["window_end_ns"].to_numpy(np.int64)
    return _bubble_rows(actions, rank, step, group, lo, hi)


def measure_plain(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Busy/idle of a run without pipeline actions: kernels if any, else any CPU op or
    annotation (the step markers themselves aside): :func:`tracekit.reconstruct.plain.plain_busy`."""
    return bubble_table(plain_busy(EventArrays.of(events), steps))


def bubble_table(rows: list[BubbleRow]) -> pd.DataFrame:
    """The bubble table (BUBBLE_COLUMNS) from (rank, step, window start, end, window, busy) rows."""
    table = pd.DataFrame(rows, columns=BUBBLE_COLUMNS[:6])
    table["idle_ns"] = table["window_ns"] - table["busy_ns"]
    ranks, steps = table["rank"].to_numpy(), table["step"].to_numpy()
    table["bubble_ratio"] = shares(
        table["idle_ns"].to_numpy(),
        table["window_ns"].to_numpy(),
        lambda i: f"rank {ranks[i]} step {steps[i]}: bubble ratio",
    )
    return table


@dataclass(frozen=True)
class RankSummary:
    """One rank's totals over the measured steps."""

    window_ns: int
    busy_ns: int
    idle_ns: int
    bubble_ratio: float  # idle over window


@dataclass(frozen=True)
class RunSummary:
    """The run's totals over all ranks and steps, and each rank's (in rank order)."""

    bubble_ratio: float  # idle over window, summed across ranks and steps
    window_ns: int
    busy_ns: int
    idle_ns: int
    per_rank: dict[int, RankSummary]

    @property
    def n_ranks(self) -> int:
        return len(self.per_rank)


def summarise(bubbles: pd.DataFrame) -> RunSummary:
    """Run-level and per-rank totals: idle over window, summed across steps."""
    ranks, (window, busy, idle) = reduce_by(
        bubbles["rank"].to_numpy(), *((bubbles[c].to_numpy(), np.add) for c in ("window_ns", "busy_ns", "idle_ns"))
    )
    ratio = shares(idle, window, lambda i: f"rank {ranks[i]}: bubble ratio")
    total_window = int(window.sum())
    total_idle = int(idle.sum())
    return RunSummary(
        bubble_ratio=share(total_idle, total_window, "the run's bubble ratio"),
        window_ns=total_window,
        idle_ns=total_idle,
        busy_ns=int(busy.sum()),
        per_rank={
            int(r): RankSummary(window_ns=int(w), busy_ns=int(b), idle_ns=int(i), bubble_ratio=float(x))
            for r, w, b, i, x in zip(ranks.tolist(), window.tolist(), busy.tolist(), idle.tolist(), ratio.tolist())
        },
    )
