"""Per-microbatch compute cost and the idle its spread causes (TeraPipe's token slices).

In TeraPipe a step's microbatches are slices of one sequence, and a later slice's attention
looks at a longer prefix, so it costs more. The pipeline's fill and drain are then set by
the dearest slice, not the mean one (:func:`tracekit.analyze.theory.sliced_bubble`).

Two figures:

- the cost of each microbatch index: its forward and backward compute, the median over
  stages and steps (one stalled action does not move it), and the dearest one's cost over the first's (``growth``);
- the idle the spread causes: every step's graph replayed as the attribution's ideal
  (stages balanced per microbatch, messages free, no overhead; see
  :mod:`tracekit.analyze.attribution`), once with the slices' costs and once with every
  slice at the step's mean slice cost (each kind's balanced duration averaged over the
  microbatches: GPipe's uniform fill and drain). ``skew_idle_ns`` is the idle the profile adds, part of the
  fill and drain (warmup + drain) of the attribution, and its share of the replayed
  (= measured) idle; negative where the spread shortens the idle. Noise and stalls of
  single actions are left out on both sides: they are imbalance or overhead, not the
  slices' profile.

Microbatch ids must name the same slice in every step, so a flush-free run (ids counting
on across steps) gets none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.analyze.replay import Scenario, StepGraph, idle_per_rank, replay_steps
from tracekit.model.run import compute_ns

if TYPE_CHECKING:
    from tracekit.schemas.analysis import SlicesDoc


@dataclass
class SliceCosts:
    microbatches: list[int]
    forward_ns: list[int]  # per microbatch index: median forward compute over stages and steps
    backward_ns: list[int]  # B, or I + W
    skew_idle_ns: int | None = None  # ideal replay's idle that the slice profile adds
    replay_idle_ns: int | None = None

    @property
    def total_ns(self) -> list[int]:
        return [f + b for f, b in zip(self.forward_ns, self.backward_ns)]

    @property
    def growth(self) -> float:
        """The dearest microbatch's compute over the first's."""
        total = self.total_ns
        return max(total) / total[0] if total and total[0] > 0 else float("nan")

    @property
    def dearest(self) -> int:
        total = self.total_ns
        return self.microbatches[int(np.argmax(total))]

    @property
    def skew_idle_share(self) -> float | None:
        if self.skew_idle_ns is None or not self.replay_idle_ns:
            return None
        return self.skew_idle_ns / self.replay_idle_ns

    def to_dict(self) -> SlicesDoc:
        share = self.skew_idle_share
        return {
            "microbatches": list(self.microbatches),
            "forward_ns": list(self.forward_ns),
            "backward_ns": list(self.backward_ns),
            "total_ns": self.total_ns,
            "growth": round(self.growth, 6),
            "dearest": self.dearest,
            "skew_idle_ns": self.skew_idle_ns,
            "replay_idle_ns": self.replay_idle_ns,
            "skew_idle_share": None if share is None else round(share, 6),
        }


def slice_costs(actions: pd.DataFrame, graphs: dict[int, StepGraph] | None = None) -> SliceCosts | None:
    """Per-microbatch costs of a run whose microbatch ids repeat per step, and, given the
    measured step graphs, the idle their spread causes. None without two microbatches."""
    known = actions[actions["microbatch"] >= 0]
    if known["microbatch"].nunique() < 2:
        return None
    compute = known.assign(compute=compute_ns(known), phase=np.where(known["kind"] == "F", "F", "B"))
    # one action per (stage, step, microbatch, phase): I and W add up to the backward
    per_action = compute.groupby(["phase", "microbatch", "stage", "step"])["compute"].sum()
    typical = per_action.groupby(["phase", "microbatch"]).median()
    microbatches = sorted(int(i) for i in known["microbatch"].unique())
    forward = [int(round(typical.get(("F", i), 0.0))) for i in microbatches]
    backward = [int(round(typical.get(("B", i), 0.0))) for i in microbatches]
    costs = SliceCosts(microbatches, forward, backward)
    if graphs:
        measured_idle = equalised_idle = 0
        skewed_idle = 0

        def scenarios() -> Iterator[tuple[StepGraph, list[Scenario], tuple[StepGraph, np.ndarray, np.ndarray]]]:
            for graph in graphs.values():  # made as replay_steps asks
                free = {
                    "ovh": np.zeros_like(graph.ovh),
                    "lat": np.zeros_like(graph.edge_lat),
                    "xfer": np.zeros_like(graph.edge_xfer),
                }
                balanced = graph.balanced_durations(by_microbatch=True)
                flat = equalised_durations(graph, balanced)
                scenarios = [Scenario(), Scenario(dur=balanced, **free), Scenario(dur=flat, **free)]
                yield graph, scenarios, (graph, balanced, flat)

        # the three replays of every step, the steps side by side in as few walks as fit
        for (graph, balanced, flat), (measured, skewed, equalised) in replay_steps(scenarios()):
            measured_idle += sum(idle_per_rank(graph, measured).values())
            skewed_idle += sum(idle_per_rank(graph, skewed, balanced).values())
            equalised_idle += sum(idle_per_rank(graph, equalised, flat).values())
        costs.replay_idle_ns = int(measured_idle)
        costs.skew_idle_ns = int(skewed_idle - equalised_idle)
    return costs


def equalised_durations(graph: StepGraph, dur: np.ndarray) -> np.ndarray:
    """``dur`` with every action at the mean of its kind over the step's actions (the same
    total work, no spread between microbatches)."""
    _, kind = np.unique(graph.kind.astype(str), return_inverse=True)
    kind = kind.reshape(-1)
    means = np.bincount(kind, weights=dur) / np.bincount(kind)  # integer sums: exact, as pandas' mean
    return np.round(means[kind]).astype(np.int64)
