"""What the cross-rank reduce needs of one rank, found where its file was parsed.

Steps (:func:`~tracekit.reconstruct.steps.step_table`) and compute actions
(:func:`~tracekit.reconstruct.actions.action_table`) read one rank's events only, so the
process that parsed a file can find them, on the file's columns without pandas
(:mod:`.event_arrays`), and send back those few thousand rows instead of the rank's events.
What the client still reads of the events is small: the rows that message matching, peer
inference and arrival estimates read (communication-library ops and ranges, framework P2P
ranges) and each rank's first and last row (the extent of the run).

The one choice made across ranks is the label table (the first whose action rules match
an annotation anywhere in the run): each rank reports its annotation counts and the table
it would choose alone, and :func:`gather` uses the ranks' actions only where every rank
chose the table the whole run chooses. Where a rank records device work or has no action
(runs without a pipeline read every event when measured), it sends its working set as
before and the client reconstructs from events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.model.run import ACTION_COLUMNS, STEP_COLUMNS
from tracekit.reconstruct.actions import UNLABELLED, action_table, annotation_counts
from tracekit.reconstruct.event_arrays import EventArrays, has_device_work
from tracekit.reconstruct.labels import LabelChoice, LabelSet, choose, p2p_ways
from tracekit.reconstruct.steps import step_table

if TYPE_CHECKING:  # numpy only at import: parser workers run rank_reduce; gather, in the client, loads pandas
    import pandas as pd

# Names of the rows message matching and arrival estimates read (tracekit.reconstruct.p2p):
# the c10d and record_param_comms ops (sends, receives, and the comm ops whose ends delay a
# receiver's wait), the gloo:recv waits and ProcessGroupNCCL's titles ("nccl:send 0->1").
_MESSAGE_PREFIXES = ("c10d::", "record_param_comms", "gloo:recv", "nccl:send", "nccl:recv")
# The action columns a rank sends (action_id is numbered over the whole run).
_RANK_ACTION_COLUMNS = [c for c in ACTION_COLUMNS if c != "action_id"]


def rank_reduce(events: EventArrays, labels: LabelSet | None) -> tuple[dict[str, Any], np.ndarray] | None:
    """One rank's (or one file's) steps, actions and label counts as a JSON-ready dict, and
    which of ``events`` the client still reads; None where the client needs the events
    themselves (device work, or no action: see the module doc)."""
    if not len(events) or has_device_work(events):
        return None
    steps = step_table(events)
    actions, choice, _ = action_table(events, steps, labels)
    if not len(actions["action_id"]):
        return None
    reduced = {
        "table": choice.used.name if choice.used is not None else None,
        "counts": annotation_counts(events),
        "steps": {c: steps[c].tolist() for c in STEP_COLUMNS[:4]},
        "actions": {c: _as_list(actions[c]) for c in _RANK_ACTION_COLUMNS},
    }
    return reduced, message_rows(events)


def _as_list(column: np.ndarray | list[Any]) -> list[Any]:
    return column.tolist() if isinstance(column, np.ndarray) else column


def message_rows(events: EventArrays) -> np.ndarray:
    """The rows the client reads once actions are known: communication-library ops and
    ranges on the host (sends, receives, ``gloo:recv`` waits, NCCL titles, the comm ops
    that delay a receiver's wait), framework ranges that say which way their P2P ops go,
    and each rank's earliest-starting and latest-ending row."""
    on_cpu = ~events["on_gpu"]
    keep = on_cpu & events.starts_with(_MESSAGE_PREFIXES)
    annotation = on_cpu & events.is_in("cat", ("user_annotation",))
    if annotation.any():
        keep |= annotation & events.per_name("name", lambda n: p2p_ways(n) is not None)
    ranks = events["rank"]
    starts, ends = events["start_ns"], events["end_ns"]
    for rank in np.unique(ranks):
        mine = np.flatnonzero(ranks == rank)
        keep[mine[np.argmin(starts[mine])]] = True
        keep[mine[np.argmax(ends[mine])]] = True
    return keep


@dataclass
class Gathered:
    """The run's steps, actions and label choice, put together from its ranks."""

    steps: pd.DataFrame
    actions: pd.DataFrame
    choice: LabelChoice
    labelling: str


def run_choice(reduced: list[dict[str, Any] | None], labels: LabelSet | None) -> LabelChoice | None:
    """The label table the whole run chooses, from its ranks' counts; None when a rank sent
    events instead (no action of its own, or device work), or would choose another table
    alone (its actions are then not the run's)."""
    if not reduced or any(r is None for r in reduced):
        return None
    counts: dict[str, int] = {}
    for part in reduced:
        assert part is not None
        for name, n in part["counts"].items():
            counts[name] = counts.get(name, 0) + int(n)
    choice = choose(counts, labels)
    table = choice.used.name if choice.used is not None else None
    return choice if all(part is not None and part["table"] == table for part in reduced) else None


def gather(reduced: list[dict[str, Any] | None], labels: LabelSet | None) -> Gathered | None:
    """The whole run's steps and actions from each rank's :func:`rank_reduce` (in file
    order), exactly what :func:`~.steps.find_steps` and :func:`~.actions.find_actions` give on all events; None
    where :func:`run_choice` is."""
    choice = run_choice(reduced, labels)
    if choice is None:
        return None
    import pandas as pd

    parts = [r for r in reduced if r is not None]
    steps = pd.DataFrame({c: _joined(parts, "steps", c) for c in STEP_COLUMNS[:4]}, columns=STEP_COLUMNS[:4])
    steps = steps.astype("int64")
    steps["n_actions"] = 0
    steps = steps.sort_values(["rank", "step"]).reset_index(drop=True)
    actions = pd.DataFrame(
        {c: _joined(parts, "actions", c) for c in _RANK_ACTION_COLUMNS}, columns=_RANK_ACTION_COLUMNS
    )
    # Stable, as find_actions' sort: a rank's rows keep their order where start times tie.
    actions = actions.sort_values(["rank", "step", "start_ns"], kind="stable").reset_index(drop=True)
    actions["action_id"] = np.arange(len(actions))
    labelling = f"{choice.used.name} labels ({choice.used.what})" if choice.used is not None else UNLABELLED
    return Gathered(steps, actions[ACTION_COLUMNS], choice, labelling)


def _joined(parts: list[dict[str, Any]], table: str, column: str) -> list[Any]:
    """One column of every rank's table, as one list (one frame is built, not one a rank)."""
    out: list[Any] = []
    for part in parts:
        out.extend(part[table][column])
    return out
