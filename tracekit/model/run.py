"""A loaded run: the files, their events, and the pipeline reconstructed from them.

``Run`` is the one object that flows from ingest through reconstruction into the
analyses and renderers. Tables are pandas DataFrames (ns integers everywhere).

``actions`` (one row per compute action, per rank and step):
    action_id, rank, step, order (position on its rank within the step), kind
    (``F`` forward, ``B`` full backward, ``I`` input-grad, ``W`` weight-grad),
    stage, microbatch (-1 when unknown), start_ns / end_ns (the compute span: the
    top-level compute ops inside the label, never the receive wait), label_start_ns /
    label_end_ns (the label's own span), label, file_id, source_index (the label event,
    or the first compute op where there is no label).

``messages`` (one row per matched point-to-point message):
    msg_id, step, src_rank, dst_rank, tag, nbytes, direction (``fwd`` activations,
    ``bwd`` gradients, ``?``), send_post_ns (sender posted), recv_post_ns (receiver
    posted), recv_done_ns (receiver's wait returned: data is there), recv_wait_ns (how
    long the receiver was blocked on it), arrival_ns (when the data was at the receiver:
    recv_done_ns if it blocked, else an estimate no later than its wait call), producer_action / consumer_action (action_id,
    -1 when unknown), src_file_id / src_source_index, dst_file_id / dst_source_index.

``steps`` (one row per rank and step):
    rank, step, step_start_ns / step_end_ns (``ProfilerStep#N`` on that rank),
    n_actions.

``device`` (one row per GPU kernel, memcpy or memset; empty for CPU runs, and where the GPU
ranks were reduced where parsed: outputs that draw ops, the report and exports, read it):
    op_id, rank, step (of the host call that launched it, else where it ran), kind
    (``compute``, ``p2p`` NCCL point-to-point, ``collective`` other NCCL/RCCL), start_ns /
    end_ns (on the device), stream, launch_ns / launch_end_ns / launch_tid (the CUDA API
    call that launched it, -1 when unknown), action_id (the action whose label span holds
    the launch, -1 for none), name, file_id, source_index, peer (what the op's own row names).

``device_summary`` (:class:`tracekit.model.device.DeviceSummary`): the device timeline as the
analyses read it, each GPU rank reduced to its steps and P2P kernels (whether or not the
``device`` table is held).

``timeline`` says which clock the actions and messages are on: ``device`` (spans of the
kernels each action launched, messages by their SendRecv kernels) or ``host`` (CPU op
spans: CPU runs, and GPU runs read with ``--timeline host``). On the device timeline the
actions keep their host spans as ``host_start_ns`` / ``host_end_ns``, and ``busy_ns`` is the
union of the kernels each launched (see :func:`compute_ns`). Every load's actions also carry
``fixed_ns`` (:data:`FIXED_COLUMN`): the part of the action's host span outside its work ops,
which a smaller microbatch does not shrink (:mod:`tracekit.reconstruct.fixed_part`; what-if
reads it on the host timeline only).

``completeness`` says whether every rank of the job left a trace (see :class:`Completeness`):
a run with a rank missing is never read as a smaller pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracekit.model.device import DeviceSummary
from tracekit.model.events import TraceFile

if TYPE_CHECKING:
    from tracekit.model.layout import Layout
    import numpy as np
    import pandas as pd

    from tracekit.schemas.analysis import CompletenessDoc, ScheduleDoc

# pandas loads where a Run is made: parser workers read the column lists below without it.

ACTION_COLUMNS = [
    "action_id",
    "rank",
    "step",
    "order",
    "kind",
    "stage",
    "microbatch",
    "start_ns",
    "end_ns",
    "label_start_ns",
    "label_end_ns",
    "label",
    "file_id",
    "source_index",
]
#: an optional action column of host timelines: the ns of the action's span that does not
#: scale with a microbatch's rows (tracekit.reconstruct.fixed_part), carried by every load
FIXED_COLUMN = "fixed_ns"
MESSAGE_COLUMNS = [
    "msg_id",
    "step",
    "src_rank",
    "dst_rank",
    "tag",
    "nbytes",
    "direction",
    "send_post_ns",
    "recv_post_ns",
    "recv_done_ns",
    "recv_wait_ns",
    "arrival_ns",
    "producer_action",
    "consumer_action",
    "src_file_id",
    "src_source_index",
    "dst_file_id",
    "dst_source_index",
]
STEP_COLUMNS = ["rank", "step", "step_start_ns", "step_end_ns", "n_actions"]
DEVICE_OP_COLUMNS = [
    "op_id",
    "rank",
    "step",
    "kind",
    "start_ns",
    "end_ns",
    "stream",
    "launch_ns",
    "launch_end_ns",
    "launch_tid",
    "action_id",
    "name",
    "file_id",
    "source_index",
    "peer",
]
TIMELINES = ("auto", "device", "host")
# One row per pair of device P2P kernels (a send's and its receive's): from matched messages
# (msg_id >= 0) or, in runs without pipeline actions, the k-th P2P kernel of rank a for b with
# the k-th of b for a (direction "?" when the trace does not say which side sent).
DEVICE_PAIR_COLUMNS = [
    "msg_id",
    "step",
    "src_rank",
    "dst_rank",
    "direction",
    "send_start_ns",
    "send_end_ns",
    "recv_start_ns",
    "recv_end_ns",
    "waiting_rank",
    "wait_ns",
    "transfer_ns",
]


def compute_ns(actions: pd.DataFrame) -> pd.Series:
    """Each action's compute time: on the device timeline the union of its kernels
    (``busy_ns``: device idle between them, the host still launching, is not compute),
    else its span."""
    if "busy_ns" in actions:
        return actions["busy_ns"]
    return actions["end_ns"] - actions["start_ns"]


def fused_groups(actions: pd.DataFrame) -> np.ndarray:
    """Per action row, the number of the fused range it is a part of, else -1: the parts of
    one label (same rank, label and label span) of different kinds, a forward and a
    backward run as one range (DualPipeV's ``OVERLAP_F_B``). Such a range starts once all
    its parts' inputs are there and sends what either part made once it ends."""
    import numpy as np

    out = np.full(len(actions), -1, dtype=np.int64)
    if len(actions) < 2 or "label_start_ns" not in actions:
        return out
    labelled = (actions["label"].astype(str) != "").to_numpy()
    keys = actions.loc[labelled, ["rank", "label", "label_start_ns", "label_end_ns"]]
    if not len(keys):
        return out
    group = keys.groupby(list(keys.columns), sort=False).ngroup().to_numpy()
    kind_code = np.unique(actions.loc[labelled, "kind"].astype(str).to_numpy(), return_inverse=True)[1]
    pairs = np.unique(np.stack([group, kind_code.reshape(-1)]), axis=1)  # each (group, kind) once
    fused = np.bincount(pairs[0], minlength=int(group.max()) + 1) > 1  # more than one kind
    rows = np.flatnonzero(labelled)
    out[rows] = np.where(fused[group], group, -1)
    return out


def rank_ranges(ranks: list[int], most: int = 8) -> str:
    """ "0-3, 5, 7-9": ranks in order, runs of consecutive ranks as ranges, at most ``most``
    parts (then " ...")."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ", ".join(parts[:most]) + (" ..." if len(parts) > most else "")


# The world size's source when no file states it and the ranks present have a gap.
INFERRED_WORLD_SIZE = "the highest rank present (no file states the world size)"


@dataclass
class Completeness:
    """Which ranks of the job left a whole trace: decided when the run is loaded (ranks
    missing, files cut off) and when its steps are found (a rank covering fewer steps).

    ``world_size`` is what the files state (Kineto ``distributedInfo``, an nsys report's
    rank marks), else what ``capture.json`` says, else, when the rank numbers present have a
    gap, at least the highest rank + 1; ``None`` when nothing says (ranks 0..n-1 present).
    ``cut_short`` names each rank whose trace is there but partial, and why ("its file
    ends early ...", "covers steps 2-3 of 2-4"): the run is incomplete, though its
    schedule can still be read from the ranks, which are all there.
    """

    world_size: int | None
    world_size_source: str  # "distributedInfo", "capture.json", "highest rank present", ...
    ranks_present: list[int]
    missing_ranks: list[int] = field(default_factory=list)
    cut_short: dict[int, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.missing_ranks and not self.cut_short

    @property
    def every_rank(self) -> bool:
        """Every rank of the job left a trace (whole or not): the pipeline's shape can be read."""
        return not self.missing_ranks

    @property
    def single_rank(self) -> bool:
        """One rank, and nothing says the job had more: there is no pipeline to analyse."""
        return self.every_rank and len(self.ranks_present) == 1

    def missing_text(self) -> str:
        """ "rank 2 of 4 has no trace (found ranks 0-1, 3)"; "" when no rank is missing."""
        if not self.missing_ranks:
            return ""
        n = len(self.missing_ranks)
        which = f"rank {self.missing_ranks[0]}" if n == 1 else f"{n} ranks ({rank_ranges(self.missing_ranks)})"
        of = (
            f"of at least {self.world_size}"
            if self.world_size_source == INFERRED_WORLD_SIZE
            else f"of {self.world_size}"
        )
        verb = "has" if n == 1 else "have"
        return f"{which} {of} {verb} no trace (found {ranks_phrase(self.ranks_present)})"

    def cut_short_text(self) -> str:
        """ "rank 0's trace is cut short (rank0.json ends early ...)"; "" when none is."""
        if not self.cut_short:
            return ""
        parts = [f"rank {rank}'s trace is cut short ({why})" for rank, why in sorted(self.cut_short.items())[:3]]
        more = len(self.cut_short) - len(parts)
        return "; ".join(parts) + (f"; and {more} more rank(s)" if more > 0 else "")

    def gaps_text(self) -> str:
        """What makes the run incomplete, ranks missing and traces cut short; "" when complete."""
        return "; ".join(text for text in (self.missing_text(), self.cut_short_text()) if text)

    def message(self) -> str:
        """The line an incomplete run is announced with, before anything else."""
        if self.complete:
            return ""
        if self.missing_ranks:
            n = len(self.ranks_present)
            return (
                f"INCOMPLETE RUN: {self.gaps_text()}; world size {self.world_size_text()}: figures "
                f"cover the {n} rank{'s' if n != 1 else ''} present; the schedule is not recognised "
                "from a partial pipeline"
            )
        return (
            f"INCOMPLETE RUN: {self.gaps_text()}: the figures of {ranks_phrase(sorted(self.cut_short))} and of the run "
            "cover only what was recorded (work missing from a trace reads as idle); copy or "
            "export the trace again, or profile the same steps on every rank"
        )

    def world_size_text(self) -> str:
        """ "4 from distributedInfo", "at least 3 (no file states it ...)"."""
        if self.world_size_source == INFERRED_WORLD_SIZE:
            return f"at least {self.world_size} (no file states it; that is the highest rank present + 1)"
        return f"{self.world_size} from {self.world_size_source}"

    def to_dict(self) -> CompletenessDoc:
        return {
            "complete": self.complete,
            "world_size": self.world_size,
            "world_size_source": self.world_size_source,
            "ranks_present": list(self.ranks_present),
            "missing_ranks": list(self.missing_ranks),
            "cut_short": [{"rank": rank, "why": why} for rank, why in sorted(self.cut_short.items())],
            "message": self.message(),
        }


def ranks_phrase(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


# The schedule name of a run with ranks missing: never recognised from part of a pipeline.
UNRECOGNISED = "unknown"


@dataclass
class ScheduleInfo:
    """The pipeline schedule recognised from the action order alone."""

    name: str  # "GPipe", "1F1B", "Interleaved1F1B", ... or "unknown"
    p: int  # pipeline ranks
    v: int  # stages (model chunks) per rank
    m: int  # microbatches per step
    placement: str  # "loop" (stage s on rank s mod p) or "v"
    stage_to_rank: dict[int, int] = field(default_factory=dict)
    split_backward: bool = False  # backward split into I and W
    evidence: list[str] = field(default_factory=list)
    # Data-parallel replicas of the pipeline (ranks of each; one group for a single pipeline).
    # p, stage_to_rank and placement describe the first replica.
    pipelines: list[list[int]] = field(default_factory=list)
    # No flush between steps (PipeDream-2BW): microbatches are in flight across a rank's
    # step boundary, so steps are per-rank stretches between weight updates, not global windows.
    flush_free: bool = False

    @property
    def replicas(self) -> int:
        return max(1, len(self.pipelines))

    def ranks_of_stage(self, stage: int) -> list[int]:
        """Every rank that runs ``stage``: one per data-parallel replica."""
        rank = self.stage_to_rank.get(int(stage), -1)
        if rank < 0 or len(self.pipelines) < 2 or rank not in self.pipelines[0]:
            return [rank] if rank >= 0 else []
        place = self.pipelines[0].index(rank)
        return [group[place] for group in self.pipelines if place < len(group)]

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def to_dict(self) -> ScheduleDoc:
        return {
            "name": self.name,
            "p": self.p,
            "v": self.v,
            "m": self.m,
            "placement": self.placement,
            "stage_to_rank": {str(k): v for k, v in sorted(self.stage_to_rank.items())},
            "split_backward": self.split_backward,
            "evidence": list(self.evidence),
            "replicas": self.replicas,
            "pipelines": [list(g) for g in self.pipelines],
            "flush_free": self.flush_free,
        }


_EMPTY: dict[tuple[str, ...], pd.DataFrame] = {}  # one empty table per column list, copied out


def _empty(columns: list[str]) -> pd.DataFrame:
    """An empty table of these columns: a copy of one made once (~0.01 ms, not ~0.15 ms; a
    run makes several, e.g. every table a run without a pipeline has no rows in)."""
    key = tuple(columns)
    if key not in _EMPTY:
        import pandas as pd

        _EMPTY[key] = pd.DataFrame(columns=columns)
    return _EMPTY[key].copy()


@dataclass(frozen=True)
class Run:
    """Everything loaded from one run folder: built once, as read (:func:`tracekit.ingest.read_run`)
    and again as reconstructed (:func:`tracekit.reconstruct.whole_run.reconstruct`), never
    changed after (the tables inside are pandas frames: a test may still edit one)."""

    source: str  # the folder or file given
    files: list[TraceFile]
    events: pd.DataFrame  # see tracekit.model.events
    actions: pd.DataFrame = field(default_factory=lambda: _empty(ACTION_COLUMNS))
    messages: pd.DataFrame = field(default_factory=lambda: _empty(MESSAGE_COLUMNS))
    steps: pd.DataFrame = field(default_factory=lambda: _empty(STEP_COLUMNS))
    schedule: ScheduleInfo | None = None
    device: pd.DataFrame = field(default_factory=lambda: _empty(DEVICE_OP_COLUMNS))
    device_summary: DeviceSummary = field(default_factory=DeviceSummary)
    device_pairs: pd.DataFrame = field(default_factory=lambda: _empty(DEVICE_PAIR_COLUMNS))
    # SendRecv kernels of collectives (all_to_all) paired across a two-rank run: not messages
    collective_pairs: pd.DataFrame = field(default_factory=lambda: _empty(DEVICE_PAIR_COLUMNS))
    timeline: str = "host"  # "device" or "host": see the module doc
    # ns subtracted from each rank's times to put it on the reference clock (ranks not moved: absent)
    clock_shifts: dict[int, int] = field(default_factory=dict)
    # Ranks reduced where parsed (tracekit.reconstruct.per_rank; GPU ranks, and host ranks of
    # a run without a pipeline): the busy rows of a run without a pipeline, (rank, step, window
    # start, end, window, busy), that their host rows (not held) would give to measure_plain;
    # None: measured from run.events.
    host_busy: list[tuple[int, int, int, int, int, int]] | None = None
    # The label table the actions came from ("torch-pp", "megatron-nvtx", "custom", "none":
    # tracekit.reconstruct.labels) and how many ranges each table matched.
    labels: str = "none"
    actions_from: str = "segmentation"  # "labels" (a table's action rules) or "segmentation"
    label_counts: dict[str, int] = field(default_factory=dict)
    capture: dict[str, Any] | None = None  # capture.json beside the traces, if any
    # the job around the pipeline: TP shards, DP replicas, rank order (tracekit.reconstruct.layout)
    layout: Layout | None = None
    completeness: Completeness | None = None  # set by the loader; None: not checked
    # what reading and reconstruction found to warn of, each once (the analysis' own are its own)
    warnings: tuple[str, ...] = ()

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.events["rank"].unique()) if len(self.events) else []

    @property
    def is_complete(self) -> bool:
        """Every rank of the job left a whole trace (or nothing says otherwise)."""
        return self.completeness is None or self.completeness.complete

    @property
    def has_every_rank(self) -> bool:
        """Every rank of the job left a trace, whole or cut short: the pipeline's shape
        (schedule, p, replicas) can be read from them."""
        return self.completeness is None or self.completeness.every_rank

    @property
    def is_pipeline(self) -> bool:
        return self.schedule is not None and len(self.actions) > 0


def add_warning(warnings: list[str], message: str) -> None:
    """``message`` at the end of ``warnings``, unless it is there already."""
    if message not in warnings:
        warnings.append(message)
