"""Compute actions (F / B / I / W with stage and microbatch) from each rank's events.

Three labellings are understood (see shared/docs/trace-formats.md):

- ``PP:<stage><F|I|B|W><mb>`` from torch.distributed.pipelining's runtime schedules, and
  ``PP:(<s>F<mb>;<s>B<mb>)OVERLAP_F_B`` (DualPipeV), split at the first autograd op;
- ``Forward <mb>`` / ``Backward <mb>`` from the native ScheduleGPipe (stage = rank);
- nothing at all (native Schedule1F1B): the main thread's top-level ops are segmented at
  ``c10d::`` ops, forward runs being non-autograd ops and backward runs autograd ones.

A label's span includes the receive wait at its start and sends at its end; the compute
span is that of the top-level compute ops inside it (host time around them, between the
wait's return and the first op, counts as idle and is attributed as overhead).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.model.run import ACTION_COLUMNS

PP_ACTION = re.compile(r"^PP:(\d+)(F|I|B|W)(\d+)$")
PP_OVERLAP = re.compile(r"^PP:\((\d+)F(\d+);(\d+)B(\d+)\)OVERLAP_F_B$")
NATIVE_LABEL = re.compile(r"^(Forward|Backward) (\d+)$")
COMM_PREFIXES = ("c10d::", "gloo:", "record_param_comms", "nccl:", "tracekit:p2p", "PP:")
_LABEL_CATS = ("user_annotation",)
_OPTIMIZER_PREFIXES = ("Optimizer.", "Optimizer#")
_P2P_OPS = ("c10d::send", "c10d::recv_", "record_param_comms:send", "record_param_comms:recv")


def is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


@dataclass
class _Span:
    start: int
    end: int


def find_actions(events: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """All compute actions of the run, and which labelling they came from."""
    cpu = events[~events["on_gpu"]]
    labels = cpu[cpu["cat"].isin(_LABEL_CATS)]
    pp = labels[labels["name"].str.match(r"^PP:(\d+[FIBW]\d+|\(.*\)OVERLAP_F_B)$")]
    native = labels[labels["name"].str.match(NATIVE_LABEL.pattern)]
    if len(pp):
        rows, labelling = _from_labels(cpu, pp, steps, _parse_pp), "PP: labels"
    elif len(native):
        rows, labelling = _from_labels(cpu, native, steps, _parse_native), "Forward/Backward labels"
    else:
        rows, labelling = _segment_unlabelled(cpu, steps), "unlabelled (segmented at c10d ops)"
    actions = pd.DataFrame(rows, columns=[c for c in ACTION_COLUMNS if c not in ("action_id", "order")])
    if len(actions) == 0:
        return pd.DataFrame(columns=ACTION_COLUMNS), labelling
    actions = actions.sort_values(["rank", "step", "start_ns"]).reset_index(drop=True)
    actions["order"] = actions.groupby(["rank", "step"]).cumcount()
    actions["action_id"] = np.arange(len(actions))
    return actions[ACTION_COLUMNS], labelling


def _parse_pp(name: str, rank: int) -> list[tuple[str, int, int]]:
    match = PP_ACTION.match(name)
    if match:
        return [(match.group(2), int(match.group(1)), int(match.group(3)))]
    match = PP_OVERLAP.match(name)
    if match:
        return [("F", int(match.group(1)), int(match.group(2))),
                ("B", int(match.group(3)), int(match.group(4)))]
    return []


def _parse_native(name: str, rank: int) -> list[tuple[str, int, int]]:
    match = NATIVE_LABEL.match(name)
    if not match:
        return []
    return [("F" if match.group(1) == "Forward" else "B", rank, int(match.group(2)))]


def _step_for(rank: int, t: int, steps: pd.DataFrame) -> int:
    rows = steps[(steps["rank"] == rank) & (steps["step_start_ns"] <= t) & (steps["step_end_ns"] >= t)]
    return int(rows["step"].iloc[0]) if len(rows) else -1


def _from_labels(cpu: pd.DataFrame, labels: pd.DataFrame, steps: pd.DataFrame, parse) -> list[tuple]:
    rows = []
    for (rank, pid, tid), thread in cpu.groupby(["rank", "pid", "tid"], sort=False):
        thread_labels = labels[(labels["rank"] == rank) & (labels["pid"] == pid) & (labels["tid"] == tid)]
        if thread_labels.empty:
            continue
        thread = thread.sort_values("start_ns")
        starts = thread["start_ns"].to_numpy()
        ends = thread["end_ns"].to_numpy()
        names = thread["name"].to_numpy()
        depths = thread["depth"].to_numpy()
        cats = thread["cat"].to_numpy()
        # Receive waits of this rank (any thread): gloo:recv spans end when the data is there.
        rank_events = cpu[cpu["rank"] == rank]
        waits = np.sort(rank_events.loc[rank_events["name"] == "gloo:recv", "end_ns"].to_numpy())
        for label in thread_labels.itertuples(index=False):
            parts = parse(label.name, int(rank))
            if not parts:
                continue
            lo = np.searchsorted(starts, label.start_ns, side="left")
            hi = np.searchsorted(starts, label.end_ns, side="right")
            inside = [
                i for i in range(lo, hi)
                if ends[i] <= label.end_ns and depths[i] == label.depth + 1
            ]
            span = _compute_span(label, inside, starts, ends, names, waits)
            step = _step_for(int(rank), int(label.start_ns), steps)
            if len(parts) == 1:
                kind, stage, mb = parts[0]
                rows.append((int(rank), step, kind, stage, mb, span.start, span.end,
                             int(label.start_ns), int(label.end_ns), label.name,
                             int(label.file_id), int(label.source_index)))
            else:
                split = _first_backward_start(inside, starts, names, cats, span)
                for (kind, stage, mb), (s, e) in zip(parts, [(span.start, split), (split, span.end)]):
                    rows.append((int(rank), step, kind, stage, mb, s, e, int(label.start_ns),
                                 int(label.end_ns), label.name, int(label.file_id),
                                 int(label.source_index)))
    return rows


def _compute_span(label, inside: list[int], starts, ends, names, waits) -> _Span:
    """The span of the label's top-level compute ops. A label with no compute op inside
    (an empty input-grad, say) counts from the end of its receive wait to its end."""
    compute = [i for i in inside if not is_comm(names[i])]
    if compute:
        return _Span(int(starts[compute[0]]), int(max(ends[i] for i in compute)))
    start, end = int(label.start_ns), int(label.end_ns)
    lo = np.searchsorted(waits, start, side="left")
    hi = np.searchsorted(waits, end, side="right")
    if hi > lo:
        start = max(start, int(waits[hi - 1]))
    for i in inside:
        if is_comm(names[i]):
            start = max(start, min(int(ends[i]), end))
    return _Span(start, max(start, end))


def _first_backward_start(inside: list[int], starts, names, cats, span: _Span) -> int:
    for i in inside:
        if names[i].startswith("autograd::engine") and starts[i] >= span.start:
            return int(starts[i])
    return (span.start + span.end) // 2


class _ByRank:
    """One rank's rows sorted by start, sliced to a time window with a binary search."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame.sort_values("start_ns", kind="stable")
        self.starts = self.frame["start_ns"].to_numpy()

    def window(self, lo: int, hi: int) -> pd.DataFrame:
        a = np.searchsorted(self.starts, lo, side="left")
        b = np.searchsorted(self.starts, hi, side="right")
        return self.frame.iloc[a:b].sort_index()  # rows back in table order, as a mask gives


def _split(frame: pd.DataFrame) -> dict:
    return {rank: _ByRank(group) for rank, group in frame.groupby("rank")}


def _segment_unlabelled(cpu: pd.DataFrame, steps: pd.DataFrame) -> list[tuple]:
    """Native Schedule1F1B: runs of top-level ops between c10d ops on the main thread.

    A forward run counts only if one of its ops has a backward in the trace (shared autograd
    sequence number): that drops batch splitting, ``detach_`` after sending and gradient
    scaling. A backward's microbatch is the forward whose sequence numbers it consumes.
    """
    rows = []
    step_marks = cpu[(cpu["cat"] == "user_annotation") & cpu["name"].str.startswith("ProfilerStep#")]
    backward_ops = cpu[cpu["name"].str.startswith("autograd::engine") & (cpu["seq"] >= 0)]
    p2p = cpu[cpu["name"].isin(_P2P_OPS)]
    cpu_r, marks_r, back_r, p2p_r = _split(cpu), _split(step_marks), _split(backward_ops), _split(p2p)
    for step in steps.itertuples(index=False):
        if step.rank not in p2p_r or step.rank not in marks_r:
            continue
        step_p2p = p2p_r[step.rank].window(step.step_start_ns, step.step_end_ns)
        if step_p2p.empty:
            continue
        marks = marks_r[step.rank].window(step.step_start_ns, step.step_start_ns)
        if marks.empty:
            continue
        mark = marks.iloc[0]
        window = cpu_r[step.rank].window(step.step_start_ns, step.step_end_ns)
        thread = window[(window["pid"] == mark["pid"]) & (window["tid"] == mark["tid"])
                        & (window["depth"] == mark["depth"] + 1)
                        & (window["end_ns"] <= step.step_end_ns)].sort_values("start_ns")
        back = back_r.get(step.rank)
        in_step = back.window(step.step_start_ns, step.step_end_ns) if back else backward_ops.iloc[0:0]
        in_step = in_step[in_step["end_ns"] <= step.step_end_ns]
        has_backward = set(in_step["seq"].tolist())
        forward_of_seq: dict[int, int] = {}
        counters = {"F": 0}
        for kind, ops in _runs(thread):
            seqs = {int(o.seq) for o in ops if o.seq >= 0}
            if kind == "F":
                if not seqs & has_backward:
                    continue
                mb = counters["F"]
                counters["F"] += 1
                for seq in seqs:
                    forward_of_seq[seq] = mb
            else:
                owners = [forward_of_seq[q] for q in seqs if q in forward_of_seq]
                if not owners:
                    continue
                mb = max(set(owners), key=owners.count)
            start = int(ops[0].start_ns)
            end = int(max(o.end_ns for o in ops))
            rows.append((int(step.rank), int(step.step), kind, int(step.rank), mb, start, end,
                         start, end, "", int(ops[0].file_id), int(ops[0].source_index)))
    return rows


def _runs(thread: pd.DataFrame) -> list[tuple[str, list]]:
    """Split a thread's top-level ops into runs of forward (F) or autograd (B) ops,
    broken at communication and optimizer ops."""
    runs: list[tuple[str, list]] = []
    current: list = []
    current_kind = None
    for op in thread.itertuples(index=False):
        if is_comm(op.name) or op.name.startswith(_OPTIMIZER_PREFIXES):
            if current:
                runs.append((current_kind, current))
            current, current_kind = [], None
            continue
        kind = "B" if op.name.startswith("autograd::engine") else "F"
        if current and kind != current_kind:
            runs.append((current_kind, current))
            current = []
        current_kind = kind
        current.append(op)
    if current:
        runs.append((current_kind, current))
    return runs
