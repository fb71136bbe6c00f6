"""The analysis as tables: one typed, documented DataFrame per table (``tracekit export --tables``).

:func:`tables` returns the same DataFrames the command writes as Parquet (and CSV), so a
notebook and a file reader see one thing. Every table has a fixed set of columns whatever
the run (a CPU run's actions have ``host_start_ns`` = ``start_ns``; a run with no
attribution has an empty ``attribution`` table with its columns), so a query written
against one run works on the next. Integers stay ``int64`` (times and durations in ns),
ratios are ``float64`` in 0..1, names are strings. :data:`TABLES` documents each column;
the Parquet files carry the same text in their schema metadata. Every table ends with the
same added columns: ``run_id`` (to concatenate the tables of several runs), then each of its
absolute times again since its step's start (``start_ns`` -> ``start_in_step_ns``, nullable
``Int64``: null outside every measured step).

:func:`step_scalars` is what ``export --tensorboard`` writes: per step, per-stage compute,
per-rank idle by cause, the bubble ratio and the step time, in ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyze import Analysis
from tracekit.analyze.grouping import int_groups
from tracekit.analyze.intervals import blamed_intervals
from tracekit.analyze.shares import share
from tracekit.vocab import CATEGORIES, IDLE_CAUSES
from tracekit.model.run import compute_ns

_NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class TableSpec:
    """What a table holds (``doc``) and each column's type and meaning, in column order."""

    doc: str
    columns: dict[str, tuple[str, str]]  # name -> (dtype: "int64" | "Int64" | "float64" | "string", doc)
    device_only: bool = False  # written only for runs measured on the GPU timeline
    # absolute times (ns): each also as <name>_in_step_ns, since its step's start (with_common)
    step_times: tuple[str, ...] = ()


# Each idle cause's column of nanoseconds, in the registry's order: the attribution table's
# and the notebook's ranks and steps frames.
CAUSE_COLUMN_SPECS: dict[str, tuple[str, str]] = {c.column: ("int64", f"{c.description}, ns") for c in IDLE_CAUSES}

_PAIR_COLUMNS: dict[str, tuple[str, str]] = {
    "msg_id": ("int64", "the message (messages.msg_id); -1 for pairs matched by order, without actions"),
    "step": ("int64", "profiler step"),
    "src_rank": ("int64", "sending rank"),
    "dst_rank": ("int64", "receiving rank"),
    "direction": ("string", "fwd, bwd, or ? when the trace does not say which side sent"),
    "send_start_ns": ("int64", "start of the send kernel on the device, ns"),
    "send_end_ns": ("int64", "end of the send kernel, ns"),
    "recv_start_ns": ("int64", "start of the receive kernel, ns"),
    "recv_end_ns": ("int64", "end of the receive kernel, ns"),
    "waiting_rank": (
        "int64",
        "the rank whose kernel started first and spun for its peer; -1 when both "
        "started together or a kernel is unknown",
    ),
    "wait_ns": (
        "int64",
        "later kernel start - earlier kernel start: how long the first one spun; -1 when a kernel is unknown, ns",
    ),
    "transfer_ns": ("int64", "earlier kernel end - later kernel start: data movement; -1 when a kernel is unknown, ns"),
}

_PAIR_TIMES = ("send_start_ns", "send_end_ns", "recv_start_ns", "recv_end_ns")

_OWN_COLUMNS: dict[str, TableSpec] = {
    "actions": TableSpec(
        "One row per pipeline compute action (forward, backward, input- or weight-grad) on one rank in one step.",
        {
            "action_id": ("int64", "the action's id; messages refer to it"),
            "rank": ("int64", "global rank that ran it"),
            "step": ("int64", "profiler step (ProfilerStep#N); -1 outside every profiled step"),
            "order": ("int64", "position on its rank within the step, from 0"),
            "kind": ("string", "F forward, B full backward, I input-grad backward, W weight-grad backward"),
            "stage": ("int64", "pipeline stage (not rank)"),
            "microbatch": ("int64", "microbatch index; -1 when unknown"),
            "start_ns": ("int64", "start of the compute span (on the run's timeline), ns"),
            "end_ns": ("int64", "end of the compute span, ns"),
            "compute_ns": (
                "int64",
                "compute time: the span on the host timeline, the union of the action's kernels on the device timeline",
            ),
            "label_start_ns": ("int64", "start of the action's label (PP:... range), including its receive wait, ns"),
            "label_end_ns": ("int64", "end of the action's label, ns"),
            "host_start_ns": ("int64", "start of the host-side span (= start_ns on the host timeline), ns"),
            "host_end_ns": ("int64", "end of the host-side span (= end_ns on the host timeline), ns"),
            "label": ("string", "the label as recorded; empty for actions reconstructed from unlabelled ops"),
            "file_id": ("int64", "index of the trace file it came from (the JSON report's files list)"),
            "source_index": ("int64", "index of the source event in that file"),
        },
        step_times=("start_ns", "end_ns", "label_start_ns", "label_end_ns", "host_start_ns", "host_end_ns"),
    ),
    "messages": TableSpec(
        "One row per matched point-to-point message between two ranks.",
        {
            "msg_id": ("int64", "the message's id"),
            "step": ("int64", "profiler step"),
            "src_rank": ("int64", "sending rank"),
            "dst_rank": ("int64", "receiving rank"),
            "tag": ("int64", "P2P tag; -1 when unknown"),
            "nbytes": ("int64", "message size in bytes; -1 when unknown"),
            "direction": ("string", "fwd activations, bwd gradients, ? unknown"),
            "send_post_ns": ("int64", "when the sender posted the send, ns"),
            "recv_post_ns": ("int64", "when the receiver posted the receive, ns"),
            "recv_done_ns": ("int64", "when the receiver's wait returned (data there), ns"),
            "recv_wait_ns": ("int64", "how long the receiver was blocked on it, ns"),
            "arrival_ns": (
                "int64",
                "when the data was at the receiver (recv_done_ns if it blocked, else an "
                "estimate no later than its wait call), ns",
            ),
            "producer_action": ("int64", "action_id of the action that produced the data; -1 when unknown"),
            "consumer_action": ("int64", "action_id of the action that consumed it; -1 when unknown"),
            "src_file_id": ("int64", "trace file of the send op"),
            "src_source_index": ("int64", "index of the send op in that file"),
            "dst_file_id": ("int64", "trace file of the receive op"),
            "dst_source_index": ("int64", "index of the receive op in that file"),
        },
        step_times=("send_post_ns", "recv_post_ns", "recv_done_ns", "arrival_ns"),
    ),
    "bubbles": TableSpec(
        "One row per rank and step: the step window, busy and idle time, bubble ratio.",
        {
            "rank": ("int64", "global rank"),
            "step": ("int64", "profiler step"),
            "window_start_ns": (
                "int64",
                "start of the step window (pipeline runs: first compute start over all ranks), ns",
            ),
            "window_end_ns": ("int64", "end of the step window (pipeline runs: last compute end over all ranks), ns"),
            "window_ns": ("int64", "window length, ns"),
            "busy_ns": ("int64", "union of the rank's compute inside the window, ns"),
            "idle_ns": ("int64", "window_ns - busy_ns"),
            "bubble_ratio": ("float64", "idle_ns / window_ns, 0..1"),
        },
        step_times=("window_start_ns", "window_end_ns"),
    ),
    "attribution": TableSpec(
        "One row per rank and step of a whole pipeline: its idle time split by cause; "
        "the causes sum to idle_ns exactly. Empty where not attributed (no pipeline, "
        "ranks missing).",
        {
            "rank": ("int64", "global rank"),
            "step": ("int64", "profiler step"),
            "idle_ns": ("int64", "the rank's idle in the step window (as in bubbles), ns"),
            **CAUSE_COLUMN_SPECS,
        },
    ),
    "stage_blame": TableSpec(
        "Who the imbalance idle is charged to: per rank and step, the stages whose "
        "excess work made that rank wait; sums to the rank's imbalance_ns.",
        {
            "step": ("int64", "profiler step"),
            "rank": ("int64", "the rank that waited"),
            "stage": ("int64", "the stage blamed"),
            "imbalance_ns": ("int64", "the share of the rank's imbalance idle charged to that stage, ns"),
        },
    ),
    "link_blame": TableSpec(
        "Who the comm idle is charged to: per rank and step, the links whose latency "
        "made that rank wait; sums to the rank's comm_ns.",
        {
            "step": ("int64", "profiler step"),
            "rank": ("int64", "the rank that waited"),
            "src_rank": ("int64", "sending end of the link blamed"),
            "dst_rank": ("int64", "receiving end of the link blamed"),
            "comm_ns": ("int64", "the share of the rank's comm idle charged to that link, ns"),
        },
    ),
    "idle_intervals": TableSpec(
        "One row per idle interval of a rank in a step, with its cause and, for imbalance and "
        "comm, the stage or link it is blamed on: the intervals the merged trace and the report's "
        "timeline shade. Per rank and step the intervals of a cause add up to the attribution's "
        "figure, and those blamed on a stage (link) to its stage_blame (link_blame) row. Empty "
        "where not attributed.",
        {
            "rank": ("int64", "the rank that sat idle"),
            "step": ("int64", "profiler step"),
            "start_ns": ("int64", "start of the interval, ns"),
            "end_ns": ("int64", "end of the interval, ns"),
            "duration_ns": ("int64", "end_ns - start_ns"),
            "cause": ("string", "the cause: " + ", ".join(CATEGORIES)),
            "blamed_stage": ("int64", "imbalance: the stage whose excess work it waited for; -1 otherwise"),
            "blamed_src_rank": ("int64", "comm: the sending end of the link it waited for; -1 otherwise"),
            "blamed_dst_rank": ("int64", "comm: the receiving end of that link; -1 otherwise"),
        },
        step_times=("start_ns", "end_ns"),
    ),
    "device_pairs": TableSpec(
        "GPU runs: one row per pair of point-to-point kernels (a send's and its "
        "receive's), split into waiting for the peer and moving data.",
        _PAIR_COLUMNS,
        device_only=True,
        step_times=_PAIR_TIMES,
    ),
    "collective_pairs": TableSpec(
        "GPU runs: SendRecv kernels of collectives (all_to_all) paired across a "
        "two-rank run; not pipeline messages (msg_id -1).",
        _PAIR_COLUMNS,
        device_only=True,
        step_times=_PAIR_TIMES,
    ),
    "device_steps": TableSpec(
        "GPU runs: per rank and step, what the device timeline adds to the bubbles.",
        {
            "rank": ("int64", "global rank"),
            "step": ("int64", "profiler step"),
            "launch_wait_ns": ("int64", "device idle while the host had not launched the next op yet, ns"),
            "step_end_ns": (
                "int64",
                "device work of the step after the pipeline window closed (optimizer, gradient collectives), ns",
            ),
            "p2p_wait_ns": ("int64", "time the rank's P2P kernels spun waiting for their peer, ns"),
            "p2p_transfer_ns": ("int64", "time the rank's P2P kernels moved data, ns"),
        },
        device_only=True,
    ),
    "device_ranks": TableSpec(
        "GPU runs: the device figures per rank, summed over steps.",
        {
            "rank": ("int64", "global rank"),
            "launch_wait_ns": ("int64", "device_steps.launch_wait_ns summed, ns"),
            "step_end_ns": ("int64", "device_steps.step_end_ns summed, ns"),
            "p2p_wait_ns": ("int64", "device_steps.p2p_wait_ns summed, ns"),
            "p2p_transfer_ns": ("int64", "device_steps.p2p_transfer_ns summed, ns"),
            "host_ahead_ns": (
                "int64",
                "how far the host ran ahead: the longest time from a launch call's end to its op's start, ns",
            ),
        },
        device_only=True,
    ),
}

RUN_ID_DOC = (
    "the run the row is of: tables(analysis, run_id=...), export --run-id; default the run as "
    "named when loaded (its folder or file), so tables of several runs concatenate"
)


def in_step(column: str) -> str:
    """The column that holds absolute time ``column`` since its step's start: ``start_ns`` ->
    ``start_in_step_ns``."""
    return column.removesuffix("_ns") + "_in_step_ns"


def _with_common(spec: TableSpec) -> TableSpec:
    """``spec`` with the columns every table ends with: ``run_id``, then each absolute time
    (``step_times``) again since its step's start."""
    added = {"run_id": ("string", RUN_ID_DOC)}
    for column in spec.step_times:
        added[in_step(column)] = (
            "Int64",
            f"{column} since its step's start (the step window's start over all ranks: the earliest "
            "bubbles.window_start_ns of the step, where the report's timeline starts), ns; null where the "
            "step was not measured (-1: outside every profiled step)",
        )
    return TableSpec(spec.doc, {**spec.columns, **added}, spec.device_only, spec.step_times)


# Every table's columns, in order: its own, then run_id and its times since the step's start.
TABLES: dict[str, TableSpec] = {name: _with_common(spec) for name, spec in _OWN_COLUMNS.items()}


def table_names(on_device: bool) -> list[str]:
    """The tables a run has: the device ones only when measured on the GPU timeline."""
    return [name for name, spec in TABLES.items() if on_device or not spec.device_only]


def tables(analysis: Analysis, run_id: str | None = None) -> dict[str, pd.DataFrame]:
    """Every table of ``analysis`` (see :data:`TABLES`), typed, in the documented column order.
    ``run_id``: the value of every table's ``run_id`` column (default: ``run.source``, the run
    as named when loaded)."""
    run = analysis.run
    actions = run.actions.assign(compute_ns=compute_ns(run.actions) if len(run.actions) else [])
    if "host_start_ns" not in actions:
        actions = actions.assign(host_start_ns=actions["start_ns"], host_end_ns=actions["end_ns"])
    attribution = analysis.attribution
    raw: dict[str, pd.DataFrame] = {
        "actions": actions,
        "messages": run.messages,
        "bubbles": analysis.bubbles,
        "attribution": attribution.table if attribution else pd.DataFrame(),
        "stage_blame": attribution.stage_blame if attribution else pd.DataFrame(),
        "link_blame": attribution.link_blame if attribution else pd.DataFrame(),
        "idle_intervals": _idle_intervals(analysis),
    }
    figures = analysis.device
    if figures is not None:
        per_rank = figures.per_rank().reset_index()
        per_rank["host_ahead_ns"] = [figures.host_ahead_ns.get(int(r), 0) for r in per_rank["rank"]]
        raw.update(
            device_pairs=run.device_pairs,
            collective_pairs=run.collective_pairs,
            device_steps=figures.per_step,
            device_ranks=per_rank,
        )
    step_start = analysis.bubbles.groupby("step")["window_start_ns"].min()
    common = _Common(run.source if run_id is None else run_id, step_start)
    return {
        name: typed(common.added(raw[name], TABLES[name]), TABLES[name]) for name in table_names(figures is not None)
    }


def _idle_intervals(analysis: Analysis) -> pd.DataFrame:
    intervals = blamed_intervals(analysis)
    return intervals.assign(duration_ns=intervals["end_ns"] - intervals["start_ns"])


@dataclass(frozen=True)
class _Common:
    """What every table adds to its own columns: the run id, and times since the step's start."""

    run_id: str
    step_start_ns: pd.Series  # step -> the step window's start over all ranks

    def added(self, frame: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
        if not len(frame):
            return frame
        extra: dict[str, str | pd.arrays.IntegerArray] = {"run_id": self.run_id}
        if spec.step_times:
            steps = frame["step"].to_numpy(np.int64)
            known = np.isin(steps, self.step_start_ns.index.to_numpy(np.int64))
            starts = pd.Series(self.step_start_ns.to_numpy(np.int64), index=self.step_start_ns.index.to_numpy(np.int64))
            start_ns = np.zeros(len(frame), dtype=np.int64)
            start_ns[known] = starts.loc[steps[known]].to_numpy(np.int64)
            for column in spec.step_times:
                since = frame[column].to_numpy(np.int64) - start_ns
                # integers throughout: epoch ns lose precision as floats
                extra[in_step(column)] = pd.arrays.IntegerArray(since, ~known)
        return frame.assign(**extra)


def typed(frame: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """``frame``'s documented columns, in order, with their types (an empty frame gets them all)."""
    out = pd.DataFrame(index=range(len(frame)))
    for name, (dtype, _) in spec.columns.items():
        column = pd.Series(
            frame[name].to_numpy() if len(frame) else [], index=out.index, dtype=object if dtype == "string" else None
        )
        # the stubs take a literal dtype name only; these come from TABLES ("int64", "string"...)
        column = column.astype(dtype)  # type: ignore[call-overload]
        # the model's convention for "no label" is the empty string, never a missing value
        out[name] = column.fillna("") if dtype == "string" else column
    return out


def step_scalars(analysis: Analysis) -> pd.DataFrame:
    """Per step, the figures a training dashboard plots: columns step, tag, value (ms or a ratio),
    wall_time_ns (the step window's start on the Unix clock; -1 when the traces have no absolute clock).

    Tags: ``pipeline/step_ms`` (the step window), ``pipeline/bubble_ratio`` (idle over window,
    all ranks), ``pipeline/stage_<s>/compute_ms`` (compute of stage s's actions in the step;
    with data-parallel replicas, the mean over the ranks that run it), ``pipeline/rank_<r>/idle_ms``
    and, where attributed, ``pipeline/rank_<r>/idle_<cause>_ms``."""
    absolute = all(f.clock == "unix" for f in analysis.run.files)
    rows: list[tuple[int, str, float, int]] = []
    attributed = analysis.attribution.table if analysis.attribution else pd.DataFrame()
    cause_columns = [f"{c}_ns" for c in CATEGORIES]
    by_step_rank: dict[tuple[int, int], list[int]] = (
        {(s, r): ns for s, r, *ns in attributed[["step", "rank", *cause_columns]].to_numpy(np.int64).tolist()}
        if len(attributed)
        else {}
    )
    compute = _stage_compute_ns(analysis)
    for (step,), window in int_groups(analysis.bubbles, ["step"]):
        start_ns = int(window["window_start_ns"].min())
        figures: list[tuple[str, float]] = [
            ("pipeline/step_ms", (int(window["window_end_ns"].max()) - start_ns) / _NS_PER_MS),
            (
                "pipeline/bubble_ratio",
                share(int(window["idle_ns"].sum()), int(window["window_ns"].sum()), f"step {step}: bubble ratio"),
            ),
        ]
        figures += [
            (f"pipeline/stage_{stage}/compute_ms", value / _NS_PER_MS) for stage, value in compute.get(step, {}).items()
        ]
        ranks = window.sort_values("rank")
        for rank, idle_ns in ranks[["rank", "idle_ns"]].to_numpy(np.int64).tolist():
            figures.append((f"pipeline/rank_{rank}/idle_ms", idle_ns / _NS_PER_MS))
            if (step, rank) in by_step_rank:
                figures += [
                    (f"pipeline/rank_{rank}/idle_{cause}_ms", ns / _NS_PER_MS)
                    for cause, ns in zip(CATEGORIES, by_step_rank[(step, rank)])
                ]
        rows += [(step, tag, float(value), start_ns if absolute else -1) for tag, value in figures]
    frame = pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time_ns"])
    return frame.astype({"step": "int64", "tag": "string", "value": "float64", "wall_time_ns": "int64"})


def _stage_compute_ns(analysis: Analysis) -> dict[int, dict[int, float]]:
    """step -> stage -> compute of that stage's actions in the step (mean over the ranks running it)."""
    actions = analysis.run.actions
    if not analysis.is_pipeline:
        return {}
    actions = actions[actions["step"] >= 0]
    per_rank = compute_ns(actions).groupby([actions["step"], actions["stage"], actions["rank"]]).sum()
    per_stage = per_rank.groupby(level=["step", "stage"]).mean().reset_index(name="compute_ns")
    out: dict[int, dict[int, float]] = {}
    for step, stage, value in zip(per_stage["step"], per_stage["stage"], per_stage["compute_ns"]):
        out.setdefault(int(step), {})[int(stage)] = float(value)
    return out


__all__ = ["TABLES", "TableSpec", "in_step", "step_scalars", "table_names", "tables", "typed"]
