"""What the cross-rank reduce needs of one rank, found where its file was parsed.

Steps (:func:`~tracekit.reconstruct.steps.step_table`) and compute actions
(:func:`~tracekit.reconstruct.actions.action_table`) read one rank's events only, so the
process that parsed a file can find them, on the file's columns without pandas
(:mod:`.event_arrays`), and send back those few thousand rows instead of the rank's events.
What the client still reads of the events is small: the rows that message matching, peer
inference and arrival estimates read (communication-library ops and ranges, framework P2P
ranges) and each rank's first and last row (the extent of the run).

A rank that records device work (kernels, copies) is measured on the device: with
``device=True`` it sends, beside its steps and actions (found on its host rows, CUDA API
calls aside, as the client would) and its message rows, its device timeline reduced
(:mod:`.device_rank`: each action's device span, each step folded to what the windows ask
of it, its P2P calls tied to their kernels) and the host-side busy rows a run without a
pipeline reports (:mod:`.plain`), so the client holds no row per device op, host op, kernel
or launch. Without ``device`` (an output that draws ops: the report) it sends its working set.

The one choice made across ranks is the label table (the first whose action rules match
an annotation anywhere in the run): each rank reports its annotation counts and the table
it would choose alone, and :func:`gather` uses the ranks' actions only where every rank
chose the table the whole run chooses, and where the ranks all reduced the same way (on
the device or on the host, and on the host all with a pipeline or all without). A host
rank with no action (a run without a pipeline) sends its steps, counts, message rows and
busy rows (:mod:`.plain`): what the client measures such a run by; without ``device`` its
working set.

An output that draws ops (the HTML report) asks for them before the files are read: a
reduced rank then keeps, beside the rows the client reads, the rows drawn (:func:`drawn_rows`),
so nothing is read again once the analysis says which ranks the page draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tracekit.model.names import GLOO_COLLECTIVE, TP_REGION
from tracekit.model.run import ACTION_COLUMNS, FIXED_COLUMN, STEP_COLUMNS
from tracekit.reconstruct.actions import UNLABELLED, action_table, annotation_counts
from tracekit.reconstruct.device_columns import op_columns
from tracekit.reconstruct.device_rank import DEVICE_ACTION_COLUMNS, join_ranks, reduce_ranks
from tracekit.reconstruct.event_arrays import DEVICE_CATEGORIES, LAUNCH_CATEGORY, EventArrays, has_device_work
from tracekit.reconstruct.labels import LabelChoice, LabelSet, choose, p2p_action, p2p_ways
from tracekit.reconstruct.plain import BubbleRow, plain_busy
from tracekit.reconstruct.recompute import recompute_rows
from tracekit.reconstruct.steps import step_table

if TYPE_CHECKING:  # numpy only at import: parser workers run rank_reduce; gather, in the client, loads pandas
    import pandas as pd

    from tracekit.model.device import DeviceSummary

# Names of the rows message matching and arrival estimates read (tracekit.reconstruct.p2p):
# the c10d and record_param_comms ops (sends, receives, and the comm ops whose ends delay a
# receiver's wait), the gloo:recv waits and ProcessGroupNCCL's titles ("nccl:send 0->1").
# message_rows keeps a few more: the figures per parallel dimension read them.
_MESSAGE_PREFIXES = ("c10d::", "record_param_comms", "gloo:recv", "nccl:send", "nccl:recv")
# The action columns a rank sends (action_id is numbered over the whole run).
_RANK_ACTION_COLUMNS = [c for c in ACTION_COLUMNS if c != "action_id"] + [FIXED_COLUMN]


def rank_reduce(
    events: EventArrays, labels: LabelSet | None, device: bool = False, world_size: int = 1
) -> tuple[dict[str, Any], np.ndarray] | None:
    """One rank's (or one file's) steps, actions and label counts as a dict of JSON values
    (and, for the device timeline, int64 arrays), and which of ``events`` the client still
    reads; None where the client needs the events themselves (a host rank with no action;
    device work without ``device``: see the module doc). ``world_size``: the job's size the
    file states (a pipeline of several ranks has its steps folded: :mod:`.device_rank`)."""
    if not len(events):
        return None
    on_device = has_device_work(events)
    if on_device and not device:
        return None
    steps = step_table(events)  # a rank without step marks spans all it recorded, launches too
    # CUDA API calls only link device work to the host: never an action's op (as on the client).
    host = events.take(~events.is_in("cat", (LAUNCH_CATEGORY,))) if on_device else events
    actions, choice, _ = action_table(host, steps, labels)
    plain = not on_device and not len(actions["action_id"])  # a host rank without a pipeline
    if plain and not device:
        return None  # an output that draws its host ops (the report) reads them
    reduced: dict[str, Any] = {
        "table": choice.used.name if choice.used is not None else None,
        "counts": annotation_counts(host),
        "device": on_device,
        "steps": {c: steps[c].tolist() for c in STEP_COLUMNS[:4]},
        "actions": {c: _as_list(actions[c]) for c in _RANK_ACTION_COLUMNS},
    }
    if on_device:
        # int64 arrays: pickled whole to the client, one base64 block each in the parse cache
        columns = op_columns(events, steps)
        ranks = np.unique(np.concatenate((columns["rank"], np.asarray(actions["rank"], dtype=np.int64))))
        found = reduce_ranks(columns, columns["names"], host, actions, {int(r): world_size for r in ranks})
        reduced["device_summary"] = found.part
        reduced["actions"].update({c: v.tolist() for c, v in found.action_columns.items()})
    if on_device or plain:  # what measure_plain gives on the client's host rows
        reduced["host_busy"] = [list(row) for row in plain_busy(host, steps)]
    return reduced, message_rows(events)


def _as_list(column: np.ndarray | list[Any]) -> list[Any]:
    return column.tolist() if isinstance(column, np.ndarray) else column


def message_rows(events: EventArrays) -> np.ndarray:
    """The rows the client reads once actions are known: communication-library ops and
    ranges on the host (sends, receives, ``gloo:recv`` waits, NCCL titles, the comm ops
    that delay a receiver's wait), framework ranges that say which way their P2P ops go or
    whose action's data they carry (``PP:4SEND_F4``),
    and each rank's earliest-starting and latest-ending row."""
    on_cpu = ~events["on_gpu"]
    keep: np.ndarray = on_cpu & events.starts_with(_MESSAGE_PREFIXES)
    keep |= on_cpu & events.per_name("name", lambda n: TP_REGION.match(n) is not None)  # a TP collective's span
    keep |= on_cpu & events.per_name("name", lambda n: GLOO_COLLECTIVE.match(n) is not None)  # ... its completion
    keep |= recompute_rows(events)  # activation recomputation: re-run forward ops and their backward ranges
    annotation = on_cpu & events.is_in("cat", ("user_annotation",))
    if annotation.any():
        keep |= annotation & events.per_name("name", lambda n: p2p_ways(n) is not None or p2p_action(n) is not None)
    ranks = events["rank"]
    starts, ends = events["start_ns"], events["end_ns"]
    for rank in np.unique(ranks):
        mine = np.flatnonzero(ranks == rank)
        keep[mine[np.argmin(starts[mine])]] = True
        keep[mine[np.argmax(ends[mine])]] = True
    return keep


def drawn_rows(events: EventArrays, reduced: dict[str, Any]) -> np.ndarray:
    """The rows of one rank (or file) :func:`rank_reduce` reduced to ``reduced`` that an output
    drawing ops draws: its device work (kernels, copies, sets) and, where it has no pipeline
    action, its host ops at the top of their threads or one below (a ``ProfilerStep`` mark and
    what it holds)."""
    keep: np.ndarray = events["on_gpu"] & events.is_in("cat", DEVICE_CATEGORIES)
    if not reduced["actions"]["rank"]:
        keep |= ~events["on_gpu"] & (events["depth"] <= 1)
    return keep


@dataclass
class Gathered:
    """The run's steps, actions and label choice, put together from its ranks."""

    steps: pd.DataFrame
    actions: pd.DataFrame
    choice: LabelChoice
    labelling: str
    annotations: dict[str, int]  # annotation_counts of the whole run (the ranks' summed)
    # Ranks reduced on the device: their device timeline (device_rank.join_ranks; the actions
    # carry their device spans, DEVICE_ACTION_COLUMNS) and the host-side busy rows of a run
    # without a pipeline (plain.plain_busy).
    device_summary: DeviceSummary | None = None
    host_busy: list[BubbleRow] | None = None


def run_choice(reduced: list[dict[str, Any] | None], labels: LabelSet | None) -> LabelChoice | None:
    """The label table the whole run chooses, from its ranks' counts; None when a rank sent
    events instead (no action of its own, or device work not reduced), when some ranks were
    reduced on the device and others on the host, or when a rank would choose another table
    alone (its actions are then not the run's)."""
    if not reduced or any(r is None for r in reduced):
        return None
    if len({bool(part.get("device")) for part in reduced if part is not None}) > 1:
        return None
    host = [part for part in reduced if part is not None and not part.get("device")]
    if len({"host_busy" in part for part in host}) > 1:
        return None  # host ranks with a pipeline beside host ranks without one
    ranks = [r for part in reduced if part is not None for r in set(part["steps"]["rank"])]
    if len(ranks) != len(set(ranks)):
        return None  # a rank in several files: what one file holds of it is not the rank
    choice = choose(run_annotations(reduced), labels)
    table = choice.used.name if choice.used is not None else None
    return choice if all(part is not None and part["table"] == table for part in reduced) else None


def run_annotations(reduced: Sequence[dict[str, Any] | None]) -> dict[str, int]:
    """The ranks' annotation counts summed (:func:`~.actions.annotation_counts` of the run)."""
    counts: dict[str, int] = {}
    for part in reduced:
        assert part is not None
        for name, n in part["counts"].items():
            counts[name] = counts.get(name, 0) + int(n)
    return dict(sorted(counts.items()))


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
    # Stable, as step_table's sort: marks of one rank and number stay in row order.
    steps = steps.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)
    labelling = f"{choice.used.name} labels ({choice.used.what})" if choice.used is not None else UNLABELLED
    found = Gathered(steps, pd.DataFrame(columns=ACTION_COLUMNS), choice, labelling, run_annotations(parts))
    device = bool(parts[0].get("device"))  # then every part is (run_choice)
    if device:
        found.device_summary = join_ranks([part["device_summary"] for part in parts])
    if all("host_busy" in part for part in parts):  # GPU ranks, or host ranks without a pipeline
        # each part's host_busy rows are BubbleRows, sent as lists
        rows = [cast(BubbleRow, tuple(int(v) for v in row)) for part in parts for row in part["host_busy"]]
        found.host_busy = sorted(rows, key=lambda row: row[0])  # stable: a rank's steps in table order
    if not any(part["actions"]["rank"] for part in parts):  # device ranks without a pipeline
        return found
    columns = _RANK_ACTION_COLUMNS + (list(DEVICE_ACTION_COLUMNS) if device else [])
    actions = pd.DataFrame({c: _joined(parts, "actions", c) for c in columns}, columns=columns)
    # Stable, as find_actions' sort: a rank's rows keep their order where start times tie.
    actions = actions.sort_values(["rank", "step", "start_ns"], kind="stable").reset_index(drop=True)
    actions["action_id"] = np.arange(len(actions))
    found.actions = actions[[*ACTION_COLUMNS, FIXED_COLUMN] + (list(DEVICE_ACTION_COLUMNS) if device else [])]
    return found


def _joined(parts: list[dict[str, Any]], table: str, column: str) -> list[Any]:
    """One column of every rank's table, as one list (one frame is built, not one a rank)."""
    out: list[Any] = []
    for part in parts:
        out.extend(part[table][column])
    return out
