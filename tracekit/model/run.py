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
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tracekit.model.events import TraceFile

ACTION_COLUMNS = [
    "action_id", "rank", "step", "order", "kind", "stage", "microbatch", "start_ns", "end_ns",
    "label_start_ns", "label_end_ns", "label", "file_id", "source_index",
]
MESSAGE_COLUMNS = [
    "msg_id", "step", "src_rank", "dst_rank", "tag", "nbytes", "direction", "send_post_ns",
    "recv_post_ns", "recv_done_ns", "recv_wait_ns", "arrival_ns", "producer_action", "consumer_action",
    "src_file_id", "src_source_index", "dst_file_id", "dst_source_index",
]
STEP_COLUMNS = ["rank", "step", "step_start_ns", "step_end_ns", "n_actions"]


@dataclass
class ScheduleInfo:
    """The pipeline schedule recognised from the action order alone."""

    name: str                      # "GPipe", "1F1B", "Interleaved1F1B", ... or "unknown"
    p: int                         # pipeline ranks
    v: int                         # stages (model chunks) per rank
    m: int                         # microbatches per step
    placement: str                 # "loop" (stage s on rank s mod p) or "v"
    stage_to_rank: dict[int, int] = field(default_factory=dict)
    split_backward: bool = False   # backward split into I and W
    evidence: list[str] = field(default_factory=list)
    # Data-parallel replicas of the pipeline (ranks of each; one group for a single pipeline).
    # p, stage_to_rank and placement describe the first replica.
    pipelines: list[list[int]] = field(default_factory=list)

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

    def to_dict(self) -> dict:
        return {
            "name": self.name, "p": self.p, "v": self.v, "m": self.m,
            "placement": self.placement,
            "stage_to_rank": {str(k): v for k, v in sorted(self.stage_to_rank.items())},
            "split_backward": self.split_backward, "evidence": list(self.evidence),
            "replicas": self.replicas, "pipelines": [list(g) for g in self.pipelines],
        }


@dataclass
class Run:
    """Everything loaded from one run folder."""

    source: str                                   # the folder or file given
    files: list[TraceFile]
    events: pd.DataFrame                          # see tracekit.model.events
    actions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=ACTION_COLUMNS))
    messages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MESSAGE_COLUMNS))
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    schedule: ScheduleInfo | None = None
    capture: dict | None = None                   # capture.json beside the traces, if any
    warnings: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.events["rank"].unique()) if len(self.events) else []

    @property
    def is_pipeline(self) -> bool:
        return self.schedule is not None and len(self.actions) > 0

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
