"""Reconstruct: turn per-rank events into a pipeline timeline (steps, actions, messages,
schedule). Works in place on a :class:`tracekit.model.Run`."""
from __future__ import annotations

from tracekit.model.run import Run
from tracekit.reconstruct.actions import find_actions
from tracekit.reconstruct.clock import estimate_offsets, shift_ranks
from tracekit.reconstruct.p2p import estimate_arrivals, match_messages
from tracekit.reconstruct.pipelines import pipeline_groups, restage, stage_is_rank
from tracekit.reconstruct.schedule import recognise, unrecognised
from tracekit.reconstruct.steps import find_steps

ONE_RANK = ("one rank: no pipeline to analyse (a single rank's trace, and no file says the job had "
            "more): this is not a pipeline run; per-rank busy/idle only")


def reconstruct(run: Run) -> Run:
    """Fill ``run.steps``, ``run.actions``, ``run.messages`` and ``run.schedule``.

    A run with ranks missing (``run.completeness``) gets its actions and messages but no
    recognised schedule: read from part of a pipeline, p, the placement and the schedule's
    name would describe a smaller pipeline that never ran. One rank alone is no pipeline.
    """
    if run.events.empty:
        run.warn("no events were read: nothing to analyse")
        return run
    run.steps = find_steps(run.events)
    actions, labelling = find_actions(run.events, run.steps)
    run.actions = actions
    run.steps["n_actions"] = _actions_per_step(run)
    if run.completeness is not None and run.completeness.single_rank:
        run.warn(ONE_RANK)
        return run
    if actions.empty:
        run.warn(
            "no pipeline-parallel actions found (no PP:/Forward/Backward labels, no segmentable "
            "send/recv pattern): this is not a pipeline run; per-rank busy/idle only"
        )
        return run
    messages, warnings = match_messages(run.events, run.steps, actions)
    for message in warnings:
        run.warn(message)
    shifts, notes = estimate_offsets(run.files, messages)
    for note in notes:
        run.warn(note)
    if shifts:
        _align(run, shifts)
        messages = shift_ranks(messages, shifts, "src_rank", ["send_post_ns"])
        messages = shift_ranks(messages, shifts, "dst_rank", ["recv_post_ns", "recv_done_ns"])
    run.messages = estimate_arrivals(messages, run.actions, run.events)
    if not run.is_complete:
        run.schedule = unrecognised(run.actions, run.completeness)
    else:
        overlap = actions["label"].str.contains("OVERLAP_F_B", regex=False).any()
        pipelines = pipeline_groups(run.actions, run.messages)
        if len(pipelines) > 1 and stage_is_rank(run.actions):
            run.actions = restage(run.actions, pipelines)
        run.schedule = recognise(run.actions, overlap_labels=bool(overlap), pipelines=pipelines)
    if run.schedule is not None:
        run.schedule.evidence.insert(0, f"actions from {labelling}")
    return run


def _actions_per_step(run: Run) -> list[int]:
    counts = run.actions.groupby(["rank", "step"]).size()
    return [int(counts.get((r, s), 0)) for r, s in zip(run.steps["rank"], run.steps["step"])]


def _align(run: Run, shifts: dict[int, int]) -> None:
    """Put every rank's times on the reference clock."""
    run.events = shift_ranks(run.events, shifts, "rank", ["start_ns", "end_ns"])
    run.actions = shift_ranks(run.actions, shifts, "rank", ["start_ns", "end_ns", "label_start_ns", "label_end_ns"])
    run.steps = shift_ranks(run.steps, shifts, "rank", ["step_start_ns", "step_end_ns"])
