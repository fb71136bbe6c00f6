"""Compute actions (F / B / I / W with stage and microbatch) from each rank's events.

Labelled runs: the ranges named by a label table (:mod:`.labels`: torch.distributed.
pipelining's ``PP:<stage><kind><mb>`` and ``OVERLAP_F_B``, ScheduleGPipe's ``Forward <mb>``,
hand-labelled layers such as ``attn(F)``, Megatron's ``forward_step`` / ``backward_step``
Python frames, or the user's own rules). Unlabelled runs (native Schedule1F1B, Megatron-core
and DeepSpeed without ``with_stack``): the main thread's top-level ops are segmented at its
point-to-point and other communication ops, forward runs being non-autograd ops and
backward runs autograd ones.

A Python frame holds the ops it called, but it is no op: its depth is that of the ops it
holds (ingest's nesting leaves them where they were without frames), and no rule here
reads a frame as an op.

A label's span includes the receive wait at its start and sends at its end; the compute
span is that of the top-level compute ops inside it (host time around them, between the
wait's return and the first op, counts as idle and is attributed as overhead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.ingest.columns import take_rows
from tracekit.model.groups import group_ids, split_by
from tracekit.model.names import (
    COMM_PREFIXES,
    FRAME_CATEGORY,
    RECV_NAMES,
    SEND_NAMES,
    STEP_MARK_PREFIX,
    is_action_frame,
)
from tracekit.model.run import ACTION_COLUMNS, FIXED_COLUMN
from tracekit.reconstruct.event_arrays import EventArrays
from tracekit.reconstruct.fixed_part import fixed_ns
from tracekit.reconstruct.labels import LabelChoice, LabelRule, LabelSet, choose
from tracekit.reconstruct.steps import step_of

if TYPE_CHECKING:
    import pandas as pd


# What label rules read: annotations, and the Python frames of action entry points (not the
# nn.Module frames ingest keeps beside them: those name layers, tracekit.analyze.layers).
def _label_rows(events: EventArrays) -> np.ndarray:
    frames = events.is_in("cat", (FRAME_CATEGORY,)) & events.per_name("name", is_action_frame)
    rows: np.ndarray = ~events["on_gpu"] & (events.is_in("cat", ("user_annotation",)) | frames)
    return rows


_OPTIMIZER_PREFIXES = ("Optimizer.", "Optimizer#")
UNLABELLED = "unlabelled (segmented at P2P ops)"
# The columns of a row as the finders make them: ACTION_COLUMNS less action_id and order.
_ROW_COLUMNS = [c for c in ACTION_COLUMNS if c not in ("action_id", "order")]
_STRING_ACTION_COLUMNS = ("kind", "label")
_Row = tuple[Any, ...]  # one action: its _ROW_COLUMNS values, in order
_Columns = dict[str, np.ndarray]  # rows as columns, one array each


def is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


@dataclass
class _Span:
    start: int
    end: int
    of_ops: bool = True  # False: no compute op in the label, its span from its waits and comm ops


def annotation_counts(events: pd.DataFrame | EventArrays) -> dict[str, int]:
    """Each distinct CPU annotation or kept Python frame name (step marks aside) and how
    often it occurs, by name."""
    arrays = EventArrays.of(events)
    names = arrays.values["name"]
    wanted = _label_rows(arrays)
    counts = np.bincount(arrays.codes["name"][wanted], minlength=len(names)).tolist()
    found = [(names[code], n) for code, n in enumerate(counts) if n and not names[code].startswith(STEP_MARK_PREFIX)]
    return dict(sorted(found))


def find_actions(
    events: pd.DataFrame, steps: pd.DataFrame, custom: LabelSet | None = None
) -> tuple[pd.DataFrame, LabelChoice, str]:
    """:func:`action_table` of an events table and its steps, as a table."""
    import pandas as pd

    table, choice, labelling = action_table(EventArrays.of(events), steps, custom)
    if not len(table["action_id"]):
        return pd.DataFrame(columns=ACTION_COLUMNS), choice, labelling
    return pd.DataFrame(table, columns=[*ACTION_COLUMNS, FIXED_COLUMN]), choice, labelling


def action_table(
    events: EventArrays, steps: pd.DataFrame | Mapping[str, Any], custom: LabelSet | None = None
) -> tuple[dict[str, Any], LabelChoice, str]:
    """All compute actions of the events (columns :data:`~tracekit.model.run.ACTION_COLUMNS`
    and ``fixed_ns``, :mod:`.fixed_part`:
    numbers as int64 arrays, ``kind`` and ``label`` as lists of strings; sorted by rank,
    step and start), the label table chosen (:mod:`.labels`), and how the actions were
    found (a phrase for the schedule's evidence). ``steps``: their step table."""
    on_cpu = ~events["on_gpu"]
    frame = events.is_in("cat", (FRAME_CATEGORY,))
    choice = choose(annotation_counts(events), custom)
    labelling = UNLABELLED
    if choice.used is not None:
        rows = _labelled(events, on_cpu, frame, steps, choice.used)
        labelling = f"{choice.used.name} labels ({choice.used.what})"
    else:
        rows = _segment_unlabelled(events, on_cpu & ~frame, steps)
    table = _numbered(rows)
    table[FIXED_COLUMN] = fixed_ns(events, table)
    return table, choice, labelling


def _labelled(
    events: EventArrays,
    on_cpu: np.ndarray,
    frame: np.ndarray,
    steps: pd.DataFrame | Mapping[str, Any],
    table: LabelSet,
) -> list[_Row]:
    """The actions of the ranges (or Python frames: ``frame``) ``table``'s action rules name."""
    is_label = _label_rows(events)
    names = events.values["name"]
    codes = events.codes["name"]
    rule_of_name: dict[str, LabelRule] = {}
    for code in np.unique(codes[is_label]).tolist():
        rule = table.match(names[code])
        if rule is not None and rule.is_action:
            rule_of_name[names[code]] = rule
    found = is_label & events.per_name("name", rule_of_name.__contains__)
    # Only the labelled threads' ops and the receive waits matter: no copy of the rest.
    thread = group_ids(events["rank"], events["pid"], events["tid"])
    is_wait = events.is_in("name", ("gloo:recv",))
    ops = on_cpu & ~frame
    wanted = ops & (np.isin(thread, thread[found]) | is_wait)
    engine = ops & ~wanted & (events["depth"] == 0) & events.starts_with("autograd::engine")
    rows = _from_labels(events, wanted, found, thread, on_cpu & is_wait, steps, rule_of_name, engine, frame)
    if table.placed_by_chains:
        rows = _tie_backwards(rows, events, ops)
    elif any(rule.layer_level for rule in rule_of_name.values()):
        rows = _group_layers(rows, events, on_cpu, rule_of_name)
    return rows


def _numbered(rows: list[_Row]) -> dict[str, Any]:
    """The rows as columns, sorted by rank, step and start (stable: found order where they
    tie), with the microbatches labels did not name counted (:func:`_count_microbatches`),
    each action's ``order`` on its rank within the step and ``action_id``."""
    columns: dict[str, Any] = {}
    parts = list(zip(*rows)) if rows else [()] * len(_ROW_COLUMNS)
    for name, values in zip(_ROW_COLUMNS, parts):
        columns[name] = list(values) if name in _STRING_ACTION_COLUMNS else np.array(values, dtype=np.int64)
    order = np.lexsort((columns["start_ns"], columns["step"], columns["rank"]))
    for name in _ROW_COLUMNS:
        values = columns[name]
        columns[name] = [values[i] for i in order.tolist()] if name in _STRING_ACTION_COLUMNS else values[order]
    _count_microbatches(columns)
    n = len(order)
    # sorted, each rank's step is one run of rows: an action's order is its place in it
    starts = np.ones(n, dtype=bool)
    if n:
        starts[1:] = (np.diff(columns["rank"]) != 0) | (np.diff(columns["step"]) != 0)
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    columns["order"] = np.arange(n, dtype=np.int64) - first
    columns["action_id"] = np.arange(n, dtype=np.int64)
    return {c: columns[c] for c in ACTION_COLUMNS}


def _count_microbatches(columns: dict[str, Any]) -> None:
    """Microbatches a label did not name (-1): the order of appearance per rank, step, stage
    and kind (forwards and backwards both run microbatches in order in every schedule that
    hand-labelled layer ranges come from: GPipe, 1F1B)."""
    microbatch = columns["microbatch"]
    unknown = np.flatnonzero(microbatch < 0).tolist()
    if not unknown:
        return
    seen: dict[tuple[int, int, int, str], int] = {}
    rank, step, stage, kind = columns["rank"], columns["step"], columns["stage"], columns["kind"]
    for i in unknown:
        key = (int(rank[i]), int(step[i]), int(stage[i]), kind[i])
        microbatch[i] = seen.get(key, 0)
        seen[key] = int(microbatch[i]) + 1


def _from_labels(
    events: EventArrays,
    wanted: np.ndarray,
    found: np.ndarray,
    thread: np.ndarray,
    is_wait: np.ndarray,
    steps: pd.DataFrame | Mapping[str, Any],
    rule_of_name: dict[str, LabelRule],
    engine: np.ndarray,
    frame: np.ndarray,
) -> list[_Row]:
    """Actions from labels (rows ``found``), with the ops of their threads (among rows
    ``wanted``; ``thread``: each row's thread as a number). ``engine``: top-level autograd
    ops on other threads (on GPUs the autograd engine runs backward on a thread of its own
    while the labelled thread waits): those inside a label are its compute too. A label that
    is a Python frame (``frame``) holds the ops of its own depth, a range those one down."""
    rows: list[_Row] = []
    ranks, starts_all, ends_all = events["rank"], events["start_ns"], events["end_ns"]
    engine_spans = {}
    for r, group in _by_key(np.flatnonzero(engine), ranks).items():
        by_start = group[np.argsort(starts_all[group], kind="stable")]
        engine_spans[r] = (starts_all[by_start], ends_all[by_start])
    waits = {r: np.sort(ends_all[g]) for r, g in _by_key(np.flatnonzero(is_wait), ranks).items()}
    comm = events.per_name("name", is_comm)
    autograd = events.starts_with("autograd::engine")
    depth_all, file_ids, sources = events["depth"], events["file_id"], events["source_index"]
    label_rows = _by_key(np.flatnonzero(found), thread)
    # threads in the order of their first wanted row (the table's order), labels in row order
    for mine in sorted(_by_key(np.flatnonzero(wanted), thread).values(), key=lambda g: int(g[0])):
        labels = label_rows.get(int(thread[mine[0]]))
        if labels is None:
            continue
        mine = mine[np.argsort(starts_all[mine], kind="stable")]
        starts, ends, depths = starts_all[mine], ends_all[mine], depth_all[mine]
        is_comm_op, is_autograd = comm[mine], autograd[mine]
        rank = int(ranks[labels[0]])
        label_starts, label_ends = starts_all[labels], ends_all[labels]
        # each label's ops (by start), its last receive wait and the engine's ops inside it
        op_lo = np.searchsorted(starts, label_starts, side="left").tolist()
        op_hi = np.searchsorted(starts, label_ends, side="right").tolist()
        wait_ends = _last_within(waits.get(rank), label_starts, label_ends)
        engine_of_rank = engine_spans.get(rank)
        if engine_of_rank is not None:
            engine_lo = np.searchsorted(engine_of_rank[0], label_starts, side="left").tolist()
            engine_hi = np.searchsorted(engine_of_rank[0], label_ends, side="right").tolist()
        label_steps = step_of(ranks[labels], label_starts, steps).tolist()
        child_depths = (depth_all[labels].astype(np.int64) + 1 - frame[labels]).tolist()
        parsed: dict[str, list[tuple[str, int, int]] | None] = {}  # a thread's rank is one: parse a name once
        columns = zip(label_steps, events.names(labels), label_starts.tolist(), label_ends.tolist())
        for k, (step, name, label_start, label_end) in enumerate(columns):
            if name not in parsed:
                parsed[name] = rule_of_name[name].parse(name, rank)
            parts = parsed[name]
            if not parts:
                continue
            lo, hi = op_lo[k], op_hi[k]
            inside = lo + np.flatnonzero((ends[lo:hi] <= label_end) & (depths[lo:hi] == child_depths[k]))
            span = _compute_span(label_start, label_end, inside, starts, ends, is_comm_op, wait_ends[k])
            if engine_of_rank is not None:
                span = _with_engine(span, label_end, engine_of_rank, engine_lo[k], engine_hi[k])
            # a fused F+B range splits at its first autograd op
            spans = [(span.start, span.end)]
            if len(parts) == 2:
                split = _first_backward_start(inside, starts, is_autograd, span)
                spans = [(span.start, split), (split, span.end)]
            label = int(labels[k])
            for (kind, stage, mb), (s, e) in zip(parts, spans):
                rows.append(
                    (
                        rank,
                        step,
                        kind,
                        stage,
                        mb,
                        s,
                        e,
                        label_start,
                        label_end,
                        name,
                        int(file_ids[label]),
                        int(sources[label]),
                    )
                )
    return rows


def _tie_backwards(rows: list[_Row], events: EventArrays, ops: np.ndarray) -> list[_Row]:
    """The actions of a table placed by chains, numbered as the segmentation numbers its own
    (what :func:`~.chains.restage_from_chains` reads): each forward's microbatch its index
    among the forwards of its rank and step, each backward's the index of the forward whose
    autograd sequence numbers its ops consume (-1 where none does: counted in order then).

    Autograd numbers nodes in creation order on the forward's thread, so a forward's nodes
    start at the lowest number among its ops (``ops``: the ops, frames aside), and an engine
    op of number ``q`` ran a node of the last forward starting at or below it. A backward
    takes the forward most of its numbered engine ops ran (on a GPU they run on the engine's
    thread, inside the backward's frame in time)."""
    numbered = ops & (events["seq"] >= 0)
    is_engine = events.starts_with("autograd::engine")
    forward_ops = _numbers_by_start(events, numbered & ~is_engine)
    engine_ops = _numbers_by_start(events, numbered & is_engine)
    index: dict[int, int] = {}  # row -> its index among its rank's and step's forwards
    seen: dict[tuple[int, int], int] = {}
    for i in sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], rows[i][5])):
        if rows[i][2] == "F":
            key = (rows[i][0], rows[i][1])
            index[i] = seen.get(key, 0)
            seen[key] = index[i] + 1
    first: dict[int, list[tuple[int, int]]] = {}  # rank -> (lowest number, forward row), by number
    for i in index:
        numbers = _numbers_within(forward_ops.get(rows[i][0]), rows[i][7], rows[i][8])
        if len(numbers):
            first.setdefault(rows[i][0], []).append((int(numbers.min()), i))
    for pairs in first.values():
        pairs.sort()
    out = []
    for i, row in enumerate(rows):
        mb = index[i] if row[2] == "F" else -1
        forwards = first.get(row[0])
        if row[2] != "F" and forwards is not None:
            numbers = _numbers_within(engine_ops.get(row[0]), row[7], row[8])
            at = np.searchsorted([q for q, _ in forwards], numbers, side="right") - 1
            owners = [forwards[k][1] for k in at.tolist() if k >= 0 and rows[forwards[k][1]][1] == row[1]]
            if owners:  # most of them; a tie: the earliest forward
                mb = index[max(sorted(set(owners)), key=owners.count)]
        out.append((*row[:4], mb, *row[5:]))
    return out


def _numbers_by_start(events: EventArrays, mask: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank, the starts (sorted) and sequence numbers of the rows under ``mask``."""
    starts, seq = events["start_ns"], events["seq"]
    out = {}
    for rank, group in _by_key(np.flatnonzero(mask), events["rank"]).items():
        group = group[np.argsort(starts[group], kind="stable")]
        out[rank] = (starts[group], seq[group])
    return out


def _numbers_within(found: tuple[np.ndarray, np.ndarray] | None, lo: int, hi: int) -> np.ndarray:
    """The sequence numbers of the rows (``_numbers_by_start``'s) that start within [lo, hi]."""
    if found is None:
        return _NONE
    starts, numbers = found
    return numbers[np.searchsorted(starts, lo, side="left") : np.searchsorted(starts, hi, side="right")]


def _last_within(times: np.ndarray | None, starts: np.ndarray, ends: np.ndarray) -> list[int | None]:
    """For each span [start, end], the latest of the sorted ``times`` within it (None: none)."""
    if times is None or not len(times):
        return [None] * len(starts)
    lo = np.searchsorted(times, starts, side="left")
    hi = np.searchsorted(times, ends, side="right")
    last = times[np.maximum(hi - 1, 0)].tolist()
    return [t if b > a else None for t, a, b in zip(last, lo.tolist(), hi.tolist())]


def _by_key(rows: np.ndarray, keys: np.ndarray) -> dict[int, np.ndarray]:
    """``rows`` (indices) by their ``keys`` value, each group's rows in row order."""
    return split_by(keys[rows], rows)


def _group_layers(
    rows: list[_Row], events: EventArrays, on_cpu: np.ndarray, rule_of_name: dict[str, LabelRule]
) -> list[_Row]:
    """Layer-level ranges (no microbatch in the name) as actions: consecutive ranges of one
    kind and stage in one step of a rank, with no point-to-point op starting between them,
    are one action (a run of ``attn(F)``, ``mlp(F)`` is one forward)."""
    p2p = np.flatnonzero(on_cpu & events.is_in("name", SEND_NAMES + RECV_NAMES))
    p2p_starts = {r: np.sort(events["start_ns"][g]) for r, g in _by_key(p2p, events["rank"]).items()}
    out: list[_Row] = []
    layer_level = {name: rule.layer_level for name, rule in rule_of_name.items()}
    layer_rows = sorted((r for r in rows if layer_level[r[9]]), key=lambda r: (r[0], r[7]))
    out.extend(r for r in rows if not layer_level[r[9]])
    current: list[Any] | None = None
    for row in layer_rows:
        rank, step, kind, stage = row[0], row[1], row[2], row[3]
        if current is not None and (current[0], current[1], current[2], current[3]) == (rank, step, kind, stage):
            starts = p2p_starts.get(rank)
            between = starts is not None and bool(
                np.searchsorted(starts, row[7], side="left") - np.searchsorted(starts, current[8], side="left")
            )
            if not between:
                current[5] = min(current[5], row[5])
                current[6] = max(current[6], row[6])
                current[8] = max(current[8], row[8])
                continue
        if current is not None:
            out.append(tuple(current))
        current = list(row)
    if current is not None:
        out.append(tuple(current))
    return out


def _with_engine(span: _Span, label_end: int, engine: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> _Span:
    """The span widened to the autograd engine's ops that ran inside the label (``engine``:
    their starts, sorted, and ends; ``lo``:``hi``: those starting inside the label)."""
    e_start, e_end = engine
    ends = e_end[lo:hi]
    ends = ends[ends <= label_end]
    if not len(ends):
        return span
    first, last = int(e_start[lo]), int(ends.max())
    # No compute on the labelled thread: the engine's ops are the compute. The label's own
    # span then says nothing: a send posted after the backward (a batch_isend_irecv whose
    # nccl:coalesced range ends before the label does) would stretch the action past it.
    if not span.of_ops or span.end <= span.start:
        return _Span(first, last)
    return _Span(min(span.start, first), max(span.end, last))


def _compute_span(
    label_start: int,
    label_end: int,
    inside: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    is_comm_op: np.ndarray,
    wait_end: int | None,
) -> _Span:
    """The span of the label's top-level compute ops (``inside``: its thread's ops one level
    down, by start). A label with no compute op inside (an empty input-grad, say) counts
    from the end of its receive wait (``wait_end``: the last that ended inside it) to its end."""
    compute = inside[~is_comm_op[inside]]
    if len(compute):
        return _Span(int(starts[compute[0]]), int(ends[compute].max()))
    start, end = label_start, label_end
    if wait_end is not None:
        start = max(start, wait_end)
    if len(inside):  # every op inside is a communication op here
        start = max(start, int(np.minimum(ends[inside], end).max()))
    return _Span(start, max(start, end), of_ops=False)


def _first_backward_start(inside: np.ndarray, starts: np.ndarray, is_autograd: np.ndarray, span: _Span) -> int:
    backward = inside[is_autograd[inside] & (starts[inside] >= span.start)]
    if len(backward):
        return int(starts[backward[0]])
    return (span.start + span.end) // 2


def _segment_unlabelled(events: EventArrays, on_cpu: np.ndarray, steps: pd.DataFrame | Mapping[str, Any]) -> list[_Row]:
    """Native Schedule1F1B: runs of top-level ops between c10d ops on the main thread.

    A forward run counts only if one of its ops made an autograd node a backward in the
    trace ran (shared sequence number): that drops batch splitting, ``detach_`` after
    sending and gradient scaling. A backward's microbatch is the forward whose nodes it runs.
    Which op made a node is read from every op with a number, nested ones too
    (:func:`_node_makers`), not from the top-level op alone: a composite op such as
    ``aten::linear`` may carry no number while the ``aten::t`` and ``aten::addmm`` inside it
    make the nodes.
    """
    rows: list[_Row] = []
    classes = events.per_name("name", _op_class, dtype=np.int8)
    is_annotation = events.is_in("cat", ("user_annotation",))
    is_mark = is_annotation & events.starts_with(STEP_MARK_PREFIX)
    is_backward = (classes == _BACKWARD) & (events["seq"] >= 0)
    is_p2p = events.is_in("name", SEND_NAMES + RECV_NAMES)
    if not (is_mark & on_cpu).any() or not (is_p2p & on_cpu).any():
        return rows  # no step marks or no point-to-point ops: nothing to segment
    columns = {
        c: events[c] for c in ("rank", "pid", "tid", "depth", "start_ns", "end_ns", "seq", "file_id", "source_index")
    }
    columns["class"] = classes
    # Ranges a user or framework wraps around work (a whole-step "train_step" or "1F1B",
    # Megatron's warmup / steady / cooldown phases) hold the ops to segment, not an op.
    columns["wrapper"] = is_annotation & (classes == _FORWARD) & ~is_mark
    is_mark, is_backward, is_p2p = is_mark & on_cpu, is_backward & on_cpu, is_p2p & on_cpu
    by_key = _sorted_groups(columns, on_cpu, ("rank", "pid", "tid", "depth"))
    # On GPUs the autograd engine runs backward on a thread of its own: its top-level ops
    # join the main thread's in time order (while they run, the main thread waits in them).
    engine_top = _sorted_groups(columns, is_backward & (columns["depth"] == 0), ("rank", "pid", "tid"))
    marks = _sorted_groups(columns, is_mark, ("rank",))
    backward = _sorted_groups(columns, is_backward, ("rank",))
    makers = _node_makers(columns, on_cpu)
    p2p = _sorted_groups(columns, is_p2p, ("rank",))
    step_rows = zip(*[np.asarray(steps[c]).tolist() for c in ("rank", "step", "step_start_ns", "step_end_ns")])
    for rank, step_number, lo_t, hi_t in step_rows:
        if rank not in marks or rank not in p2p or not len(_slice(p2p[rank], lo_t, hi_t)["start_ns"]):
            continue  # forward and backward without point-to-point messages is no pipeline
        mark = _slice(marks[rank], lo_t, lo_t)
        if not len(mark["start_ns"]):
            continue
        key = (rank, int(mark["pid"][0]), int(mark["tid"][0]), int(mark["depth"][0]) + 1)
        if key not in by_key:
            continue
        ops = _with_made(_unwrapped(_slice(by_key[key], lo_t, hi_t), by_key, key), makers.get(key[:3]))
        for (e_rank, _, e_tid), engine in engine_top.items():
            if e_rank == rank and e_tid != key[2]:
                ops = _merged(ops, _with_made(_slice(engine, lo_t, hi_t), None))
        inside = ops["end_ns"] <= hi_t
        ops = {c: v[inside] for c, v in ops.items()}
        back = _slice(backward[rank], lo_t, hi_t) if rank in backward else {}
        has_backward = {
            q for q, e in zip(back.get("seq", _NONE).tolist(), back.get("end_ns", _NONE).tolist()) if e <= hi_t
        }
        forward_of_seq: dict[int, int] = {}
        n_forward = 0
        seq = ops["seq"].tolist()  # Python ints: the loops below read them one by one
        made = _made_lists(ops)
        for kind, lo, hi in _split_by_autograd(_runs(ops["class"]), seq, made):
            seqs = {q for q in seq[lo:hi] if q >= 0}
            if kind == "F":
                # The forward proper: from the first to the last op that made a node a
                # backward ran. Host work around it on the same thread (a framework loading
                # the batch, scaling the loss, seeding the gradient) is not the stage's
                # compute; a run with no such op is bookkeeping between actions, no forward.
                core = [i for i in range(lo, hi) if not has_backward.isdisjoint(made[i])]
                if not core:
                    continue
                lo, hi = core[0], core[-1] + 1
                seqs = {q for i in range(lo, hi) for q in made[i]}
                mb = n_forward
                n_forward += 1
                for q in seqs:
                    forward_of_seq[q] = mb
            else:
                owners = [forward_of_seq[q] for q in seqs if q in forward_of_seq]
                if not owners:
                    continue
                mb = max(set(owners), key=owners.count)
            first, last = int(ops["start_ns"][lo]), int(ops["end_ns"][lo:hi].max())
            rows.append(
                (
                    rank,
                    step_number,
                    kind,
                    rank,
                    mb,
                    first,
                    last,
                    first,
                    last,
                    "",
                    int(ops["file_id"][lo]),
                    int(ops["source_index"][lo]),
                )
            )
    return rows


def _unwrapped(ops: _Columns, by_key: dict[Any, _Columns], key: tuple[int, int, int, int], limit: int = 8) -> _Columns:
    """The ops of a thread's level with every wrapping range replaced by what it holds
    (the ops one level down inside it), down to ``limit`` levels."""
    rank, pid, tid, depth = key
    for level in range(depth + 1, depth + 1 + limit):
        wrap = ops["wrapper"]
        if not wrap.any():
            return ops
        inner = by_key.get((rank, pid, tid, level))
        kept = {c: v[~wrap] for c, v in ops.items()}
        if inner is None:
            return kept
        for start, end in zip(ops["start_ns"][wrap], ops["end_ns"][wrap]):
            held = _slice(inner, int(start), int(end))
            inside = held["end_ns"] <= end
            kept = _merged(kept, {c: v[inside] for c, v in held.items()})
        ops = kept
    return ops


def _split_by_autograd(
    runs: list[tuple[str, int, int]], seq: list[int], made: list[range]
) -> list[tuple[str, int, int]]:
    """Runs that hold two actions, split where the autograd sequence numbers say so.

    Runs break at communication ops on the segmented thread. A send posted from another
    thread (async communication, a sender thread) leaves no break there, so two forwards in
    a row (warm-up on the first stage) would read as one. Autograd numbers its nodes in
    creation order and a backward visits its forward's nodes from the last: so a new
    backward starts where a node's number exceeds every number of the backward so far
    (gradient accumulators, numbered once at the first forward, never do), and a forward
    run splits where its ops' nodes (``made``: the numbers of the nodes each op made) start
    belonging to another backward."""
    pieces: list[tuple[str, int, int]] = []
    for kind, lo, hi in runs:
        if kind != "B":
            pieces.append((kind, lo, hi))
            continue
        start, top = lo, -1
        for i in range(lo, hi):
            q = seq[i]
            if q < 0:
                continue
            if top >= 0 and q > top:
                pieces.append(("B", start, i))
                start = i
            top = q if start == i or top < 0 else max(top, q)
        pieces.append(("B", start, hi))
    owner: dict[int, int] = {}
    for n, (kind, lo, hi) in enumerate(pieces):
        if kind == "B":
            owner.update((q, n) for q in seq[lo:hi] if q >= 0)
    out: list[tuple[str, int, int]] = []
    for kind, lo, hi in pieces:
        if kind != "F":
            out.append((kind, lo, hi))
            continue
        start, current = lo, None
        for i in range(lo, hi):
            who = next((owner[q] for q in made[i] if q in owner), None)
            if who is None:
                continue
            if current is not None and who != current:
                out.append(("F", start, i))
                start = i
            current = who
        out.append(("F", start, hi))
    return out


def _node_makers(columns: _Columns, on_cpu: np.ndarray) -> dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]]:
    """Per thread (rank, pid, tid): when each autograd node was made and its number, both
    sorted by that time.

    An op records the number the next node made on its thread will get (autograd numbers
    nodes per thread, in creation order), whether it makes that node or not: ``aten::linear``
    and the ``aten::t`` inside it both record n and the ``aten::t`` makes node n; a
    ``detach`` before a send records the number the next microbatch's first node gets. So
    the op that made node n is the last forward op to record n, at any depth; ops inside a
    backward (which record the number of the node they run) and communication ops are not
    forward ops."""
    classes, seq = columns["class"], columns["seq"]
    thread_keys = ("rank", "pid", "tid")
    backward = _sorted_groups(columns, on_cpu & (classes == _BACKWARD), thread_keys)
    numbered = _sorted_groups(columns, on_cpu & (classes == _FORWARD) & (seq >= 0), thread_keys)
    out = {}
    for key, ops in numbered.items():
        starts, depth, numbers = ops["start_ns"], ops["depth"], ops["seq"]
        spans = backward.get(key)
        if spans is not None:  # on CPUs the backward runs on the forward's thread
            at = np.searchsorted(spans["start_ns"], starts, side="right") - 1
            reach = np.maximum.accumulate(spans["end_ns"])
            forward = (at < 0) | (reach[np.maximum(at, 0)] <= starts)
            starts, depth, numbers = starts[forward], depth[forward], numbers[forward]
        order = np.lexsort((depth, starts, numbers))  # by number, then time: a number's last is its maker
        numbers, starts = numbers[order], starts[order]
        last = np.ones(len(numbers), dtype=bool)
        last[:-1] = numbers[1:] != numbers[:-1]
        numbers, starts = numbers[last], starts[last]
        by_time = np.argsort(starts, kind="stable")
        out[key] = (starts[by_time], numbers[by_time])
    return out


def _with_made(ops: _Columns, makers: tuple[np.ndarray, np.ndarray] | None) -> _Columns:
    """The ops with the range of node numbers each made (``made_lo``..``made_hi``, -1: none):
    the nodes made while it ran, forward ops only. A thread's numbers grow with time, so an
    op's are one range."""
    n = len(ops["start_ns"])
    lo, hi = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    if makers is not None and n:
        times, numbers = makers
        a = np.searchsorted(times, ops["start_ns"], side="left")
        b = np.searchsorted(times, ops["end_ns"], side="right")
        some = (b > a) & (ops["class"] == _FORWARD)
        lo[some] = numbers[a[some]]
        hi[some] = numbers[b[some] - 1]
    return {**ops, "made_lo": lo, "made_hi": hi}


def _made_lists(ops: _Columns) -> list[range]:
    return [
        range(lo, hi + 1) if lo >= 0 else range(0) for lo, hi in zip(ops["made_lo"].tolist(), ops["made_hi"].tolist())
    ]


def _sorted_groups(columns: _Columns, mask: np.ndarray, keys: tuple[str, ...]) -> dict[Any, _Columns]:
    """Rows under ``mask`` grouped by ``keys``, each group's arrays sorted by start."""
    picked = take_rows(columns, mask)
    order = np.lexsort((picked["start_ns"], *[picked[k] for k in reversed(keys)]))
    picked = take_rows(picked, order)
    groups: dict[Any, dict[str, np.ndarray]] = {}
    if not len(order):
        return groups
    key_cols = np.stack([picked[k] for k in keys], axis=1)
    change = np.flatnonzero(np.any(key_cols[1:] != key_cols[:-1], axis=1)) + 1
    bounds = np.concatenate(([0], change, [len(order)]))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        key = tuple(int(x) for x in key_cols[lo])
        groups[key[0] if len(keys) == 1 else key] = {c: v[lo:hi] for c, v in picked.items()}
    return groups


def _merged(a: _Columns, b: _Columns) -> _Columns:
    """Two sorted groups of rows as one, sorted by start."""
    if not len(b["start_ns"]):
        return a
    joined = {c: np.concatenate((a[c], b[c])) for c in a}
    order = np.argsort(joined["start_ns"], kind="stable")
    return {c: v[order] for c, v in joined.items()}


def _slice(group: _Columns, lo: int, hi: int) -> _Columns:
    """The rows of a sorted group that start within [lo, hi]."""
    a = np.searchsorted(group["start_ns"], lo, side="left")
    b = np.searchsorted(group["start_ns"], hi, side="right")
    return {c: v[a:b] for c, v in group.items()}


def _runs(classes: np.ndarray) -> list[tuple[str, int, int]]:
    """Split a thread's top-level ops (sorted by start, as classes) into runs of forward (F)
    or autograd (B) ops, broken at communication and optimizer ops: (kind, first, end)."""
    change = np.flatnonzero(np.diff(classes)) + 1
    bounds = np.concatenate(([0], change, [len(classes)]))
    return [
        ("F" if classes[lo] == _FORWARD else "B", int(lo), int(hi))
        for lo, hi in zip(bounds[:-1], bounds[1:])
        if hi > lo and classes[lo] != _BREAK
    ]


_BREAK, _FORWARD, _BACKWARD = 0, 1, 2
_NONE = np.zeros(0, dtype=np.int64)


def _op_class(name: str) -> int:
    if is_comm(name) or name.startswith(_OPTIMIZER_PREFIXES):
        return _BREAK
    return _BACKWARD if name.startswith("autograd::engine") else _FORWARD
