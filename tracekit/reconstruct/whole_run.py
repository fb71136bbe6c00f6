"""The whole run's reconstruction, on the client: every rank's events (or the ranks' reduced
steps and actions) into a pipeline timeline: steps, actions, messages, device times, aligned
clocks and the schedule: a :class:`tracekit.model.Run` as read in, the reconstructed one out
(its fields found first, then built once).

It loads pandas; the package itself does not, so parser workers that import
:mod:`tracekit.reconstruct.per_rank` for the per-rank reduce stay without it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import pandas as pd

from tracekit.errors import TracekitError
from tracekit.model.groups import counts_of, pair_codes
from tracekit.model.names import RECV_NAMES, SEND_NAMES
from tracekit.model.device import DeviceSummary
from tracekit.model.layout import Layout
from tracekit.model.run import TIMELINES, Completeness, Run, ScheduleInfo, add_warning
from tracekit.reconstruct import device as dev
from tracekit.reconstruct.actions import annotation_counts, find_actions
from tracekit.reconstruct.chains import restage_from_chains
from tracekit.reconstruct.clock import estimate_offsets, host_of_rank, shift_ranks
from tracekit.reconstruct.counts import count_problems
from tracekit.reconstruct.device_rank import DEVICE_ACTION_COLUMNS
from tracekit.reconstruct.declared import declared_mismatch
from tracekit.reconstruct.event_arrays import LAUNCH_CATEGORY, EventArrays, has_device_work
from tracekit.reconstruct.layout import collective_ops, find_layout, group_strides
from tracekit.reconstruct.labels import LabelSet, custom_set, describe_annotations, parse_rule
from tracekit.reconstruct.p2p import estimate_arrivals, match_messages
from tracekit.reconstruct.peers import groups_of
from tracekit.reconstruct.per_rank import gather
from tracekit.reconstruct.pipelines import pipeline_groups, restage, stage_is_rank
from tracekit.reconstruct.schedule import recognise, unrecognised
from tracekit.reconstruct.steps import find_steps, steps_cut_short

ONE_RANK = (
    "one rank: no pipeline to analyse (a single rank's trace, and no file says the job had "
    "more): this is not a pipeline run; per-rank busy/idle only"
)


@dataclass
class _Found:
    """What reconstruction finds of a run, gathered here field by field (the run's as read
    to start with) and built into the reconstructed :class:`Run` once (:meth:`run_of`)."""

    events: pd.DataFrame
    steps: pd.DataFrame
    actions: pd.DataFrame
    messages: pd.DataFrame
    device: pd.DataFrame
    device_summary: DeviceSummary
    device_pairs: pd.DataFrame
    collective_pairs: pd.DataFrame
    timeline: str
    clock_shifts: dict[int, int]
    host_busy: list[tuple[int, int, int, int, int, int]] | None
    labels: str
    actions_from: str
    label_counts: dict[str, int]
    schedule: ScheduleInfo | None
    layout: Layout | None
    completeness: Completeness | None
    warnings: list[str]

    @classmethod
    def of(cls, run: Run) -> _Found:
        found: dict[str, Any] = {f.name: getattr(run, f.name) for f in fields(cls)}
        return cls(**{**found, "warnings": list(run.warnings)})

    def warn(self, message: str) -> None:
        add_warning(self.warnings, message)

    def run_of(self, run: Run) -> Run:
        """``run`` (as read) with what was found."""
        found: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(run, **{**found, "warnings": tuple(self.warnings)})


def reconstruct(run: Run, timeline: str = "auto", labels: LabelSet | Sequence[str] | None = None) -> Run:
    """``run`` (as read) reconstructed: its steps, actions, messages, device tables and schedule.

    ``timeline``: ``auto`` measures on the device wherever the trace records device work
    (kernels, copies), else on the host; ``device`` insists (an error for a trace with no
    device work); ``host`` reads CPU op spans even where kernels exist (what tracekit did
    before it read the device; the host runs ahead of a GPU, so those figures are the
    host's, not the GPU's).

    ``labels``: the user's label rules, as ``"REGEX=KIND"`` strings or a
    :class:`~tracekit.reconstruct.labels.LabelSet`, tried before the built-in tables.

    A run with ranks missing (``run.completeness``) gets its actions and messages but no
    recognised schedule: read from part of a pipeline, p, the placement and the schedule's
    name would describe a smaller pipeline that never ran. One rank alone is no pipeline.
    """

    if labels is not None and not isinstance(labels, LabelSet):
        labels = custom_set([parse_rule(text, "label rule") for text in labels])
    if timeline not in TIMELINES:
        raise ValueError(f"timeline must be one of {TIMELINES}, not {timeline!r}")
    found = _Found.of(run)
    if found.events.empty:
        found.warn("no events were read: nothing to analyse")
        return found.run_of(run)
    reduced = [trace.reduced for trace in run.files]
    # Ranks reduced on the device sent their device ops, not their kernels' rows.
    on_device = any(part is not None and part.get("device") for part in reduced)
    on_device = on_device or has_device_work(EventArrays.of(found.events))
    if timeline == "device" and not on_device:
        raise TracekitError(
            f"{run.source}: --timeline device, but the traces record no device work (no "
            "kernel, memcpy or memset): profile with CUDA activity, or use --timeline host"
        )
    use_device = on_device and timeline != "host"
    found.timeline = "device" if use_device else "host"
    # CUDA API calls only link device work to the host: never an action's op.
    host_events = _host_events(run) if on_device else found.events
    # Each rank's steps and actions, where the processes that parsed the files found them
    # (on the device, the events are then its device rows, launches and message rows).
    gathered = gather(reduced, labels)
    if gathered is not None:
        found.steps, actions, choice, labelling = gathered.steps, gathered.actions, gathered.choice, gathered.labelling
        annotations = gathered.annotations
    else:
        found.steps = find_steps(found.events)  # a rank without step marks spans all it recorded
        actions, choice, labelling = find_actions(host_events, found.steps, labels)
        annotations = annotation_counts(host_events)
    _note_steps_cut_short(found)
    if gathered is not None:
        found.host_busy = gathered.host_busy
    if gathered is not None and gathered.device_summary is not None:
        found.device_summary = gathered.device_summary  # the actions carry their device spans
    elif on_device:
        if any(part is not None for part in reduced):
            raise TracekitError(f"{run.source}: its ranks were reduced in ways that do not fit together")
        # the working sets were read (an output that draws ops): the same reduce, on the table
        found.device = dev.device_ops(found.events, found.steps)
        found.device_summary, actions = dev.summarise_table(found.device, host_events, actions, _world_sizes(run))
    if not use_device:
        actions = dev.without_device_spans(actions)
    for trace in run.files:
        trace.reduced = None  # read: the run's tables hold it now
    found.labels, found.label_counts = choice.name, dict(choice.counts)
    found.actions_from = "labels" if choice.used is not None else "segmentation"
    for note in choice.notes:
        found.warn(note)
    found.actions = actions
    found.steps["n_actions"] = _actions_per_step(found.steps, found.actions)
    if found.completeness is not None and found.completeness.single_rank:
        found.actions = dev.without_device_spans(actions)
        found.warn(f"{ONE_RANK} ({describe_annotations(annotations)})")
        return found.run_of(run)
    if actions.empty:
        if use_device:
            found.device_pairs = dev.pair_p2p_kernels(found.device_summary)
            found.collective_pairs = dev.pair_collective_sendrecv(found.device_summary)
        found.warn(no_pipeline_message(run, host_events, annotations))
        return found.run_of(run)
    # Segmented actions, and those of a table that names no stage (Megatron's frames), are
    # each one forward or one backward, placed by rank and order of appearance alone.
    # (actions_from is "segmentation" exactly where choice.used is None)
    placed_by_chains = found.actions_from == "segmentation" or (
        choice.used is not None and choice.used.placed_by_chains
    )
    found_notes: list[str] = []
    messages, warnings = match_messages(
        host_events,
        found.steps,
        actions,
        consumer_by_kind=placed_by_chains,
        groups=groups_of(run.files),
        notes=found_notes,
    )
    for message in warnings:
        found.warn(message)
    chain_note = None
    if placed_by_chains:
        # rank alone names no stage when a rank holds several (a virtual pipeline)
        found.actions, chain_note = restage_from_chains(found.actions, messages)
        actions = found.actions
    if use_device:
        _on_device(found, run, messages)
    else:
        shifts, notes = estimate_offsets(run.files, messages)
        for note in notes:
            found.warn(note)
        if shifts:
            _align(found, shifts)
            messages = shift_ranks(messages, shifts, "src_rank", ["send_post_ns"])
            messages = shift_ranks(messages, shifts, "dst_rank", ["recv_post_ns", "recv_done_ns"])
        found.messages = estimate_arrivals(messages, found.actions, found.events)
    if not (found.completeness is None or found.completeness.every_rank):
        assert found.completeness is not None  # a run without one has every rank
        found.schedule = unrecognised(found.actions, found.completeness)
    else:
        overlap = actions["label"].str.contains("OVERLAP_F_B", regex=False).any()
        pipelines = pipeline_groups(found.actions, found.messages)
        if len(pipelines) > 1 and stage_is_rank(found.actions):
            found.actions = restage(found.actions, pipelines)
        found.layout = find_layout(
            run.ranks,
            groups_of(run.files),
            found.actions,
            found.messages,
            pipelines,
            collective_ops(found.events),
            group_strides(found.events),
        )
        found.schedule = recognise(found.actions, overlap_labels=bool(overlap), pipelines=pipelines)
        for problem in count_problems(found.actions, found.schedule):
            found.warn(problem)
        mismatch = declared_mismatch(run.capture, found.schedule)
        if mismatch:
            found.warn(mismatch)
    if found.schedule is not None:
        found.schedule.evidence.extend(found_notes)  # how the messages were found: no problem, said
        if chain_note:
            found.schedule.evidence.insert(0, chain_note)
        found.schedule.evidence.insert(0, f"actions from {labelling}")
    return found.run_of(run)


def _note_steps_cut_short(found: _Found) -> None:
    """A rank whose trace covers fewer steps than the others' makes the run incomplete; the
    line that says so first is said again with it."""
    before = found.completeness
    if before is None:
        return
    short = {rank: why for rank, why in steps_cut_short(found.steps).items() if rank not in before.cut_short}
    if not short:
        return
    found.completeness = replace(before, cut_short={**before.cut_short, **short})
    if before.message() in found.warnings:
        found.warnings.remove(before.message())
    found.warnings.insert(0, found.completeness.message())


def no_pipeline_message(run: Run, events: pd.DataFrame, annotations: dict[str, int]) -> str:
    """What was seen where no pipeline was found, and what to do about it: ``events`` (host
    rows, for their P2P ops) and the run's ``annotations`` (name -> count)."""

    n_ranks = len(run.ranks)
    expected = run.completeness.world_size if run.completeness is not None else None
    ranks = f"{n_ranks} rank(s)" + (f" of {expected}" if expected and expected != n_ranks else "")
    n_p2p = int(events["name"].isin(SEND_NAMES + RECV_NAMES).sum())
    return (
        f"no pipeline-parallel actions found: {ranks}; {describe_annotations(annotations)}; "
        f"{n_p2p} point-to-point op(s). If the annotations name your pipeline's actions, add a rule: "
        "--label-rule 'REGEX=KIND' (KIND F, B, I, W or kind; groups (?P<stage>..), (?P<mb>..)); "
        "else this is not a pipeline run: per-rank busy/idle only"
    )


def _on_device(found: _Found, run: Run, messages: pd.DataFrame) -> None:
    """Put the actions and messages on the device timeline, clocks aligned from the device
    P2P kernels."""

    summary = found.device_summary
    messages = dev.device_messages(messages, summary)
    shifts, notes = dev.device_clock_offsets(messages, host_of_rank(run.files))
    for note in notes:
        found.warn(note)
    if shifts:
        _align(found, shifts)
        found.actions = shift_ranks(found.actions, shifts, "rank", list(DEVICE_ACTION_COLUMNS[:2]))
        summary.shift(shifts)
        if len(found.device):  # held for outputs that draw it
            found.device = shift_ranks(found.device, shifts, "rank", ["start_ns", "end_ns"])
            found.device = shift_ranks(found.device, shifts, "rank", ["launch_ns", "launch_end_ns"], unset=-1)
        messages = shift_ranks(messages, shifts, "src_rank", ["send_post_ns"])
        messages = shift_ranks(messages, shifts, "dst_rank", ["recv_post_ns", "recv_done_ns"])
        # wait and transfer compare both sides' kernels: measured again on the one clock
        messages = dev.kernel_times(messages, summary)
    found.actions = dev.device_actions(found.actions)
    unlinked = int((messages["send_kernel"] < 0).sum()) if len(messages) else 0
    if unlinked:
        found.warn(
            f"{unlinked} of {len(messages)} messages have no P2P kernel on both sides in the trace; "
            "their times are the host's"
        )
    # Producer and consumer stay those of the host's program order (match_messages).
    found.messages = dev.apply_device_times(messages)
    found.device_pairs = dev.pairs_from_messages(messages)
    found.collective_pairs = dev.pair_collective_sendrecv(summary)


def _world_sizes(run: Run) -> dict[int, int]:
    """Each rank's job size as its file states it (1 where it states none)."""
    return {rank: trace.world_size or 1 for trace in run.files for rank in (trace.ranks or [trace.rank])}


def _host_events(run: Run) -> pd.DataFrame:
    """The events without CUDA API calls (they link device work to the host, nothing more)."""
    return run.events[(run.events["cat"] != LAUNCH_CATEGORY).to_numpy()]


def _actions_per_step(steps: pd.DataFrame, actions: pd.DataFrame) -> list[int]:
    """How many actions each step row of ``steps`` holds of ``actions`` (by rank and step): a
    count per (rank, step) code, not a groupby and a MultiIndex reindex (~2 ms of the
    command's serial tail on 8 GPU ranks)."""
    if not len(actions):  # a run without a pipeline (its default table's columns are objects)
        return [0] * len(steps)
    columns = [steps["rank"], steps["step"], actions["rank"], actions["step"]]
    if not all(pd.api.types.is_integer_dtype(c.dtype) for c in columns):  # empty tables, or odd ones
        counts = actions.groupby(["rank", "step"]).size()
        wanted = pd.MultiIndex.from_arrays([steps["rank"], steps["step"]])
        return [int(n) for n in counts.reindex(wanted, fill_value=0).tolist()]
    step_rank, step_number, action_rank, action_step = (c.to_numpy() for c in columns)
    step_code, action_code = pair_codes(step_rank, step_number, (action_rank, action_step))
    per_step: list[int] = counts_of(action_code, step_code).tolist()
    return per_step


def _align(found: _Found, shifts: dict[int, int]) -> None:
    """Put every rank's times on the reference clock."""

    found.clock_shifts = dict(shifts)
    found.events = shift_ranks(found.events, shifts, "rank", ["start_ns", "end_ns"])
    found.actions = shift_ranks(found.actions, shifts, "rank", ["start_ns", "end_ns", "label_start_ns", "label_end_ns"])
    found.steps = shift_ranks(found.steps, shifts, "rank", ["step_start_ns", "step_end_ns"])
