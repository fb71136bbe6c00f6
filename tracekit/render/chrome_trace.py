"""One merged Chrome trace of a whole run (``tracekit export``), for Perfetto UI and chrome://tracing.

Every rank is a process (``rank N``; pid N+1, since viewers treat pid 0 as the kernel's
idle task) with these threads, named by ``thread_name`` metadata:

- ``compute``: the pipeline actions, named like ``F s2 mb3``, args with stage, microbatch,
  step, duration and where the action came from (file and event index).
- ``bubbles``: the rank's idle time in each step window as slices named by cause
  (:func:`tracekit.analyze.intervals.idle_intervals`; the lengths per cause are the
  attributed ones).
- ``p2p``: the send and receive ops of the matched messages.
- ``steps``: the profiler steps.

Messages are flow arrows (``ph`` ``s``/``f``) from the producing action's end on the
sender to the consuming action on the receiver; without a known producer the arrow
starts at the send op, without a known consumer it lands on the receiver's next action
after the data arrived. Times are the run's absolute ns shifted to start at the run's
earliest event and written in µs (the format's unit) to the ns.

Slices on one thread must nest; where a rank's slices of one kind overlap, they are
spread over extra threads (``compute (2)``, ...). Bubbles do overlap: step windows are
global (first compute start to last compute end over all ranks), so one step's drain on a
rank can overlap the next step's warm-up; the second lies on ``bubbles (2)``.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pandas as pd

from tracekit.analyze import Analysis
from tracekit.analyze.grouping import int_groups
from tracekit.analyze.intervals import idle_intervals
from tracekit.errors import TracekitError
from tracekit.version import __version__

if TYPE_CHECKING:
    from tracekit.model.run import Run
    from tracekit.render.chrome_ops import Add, Placed, Track

TRACKS = ("compute", "bubbles", "p2p", "steps")  # top to bottom within a rank


@dataclass
class _Tracks:
    """Thread ids per rank, track and lane, in TRACKS order, and their metadata events."""

    ranks: list[int]
    tids: dict[tuple[int, str, int], int] = field(default_factory=dict)

    def tid(self, rank: int, track: str, lane: int = 0) -> int:
        return self.tids.setdefault((rank, track, lane), 0)

    def metadata(self) -> list[dict[str, Any]]:
        out = []
        for rank in self.ranks:
            pid = pid_of(rank)
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {rank}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
            keys = sorted((k for k in self.tids if k[0] == rank), key=lambda k: (TRACKS.index(k[1]), k[2]))
            for index, key in enumerate(keys, start=1):
                self.tids[key] = index
                name = key[1] if key[2] == 0 else f"{key[1]} ({key[2] + 1})"
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": index, "args": {"name": name}})
                out.append(
                    {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": index, "args": {"sort_index": index}}
                )
        return out


def pid_of(rank: int) -> int:
    return rank + 1


def lanes(starts: list[int], ends: list[int]) -> list[int]:
    """A lane per interval such that intervals in one lane do not overlap (first fit, by start)."""
    lane_end: list[int] = []
    out = [0] * len(starts)
    for i in sorted(range(len(starts)), key=lambda k: (starts[k], ends[k])):
        for lane, end in enumerate(lane_end):  # noqa: B007 (the lane found is used after the loop)
            if end <= starts[i]:
                break
        else:
            lane = len(lane_end)
            lane_end.append(0)
        lane_end[lane] = max(ends[i], starts[i])
        out[i] = lane
    return out


def to_chrome_trace(analysis: Analysis, with_ops: bool = False) -> dict[str, Any]:
    """The merged trace document (``traceEvents`` plus ``otherData``); ``with_ops``: each
    action's original ops nested under it (:mod:`tracekit.render.chrome_ops`)."""
    run = analysis.run
    if not run.is_pipeline:
        raise TracekitError(
            f"{run.source}: no pipeline actions found, so there is nothing to merge; "
            "open the rank traces themselves in Perfetto"
        )
    origin = int(run.events["start_ns"].min())

    def us(ns: int) -> float:
        return round((int(ns) - origin) / 1000, 3)

    tracks = _Tracks(ranks=run.ranks)
    slices: list[tuple[Track, dict[str, Any]]] = []  # track key -> X event (tid set at the end)
    names = [f.path.name for f in run.files]

    def add(
        rank: int, track: str, lane: int, start_ns: int, end_ns: int, name: str, cat: str, args: dict[str, Any]
    ) -> None:
        key = (rank, track, lane)
        tracks.tid(*key)
        slices.append(
            (
                key,
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat,
                    "pid": pid_of(rank),
                    "ts": us(start_ns),
                    "dur": round((int(end_ns) - int(start_ns)) / 1000, 3),
                    "args": args,
                },
            )
        )

    action_track: dict[int, Placed] = {}
    row: Any  # rows of the run's tables (pandas types their fields as any scalar)
    for (rank,), group in int_groups(run.actions, ["rank"]):
        for row, lane in zip(group.itertuples(index=False), lanes(list(group["start_ns"]), list(group["end_ns"]))):
            mb = row.microbatch if row.microbatch >= 0 else "?"
            add(
                int(rank),
                "compute",
                lane,
                row.start_ns,
                row.end_ns,
                f"{row.kind} s{row.stage} mb{mb}",
                "compute",
                {
                    "action_id": int(row.action_id),
                    "kind": row.kind,
                    "stage": int(row.stage),
                    "microbatch": int(row.microbatch),
                    "step": int(row.step),
                    "duration_ns": int(row.end_ns - row.start_ns),
                    "label": row.label,
                    "source_file": names[int(row.file_id)],
                    "source_index": int(row.source_index),
                },
            )
            action_track[int(row.action_id)] = ((int(rank), "compute", lane), int(row.start_ns), int(row.end_ns))

    op_counts: dict[str, int] = {}
    if with_ops:
        from tracekit.render.chrome_ops import add_action_ops

        added, left_out = add_action_ops(run, add, action_track)
        op_counts = {"ops": added, "ops_left_out": left_out}

    intervals = idle_intervals(analysis)
    for (rank,), group in int_groups(intervals, ["rank"]):
        # step windows are global, so one step's drain on a rank can overlap the next one's warm-up
        for row, lane in zip(group.itertuples(index=False), lanes(list(group["start_ns"]), list(group["end_ns"]))):
            add(
                int(rank),
                "bubbles",
                lane,
                row.start_ns,
                row.end_ns,
                row.cause,
                "bubble",
                {"cause": row.cause, "step": int(row.step), "duration_ns": int(row.end_ns - row.start_ns)},
            )

    send_track = _p2p_ops(run, add)
    flows = _flows(run, us, tracks, action_track, send_track)

    step: Any
    for step in run.steps.itertuples(index=False):
        add(
            int(step.rank),
            "steps",
            0,
            step.step_start_ns,
            step.step_end_ns,
            f"step {step.step}",
            "step",
            {"step": int(step.step), "n_actions": int(step.n_actions)},
        )

    metadata = tracks.metadata()
    for key, event in slices:
        event["tid"] = tracks.tids[key]
    for key, event in flows:
        event["tid"] = tracks.tids[key]
    timeline = sorted([e for _, e in slices] + [e for _, e in flows], key=lambda e: e["ts"])
    clocks = sorted({f.clock for f in run.files})
    warnings: list[str] = []
    if run.completeness is not None and not run.completeness.complete:
        warnings.append(run.completeness.message())
    if clocks != ["unix"] and len(run.files) > 1:
        warnings.append(
            f"the files' clocks are {', '.join(clocks)}, not all wall-clock time: ranks may not line up in time"
        )
    return {
        "traceEvents": metadata + timeline,
        "displayTimeUnit": "ms",
        "otherData": {
            "tracekit_version": __version__,
            "source": run.source,
            "origin_ns": origin,
            "schedule": run.schedule.to_dict() if run.schedule else None,
            "bubble_ratio": round(analysis.summary.bubble_ratio, 6),
            "counts": {
                "ranks": len(run.ranks),
                "actions": int(len(run.actions)),
                "messages": int(len(run.messages)),
                "flows": len(flows) // 2,
                "idle_intervals": int(len(intervals)),
                **op_counts,
            },
            "warnings": warnings,
        },
    }


def _p2p_ops(run: Run, add: Add) -> dict[int, Placed]:
    """The send and receive op of every message on its rank's p2p track; msg_id -> the send op's
    (track key, start, end), for arrows that have no producing action to start from."""
    msgs = run.messages
    wanted = set(zip(msgs["src_file_id"], msgs["src_source_index"])) | set(
        zip(msgs["dst_file_id"], msgs["dst_source_index"])
    )
    ev = run.events
    ev = ev[[key in wanted for key in zip(ev["file_id"], ev["source_index"])]]
    op_of = {
        (int(f), int(i)): (int(s), int(e), str(n))
        for f, i, s, e, n in zip(ev["file_id"], ev["source_index"], ev["start_ns"], ev["end_ns"], ev["name"])
    }
    ops: list[
        tuple[int, int, int, str, dict[str, Any], int, bool]
    ] = []  # (rank, start, end, name, args, msg_id, is_send)
    m: Any  # a message row (pandas types its fields as any scalar)
    for m in msgs.itertuples(index=False):
        common = {
            "msg_id": int(m.msg_id),
            "step": int(m.step),
            "tag": int(m.tag),
            "nbytes": int(m.nbytes),
            "direction": str(m.direction),
        }
        send = op_of.get((int(m.src_file_id), int(m.src_source_index)))
        if send:
            ops.append(
                (
                    int(m.src_rank),
                    send[0],
                    send[1],
                    f"send -> r{m.dst_rank}",
                    {**common, "op": send[2]},
                    int(m.msg_id),
                    True,
                )
            )
        recv = op_of.get((int(m.dst_file_id), int(m.dst_source_index)))
        if recv:
            ops.append(
                (
                    int(m.dst_rank),
                    recv[0],
                    recv[1],
                    f"recv <- r{m.src_rank}",
                    {**common, "op": recv[2], "recv_wait_ns": int(m.recv_wait_ns)},
                    int(m.msg_id),
                    False,
                )
            )
    send_track: dict[int, Placed] = {}
    by_rank = pd.DataFrame(ops, columns=["rank", "start", "end", "name", "args", "msg_id", "is_send"])
    row: Any
    for (rank,), group in int_groups(by_rank, ["rank"]):
        for row, lane in zip(group.itertuples(index=False), lanes(list(group["start"]), list(group["end"]))):
            add(int(rank), "p2p", lane, row.start, row.end, row.name, "p2p", row.args)
            if row.is_send:
                send_track[row.msg_id] = ((int(rank), "p2p", lane), row.start, row.end)
    return send_track


def _flows(
    run: Run,
    us: Callable[[int], float],
    tracks: _Tracks,
    action_track: dict[int, Placed],
    send_track: dict[int, Placed],
) -> list[tuple[Track, dict[str, Any]]]:
    """An s/f pair per message: producer's end (else the send op) -> consumer (else the
    receiver's next action after the data arrived)."""
    out: list[tuple[Track, dict[str, Any]]] = []
    m: Any  # a message row (pandas types its fields as any scalar)
    for m in run.messages.itertuples(index=False):
        if m.producer_action in action_track:
            key, start, end = action_track[m.producer_action]
            start_ts = max(start, end - 1)  # inside the producing slice, so the arrow binds to it
        elif m.msg_id in send_track:
            key, start, _ = send_track[m.msg_id]
            start_ts = start
        else:
            continue
        name = f"{m.direction} {m.src_rank}->{m.dst_rank}"
        flow_id = int(m.msg_id) + 1
        common = {"name": name, "cat": "p2p", "id": flow_id, "pid": pid_of(int(m.src_rank))}
        begin = {"ph": "s", **common, "ts": us(start_ts), "args": {"msg_id": int(m.msg_id), "nbytes": int(m.nbytes)}}
        if m.consumer_action in action_track:
            dst_key, start, end = action_track[m.consumer_action]
            finish = {"ph": "f", "bp": "e", "ts": us(min(start + 1, end))}
        else:
            # no bp: binds to the next slice that starts on the receiver's compute thread
            dst_key = (int(m.dst_rank), "compute", 0)
            tracks.tid(*dst_key)
            finish = {"ph": "f", "ts": us(m.recv_done_ns)}
        finish.update({"name": name, "cat": "p2p", "id": flow_id, "pid": pid_of(int(m.dst_rank))})
        out += [(key, begin), (dst_key, finish)]
    return out


def encode_chrome_trace(document: dict[str, Any], compressed: bool) -> bytes:
    """The document as the bytes of a trace file: JSON, gzip-compressed when ``compressed``."""
    data = orjson.dumps(document)
    return gzip.compress(data, compresslevel=6, mtime=0) if compressed else data
