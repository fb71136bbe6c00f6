"""The analysis document (``tracekit analyze --json``) as Python types: one TypedDict for each
object of ``analysis.schema.json``, the same keys, the same keys required.

:func:`tracekit.render.json.to_document` builds an :class:`AnalysisDocument`; the console and
the figures of :mod:`tracekit.render.document` read one. tests/test_schema_types.py holds the
types and the schema file to each other (every key, required or not, every nested object),
so that a key added to one and not the other fails there.

A mapping keyed by a rank, stage or replica has string keys (``"0"``), as JSON writes them;
the idle causes (``causes``) are keyed by :data:`tracekit.vocab.IDLE_CAUSES`' columns, a
``dict`` here so that a cause is added in the registry alone. Two objects are open, as the
schema leaves them: ``capture`` (the capture manifest's own fields) and a finding's
``figures`` (different for each cause).

No ``from __future__ import annotations`` here: TypedDict tells ``NotRequired`` keys from
evaluated annotations only.
"""

from typing import Any, NotRequired, TypedDict

# A rank's idle by cause: one integer per registered cause column (``warmup_ns``, ...).
CauseColumns = dict[str, int]


class FileDoc(TypedDict):
    """One trace file read (``files[]``)."""

    path: str
    format: str
    rank: int
    ranks: NotRequired[list[int]]
    world_size: NotRequired[int | None]
    backend: NotRequired[str | None]
    host: NotRequired[str | None]
    clock: str
    rank_source: str
    n_events_raw: NotRequired[int]
    truncated: bool
    warnings: list[str]


class CutShortDoc(TypedDict):
    rank: int
    why: str


class CompletenessDoc(TypedDict):
    complete: bool
    world_size: int | None
    world_size_source: str
    ranks_present: list[int]
    missing_ranks: list[int]
    cut_short: NotRequired[list[CutShortDoc]]
    message: str


class LabelsDoc(TypedDict):
    table: str
    actions_from: str
    matched: dict[str, int]


class ScheduleDoc(TypedDict):
    name: str
    p: int
    v: int
    m: int
    placement: str
    stage_to_rank: dict[str, int]
    split_backward: bool
    evidence: list[str]
    replicas: NotRequired[int]
    pipelines: NotRequired[list[list[int]]]
    flush_free: NotRequired[bool]


class RoleGroupDoc(TypedDict):
    role: str
    ranks: list[int]
    name: NotRequired[str]
    description: NotRequired[str]


class LayoutDoc(TypedDict):
    line: str
    world: int
    dims: dict[str, int]
    order: str
    source: str
    groups: list[RoleGroupDoc]
    replicas: list[list[int]]
    evidence: list[str]


class SummaryDoc(TypedDict):
    bubble_ratio: float | None
    window_ns: int
    busy_ns: int
    idle_ns: int
    n_ranks: int
    n_steps: int
    n_actions: int
    n_messages: int


class TheoryDoc(TypedDict):
    schedule: str
    formula: str
    bubble_ratio: float | None
    note: NotRequired[str]
    balanced_replay_bubble_ratio: float | None
    durations_ns: dict[str, int]


class FindingDoc(TypedDict):
    cause: str
    severity: str
    headline: str
    advice: str
    cost_share: float
    figures: dict[str, Any]


class RankRow(TypedDict):
    """One rank's window, busy and idle (``ranks[]``, ``steps[].ranks[]``,
    ``host_view.ranks[]``); with attribution, its idle by cause."""

    rank: int
    window_ns: int
    busy_ns: int
    idle_ns: int
    bubble_ratio: float | None
    causes: NotRequired[CauseColumns]
    signed_shapley_ns: NotRequired[dict[str, float]]


class ReplayDoc(TypedDict):
    measured_makespan_ns: int
    replay_makespan_ns: int
    residual_ns: int
    ideal_makespan_ns: int


class PathStepDoc(TypedDict):
    """One action of a step's critical path (``steps[].critical_path[]``)."""

    action_id: int
    rank: int
    kind: str
    stage: int
    microbatch: int
    compute_ns: int
    overhead_ns: NotRequired[int]
    via: str
    msg_id: NotRequired[int]
    link: NotRequired[str]
    comm_ns: NotRequired[int]


class StepDoc(TypedDict):
    step: int
    window_start_ns: int
    window_end_ns: int
    ranks: list[RankRow]
    replay: NotRequired[ReplayDoc]
    critical_path: NotRequired[list[PathStepDoc]]


class StageBlameDoc(TypedDict):
    stage: int
    imbalance_ns: int
    rank: int
    ranks: NotRequired[list[int]]


class LinkBlameDoc(TypedDict):
    src_rank: int
    dst_rank: int
    comm_ns: int


class BlameDoc(TypedDict):
    stages: list[StageBlameDoc]
    links: list[LinkBlameDoc]


class HostViewDoc(TypedDict):
    timeline: str
    bubble_ratio: float | None
    ranks: list[RankRow]


class DeviceRankDoc(TypedDict):
    rank: int
    launch_wait_ns: int
    step_end_ns: int
    p2p_wait_ns: int
    p2p_transfer_ns: int
    collective_idle_ns: NotRequired[int]
    launch_wait_share: float | None
    host_ahead_ns: int
    before_profile_ns: NotRequired[int]


class DevicePairDoc(TypedDict):
    """A P2P (or collective SendRecv) kernel pair: model.run.DEVICE_PAIR_COLUMNS."""

    msg_id: int
    step: int
    src_rank: int
    dst_rank: int
    direction: str
    send_start_ns: int
    send_end_ns: int
    recv_start_ns: int
    recv_end_ns: int
    waiting_rank: int
    wait_ns: int
    transfer_ns: int


class DeviceDoc(TypedDict):
    host_ahead_max_ns: int
    ranks: list[DeviceRankDoc]
    p2p_pairs: list[DevicePairDoc]
    n_ops: NotRequired[int]
    collective_pairs: NotRequired[list[DevicePairDoc]]


class SlicesDoc(TypedDict):
    microbatches: list[int]
    forward_ns: list[int]
    backward_ns: list[int]
    total_ns: list[int]
    growth: float
    dearest: int
    skew_idle_ns: int | None
    replay_idle_ns: int | None
    skew_idle_share: float | None


class SpreadDoc(TypedDict):
    min: float
    median: float
    max: float


class SpreadNsDoc(TypedDict):
    min: int
    median: int
    max: int


class PlaceDoc(TypedDict):
    place: int
    stages: list[int]
    ranks: list[int]
    bubble_ratio: SpreadDoc
    idle_per_step_ns: SpreadNsDoc
    busy_per_step_ns: SpreadNsDoc
    worst_replica: int
    worst_rank: int
    slowest_replica: int
    causes_ns: dict[str, int]
    top_cause: str | None
    tp_rank: NotRequired[int]


class SlowRankDoc(TypedDict):
    rank: int
    replica: int
    place: int
    stages: list[int]
    busy_per_step_ns: int
    others_median_ns: int
    slowdown: float


class SlowReplicaDoc(TypedDict):
    replica: int
    replica_ranks: list[int]
    every_place: bool
    min_slowdown: float
    median_slowdown: float
    ranks: list[SlowRankDoc]
    excess_per_step_ns: int
    cost_share: float


class SlowestEverywhereDoc(TypedDict):
    place: int
    stages: list[int]
    ranks: list[int]
    min_ratio: float
    median_ratio: float


class PatternsDoc(TypedDict):
    slow_replicas: list[SlowReplicaDoc]
    slowest_everywhere: SlowestEverywhereDoc | None


class TimelineReplicaDoc(TypedDict):
    replica: int
    why: str


class RollupDoc(TypedDict):
    n_replicas: int
    replicas: list[list[int]]
    n_steps: int
    slow_factor: float
    bubble_ratio: SpreadDoc
    places: list[PlaceDoc]
    ranks_by_bubble: list[int]
    replica_step_ns: dict[str, int]
    patterns: PatternsDoc
    replica_bubble: dict[str, float]
    timeline_replicas: list[TimelineReplicaDoc]


class DimensionRankDoc(TypedDict):
    rank: int
    tp_ns: int
    tp_share_of_busy: float
    dp_ns: int
    dp_exposed_ns: int
    dp_overlapped_ns: int
    busy_ns: int
    busy_compute_only_ns: int
    bubble_ratio: float
    bubble_ratio_compute_only: float
    dp_after_own_ns: int
    recompute_ns: NotRequired[int]
    recompute_share_of_busy: NotRequired[float]


class SharedLinkDoc(TypedDict):
    """One link's transfers with and without a TP collective (``shared_links.links[]``)."""

    src_rank: int
    dst_rank: int
    n_transfers_overlapped: int
    n_transfers_alone: int
    median_transfer_overlapped_ns: int
    median_transfer_alone_ns: int
    slowdown: float


class SharedLinksDoc(TypedDict):
    overlap_ns: dict[str, int]
    n_transfers_overlapped: int
    n_transfers_alone: int
    median_transfer_overlapped_ns: int
    median_transfer_alone_ns: int
    slowdown: float
    links: NotRequired[list[SharedLinkDoc]]


class DimensionStageDoc(TypedDict):
    stage: int
    ranks: list[int]
    recompute_ns: int
    recompute_share_of_busy: float


class DimensionsDoc(TypedDict):
    source: str
    tp_ns: int
    tp_share_of_busy: float
    dp_ns: int
    dp_exposed_ns: int
    ranks: list[DimensionRankDoc]
    per_rank_step_ns: dict[str, int]
    bubble_ratio_compute_only: float
    shared_links: NotRequired[SharedLinksDoc | None]
    recompute_ns: NotRequired[int]
    recompute_share_of_busy: NotRequired[float]
    stages: NotRequired[list[DimensionStageDoc]]


class AnalysisDocument(TypedDict):
    """The whole document: plain JSON-able data (times in integer ns, ratios 0..1)."""

    schema_version: str
    tracekit_version: str
    source: str
    files: list[FileDoc]
    warnings: list[str]
    completeness: NotRequired[CompletenessDoc | None]
    pipeline: bool
    timeline: NotRequired[str]
    schedule: ScheduleDoc | None
    capture: NotRequired[dict[str, Any] | None]
    summary: SummaryDoc
    theory: TheoryDoc | None
    ranks: list[RankRow]
    steps: list[StepDoc]
    blame: BlameDoc
    findings: NotRequired[list[FindingDoc]]
    host_view: NotRequired[HostViewDoc | None]
    device: NotRequired[DeviceDoc | None]
    labels: LabelsDoc
    slices: NotRequired[SlicesDoc | None]
    rollup: NotRequired[RollupDoc | None]
    layout: NotRequired[LayoutDoc | None]
    dimensions: NotRequired[DimensionsDoc | None]
