"""Figures of the device timeline: busy time from kernels, and what kept a GPU idle that a
bubble table alone does not say.

Busy is the union of a rank's device work over all its streams: compute kernels, copies
and sets, and collectives launched inside an action (tensor-parallel collectives are part
of the action's work). Point-to-point kernels are never busy: a SendRecv kernel that starts
before its peer spins until the peer arrives, and the device does no work meanwhile. Each op
counts in the step whose host span holds its launch (``run.device.step``), so work the host
launched in step N and the GPU ran after the host had moved on is step N's.

Per rank and step, beside busy and idle:

- ``launch_wait_ns``: device idle while the host had not yet launched the next op (the gap
  before an op up to its launch call's end): the GPU waited for the host, launch-bound.
- ``step_end_ns``: device work of the step after the pipeline's window closed (optimizer,
  data-parallel gradient collectives): its own share, not pipeline bubble.
- ``p2p_wait_ns`` / ``p2p_transfer_ns``: time the rank's SendRecv kernels spun waiting for
  their peer, and moved data.
- ``host_ahead_ns`` (per rank): how far the host ran ahead: the longest time from a
  launch call's end to its op's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.analyze.bubbles import bubble_table
from tracekit.analyze.grouping import int_groups, int_items
from tracekit.model.groups import pair_codes, split_by
from tracekit.model.intervals import union_length
from tracekit.model.run import Run
from tracekit.reconstruct.plain import BubbleRow

DEVICE_RANK_COLUMNS = ["rank", "step", "launch_wait_ns", "step_end_ns", "p2p_wait_ns", "p2p_transfer_ns"]
# A rank whose GPU waits for the host at least this share of its window is launch-bound.
LAUNCH_BOUND_SHARE = 0.10


@dataclass
class DeviceFigures:
    """What :func:`device_figures` measured (see the module doc)."""

    per_step: pd.DataFrame  # DEVICE_RANK_COLUMNS
    host_ahead_ns: dict[int, int] = field(default_factory=dict)
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)  # messages with device kernels

    def per_rank(self) -> pd.DataFrame:
        per_rank: pd.DataFrame = self.per_step.groupby("rank")[DEVICE_RANK_COLUMNS[2:]].sum()
        return per_rank

    @property
    def host_ahead_max_ns(self) -> int:
        return max(self.host_ahead_ns.values(), default=0)


def busy_mask(device: pd.DataFrame) -> np.ndarray:
    """Which device ops count as busy (see the module doc), by row."""
    kind = device["kind"].to_numpy()
    inside = device["action_id"].to_numpy() >= 0
    mask: np.ndarray = (kind == "compute") | ((kind == "collective") & inside)
    return mask


def busy_ops(device: pd.DataFrame) -> pd.DataFrame:
    """The device ops that count as busy (see the module doc)."""
    busy: pd.DataFrame = device[busy_mask(device)]
    return busy


def measure_device_pipeline(actions: pd.DataFrame, device: pd.DataFrame) -> pd.DataFrame:
    """Bubble table of a pipeline run on the device: each step's window is its actions'
    device spans over all ranks; busy is the union of the rank's busy ops of that step."""
    w = actions.groupby("step").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    windows = {int(s): (int(lo), int(hi)) for s, lo, hi in zip(w.index.to_numpy(), w["lo"], w["hi"])}
    ops = _by_rank_step(busy_ops(device))
    rows: list[BubbleRow] = []
    for rank, step in sorted({(int(r), int(s)) for r, s in zip(actions["rank"], actions["step"])}):
        lo, hi = windows[step]
        starts, ends = ops.get((rank, step), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        rows.append((rank, step, lo, hi, hi - lo, union_length(starts, ends, lo, hi)))
    return bubble_table(rows)


def measure_device_plain(device: pd.DataFrame) -> pd.DataFrame:
    """Bubble table of a run without pipeline actions, on the device: each step's window
    runs from its first compute op over all ranks (or from the end of the previous step's
    window, if later) to its last; busy is the union of the rank's compute ops in it.

    Windows never overlap: with the host a step ahead, side streams run step N+1's work
    while the main stream still runs step N's, and per-step spans that overlapped would
    count that stretch's idle twice. So the windows add up to the device's span, and busy
    counts what the device did in each, whichever step launched it."""
    compute = np.flatnonzero((device["kind"] == "compute").to_numpy())  # columns, not a copy of the table
    op_rank, op_step = device["rank"].to_numpy(np.int64)[compute], device["step"].to_numpy(np.int64)[compute]
    starts_all, ends_all = device["start_ns"].to_numpy(np.int64)[compute], device["end_ns"].to_numpy(np.int64)[compute]
    stepped = op_step >= 0
    spans = (
        pd.DataFrame({"step": op_step[stepped], "lo": starts_all[stepped], "hi": ends_all[stepped]})
        .groupby("step")
        .agg(lo=("lo", "min"), hi=("hi", "max"))
        .sort_index()
    )
    present = set(zip(op_rank[stepped].tolist(), op_step[stepped].tolist()))
    # a rank's ops in table order
    per_rank = {r: (starts_all[ops], ends_all[ops]) for r, ops in split_by(op_rank, np.arange(len(op_rank))).items()}
    rows: list[BubbleRow] = []
    previous_end = None
    for step, span_lo, span_hi in zip(spans.index.to_numpy(), spans["lo"], spans["hi"]):
        lo, hi = int(span_lo), int(span_hi)
        if previous_end is not None:
            lo = min(max(lo, previous_end), hi)
        previous_end = hi if previous_end is None else max(previous_end, hi)
        for rank in sorted(r for r, s in present if s == step):
            starts, ends = per_rank[rank]
            inside = (ends > lo) & (starts < hi)
            rows.append((rank, int(step), lo, hi, hi - lo, union_length(starts[inside], ends[inside], lo, hi)))
    return bubble_table(rows)


def _by_rank_step(ops: pd.DataFrame) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    return {
        (r, s): (g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        for (r, s), g in int_groups(ops, ["rank", "step"], sort=False)
    }


def device_figures(run: Run, bubbles: pd.DataFrame) -> DeviceFigures:
    """Launch waits, step-end work, P2P wait and transfer per rank and step (module doc).

    On the device table's columns, a (rank, step)'s ops in table order: no copy of the
    table (256 GPU ranks hold ~700k ops)."""
    device = run.device
    rows = []
    # which ops count as busy: decided once for the run, not once per rank and step
    busy = busy_mask(device)
    rank, step = device["rank"].to_numpy(np.int64), device["step"].to_numpy(np.int64)
    starts, ends = device["start_ns"].to_numpy(np.int64), device["end_ns"].to_numpy(np.int64)
    launched_at = device["launch_end_ns"].to_numpy(np.int64)
    windows = bubbles[["rank", "step", "window_start_ns", "window_end_ns"]].to_numpy(np.int64)
    # a (rank, step)'s ops in table order, found by one code per pair
    op_code, window_code = pair_codes(rank, step, (windows[:, 0], windows[:, 1]))
    ops_of = split_by(op_code, np.arange(len(op_code)))
    paired = run.device_pairs
    for (r, s, lo, hi), code in zip(windows.tolist(), window_code.tolist()):
        mine_ops = ops_of.get(code)
        if mine_ops is None:
            rows.append((r, s, 0, 0, 0, 0))
            continue
        launch_wait = _launch_wait(starts[mine_ops], ends[mine_ops], launched_at[mine_ops], lo, hi)
        work = mine_ops[busy[mine_ops]]
        after = union_length(starts[work], ends[work], hi, max(hi, int(ends[work].max()) if len(work) else hi))
        mine = paired[(paired["step"] == s) & (paired["waiting_rank"] == r)]
        sides = paired[(paired["step"] == s) & ((paired["src_rank"] == r) | (paired["dst_rank"] == r))]
        rows.append((r, s, launch_wait, after, int(mine["wait_ns"].sum()), int(sides["transfer_ns"].sum())))
    per_step = pd.DataFrame(rows, columns=DEVICE_RANK_COLUMNS)
    launched = launched_at >= 0
    ahead = pd.Series(starts[launched] - launched_at[launched]).groupby(rank[launched]).max()
    return DeviceFigures(
        per_step=per_step, host_ahead_ns={r: max(0, int(v)) for r, v in int_items(ahead)}, pairs=paired
    )


def _launch_wait(starts: np.ndarray, ends: np.ndarray, launched: np.ndarray, lo: int, hi: int) -> int:
    """Device idle in [lo, hi) before ops the host had not launched yet: for each gap in the
    rank's device activity (any op, any stream), the part before the next op's launch ended.
    ``launched``: each op's launch end (-1: none); the ops in table order."""
    if not len(starts):
        return 0
    order = np.argsort(starts, kind="quicksort")  # as the table's sort_values("start_ns") did
    starts, ends, launched = starts[order], ends[order], launched[order]
    # device activity covers up to the latest end so far; op i is preceded by a gap from there
    covered = np.maximum(np.concatenate(([lo], np.maximum.accumulate(ends)[:-1])), lo)
    gap_hi = np.minimum(starts, hi)
    waited = np.minimum(launched, gap_hi) - covered
    return int(waited[(gap_hi > covered) & (launched >= 0) & (waited > 0)].sum())
