"""Do the actions add up? A pipeline step runs every microbatch through every stage once per
kind: p·v·m forwards and as many backwards (or input-grads and weight-grads). A run whose
actions do not add up was read wrongly (actions merged or split, a stage mistaken for
another) or recorded partly; either way its schedule should not be trusted silently."""

from __future__ import annotations

import pandas as pd

from tracekit.model.run import ScheduleInfo


def count_problems(actions: pd.DataFrame, schedule: ScheduleInfo | None, limit: int = 3) -> list[str]:
    """One warning when some step's actions are not p·v·m per kind, naming the first few
    (step, stage, kind) that differ; [] when they add up."""
    if actions.empty or schedule is None or schedule.m <= 0 or schedule.flush_free:
        return []  # a flush-free pipeline (PipeDream-2BW) runs microbatches across its steps
    # A split schedule may still run some backwards whole (DualPipeV's fused F+B): a B
    # counts as both an input-grad and a weight-grad.
    parts = {"F": ("F",), "I": ("B", "I"), "W": ("B", "W")} if schedule.split_backward else {"F": ("F",), "B": ("B",)}
    stages = sorted(schedule.stage_to_rank)
    ranks = {r for group in (schedule.pipelines or [[*schedule.stage_to_rank.values()]]) for r in group}
    mine = actions[actions["rank"].isin(ranks) & (actions["step"] >= 0)]
    counts = mine.groupby(["step", "stage", "kind"]).size()
    replicas = max(1, schedule.replicas)
    expected = schedule.m * replicas
    off: list[str] = []
    for step in sorted(mine["step"].unique()):
        for stage in stages:
            for kind, counted in parts.items():
                n = sum(int(counts.get((step, stage, k), 0)) for k in counted)
                if n != expected:
                    off.append(f"step {int(step)} stage {int(stage)}: {n} {kind} of {expected}")
    if not off:
        return []
    kinds = parts
    shown = "; ".join(off[:limit]) + (f"; and {len(off) - limit} more" if len(off) > limit else "")
    return [
        f"the actions do not add up to p·v·m per kind ({schedule.p}·{schedule.v}·{schedule.m}·{len(kinds)} = "
        f"{len(stages) * schedule.m * len(kinds)} a step{' per replica' if replicas > 1 else ''}): {shown}; the schedule read from them "
        "may be wrong (actions merged or split, or a step cut off): check the labels (--label-rule) "
        "or the trace"
    ]
