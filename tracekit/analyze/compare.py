"""What can be compared between runs, and what changed between two of them.

A run's :class:`Measures` are its bubble ratios (run, per rank) and each cause's share of
the step window (the run's summed idle of that cause over its summed window, so the cause
shares add up to the bubble ratio). Shares of the window mean the same thing whatever the
schedule, the number of ranks or the trace format, so two runs can always be compared on
them; per-rank, per-stage and per-link figures only when the runs line up (same ranks,
same schedule). The CI gate (:mod:`tracekit.gate`) checks the same measures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from tracekit.analyze import Analysis
from tracekit.analyze.grouping import int_groups, int_items
from tracekit.analyze.shares import share
from tracekit.model.run import UNRECOGNISED
from tracekit.version import __version__
from tracekit.vocab import CATEGORIES, CAUSE_NAMES, ms, pct, points, rank_list, signed_ms

# A change smaller than this share of the step window is capture noise, not a finding.
NOTABLE_SHARE = 0.005
# A rank whose compute per step grew by this share of run A's step, and by as much more than
# the ranks' median change, is a cause: the others wait for it. A growth every rank shares (a
# slower host) is not, nor a rank left slowest because others shrank (an uneven split's middle
# stage); run-to-run noise on the samples stays under 3.5% (1f1b against its repeat).
OWN_COMPUTE_GROWTH = 0.05


@dataclass
class Measures:
    """The comparable figures of one run."""

    source: str
    formats: list[str]
    schedule: dict[str, Any] | None  # name, p, v, m (None: no pipeline found)
    n_steps: int
    step_ns: float  # mean step window
    bubble_ratio: float
    rank_bubble: dict[int, float]
    rank_compute_ns: dict[int, float] = field(default_factory=dict)  # busy per step, by rank
    cause_share: dict[str, float] = field(default_factory=dict)  # empty without attribution
    rank_cause_share: dict[int, dict[str, float]] = field(default_factory=dict)
    stage_imbalance_ns: dict[int, float] = field(default_factory=dict)  # per step, by stage
    stage_rank: dict[int, int] = field(default_factory=dict)
    link_comm_ns: dict[tuple[int, int], float] = field(default_factory=dict)  # per step, by link
    incomplete: str = ""  # the ranks missing ("rank 2 of 4 has no trace (...)"); "" when complete
    timeline: str = "host"  # "device" (GPU kernels) or "host" (CPU op spans): figures of the two differ

    @property
    def schedule_label(self) -> str:
        return schedule_label(self.schedule)

    def top_stage(self) -> str | None:
        if not self.stage_imbalance_ns:
            return None
        stage = max(self.stage_imbalance_ns, key=lambda s: self.stage_imbalance_ns[s])
        return f"stage {stage} (rank {self.stage_rank.get(stage, '?')})"  # first replica's rank

    def top_link(self) -> str | None:
        if not self.link_comm_ns:
            return None
        src, dst = max(self.link_comm_ns, key=lambda link: self.link_comm_ns[link])
        return f"link {src}->{dst}"


def schedule_label(schedule: Mapping[str, Any] | None) -> str:
    if not schedule:
        return "no pipeline schedule"
    if schedule["name"] == UNRECOGNISED:
        return f"schedule not recognised: ranks missing, world size {schedule['p']}, m={schedule['m']}"
    replicas = schedule.get("replicas", 1)
    # the job around the pipeline, where the layout says it (its chains are TP shards and DP
    # replicas), else the chains as replicas
    dims = [f"{role.upper()} {schedule[role]}" for role in ("tp", "dp") if schedule.get(role, 1) > 1]
    around = f" x {' x '.join(dims)}" if dims else (f" x{replicas} replicas" if replicas > 1 else "")
    return f"{schedule['name']} p={schedule['p']} v={schedule['v']} m={schedule['m']}" + around


def schedule_key(schedule: dict[str, Any] | None) -> tuple[str, int, int, int] | None:
    """What must match for two runs to have the same schedule."""
    return None if not schedule else (schedule["name"], schedule["p"], schedule["v"], schedule["m"])


def measure(analysis: Analysis) -> Measures:
    """The comparable figures of an analysed run."""
    run = analysis.run
    bubbles = analysis.bubbles
    n_steps = int(bubbles["step"].nunique()) if len(bubbles) else 0
    step_ns = float(bubbles.groupby("step")["window_ns"].max().mean()) if n_steps else 0.0
    per_rank = analysis.summary.per_rank
    sched = run.schedule if analysis.is_pipeline else None
    out = Measures(
        source=run.source,
        formats=sorted({f.format for f in run.files}),
        schedule=None
        if sched is None
        else {
            "name": sched.name,
            "p": sched.p,
            "v": sched.v,
            "m": sched.m,
            **({"replicas": sched.replicas} if sched.replicas > 1 else {}),
            **(
                {role: run.layout.size(role) for role in ("tp", "dp") if run.layout.size(role) > 1}
                if run.layout is not None
                else {}
            ),
        },
        n_steps=n_steps,
        step_ns=step_ns,
        bubble_ratio=analysis.summary.bubble_ratio,
        rank_bubble={int(r): info.bubble_ratio for r, info in per_rank.items()},
        rank_compute_ns={int(r): info.busy_ns / n_steps for r, info in per_rank.items()} if n_steps else {},
        incomplete="" if run.completeness is None or run.completeness.complete else run.completeness.gaps_text(),
        timeline=run.timeline,
    )
    attribution = analysis.attribution
    if attribution is None or not attribution.steps:
        return out
    table = attribution.table
    total_window = analysis.summary.window_ns
    for cause in CATEGORIES:
        out.cause_share[cause] = share(
            float(table[f"{cause}_ns"].sum()), total_window, f"{run.source}: the {cause} share of the step window"
        )
    for (rank,), rows in int_groups(table, ["rank"]):
        window = per_rank[rank].window_ns
        out.rank_cause_share[rank] = {
            c: share(float(rows[f"{c}_ns"].sum()), window, f"{run.source}: rank {rank}'s {c} share") for c in CATEGORIES
        }
    stages = attribution.stage_blame
    for stage, ns in int_items(stages.groupby("stage")["imbalance_ns"].sum()):
        out.stage_imbalance_ns[stage] = float(ns) / n_steps
    if sched is not None:
        out.stage_rank = {int(s): int(r) for s, r in sched.stage_to_rank.items()}
    links = attribution.link_blame
    for (src, dst), rows in int_groups(links, ["src_rank", "dst_rank"]):
        out.link_comm_ns[(src, dst)] = float(rows["comm_ns"].sum()) / n_steps
    return out


@dataclass
class Change:
    """One figure in run A and run B. Shares are 0..1; blame figures are ns per step."""

    scope: str  # "cause", "rank", "stage" or "link"
    key: str  # "comm", "rank 2", "stage 2 (rank 2)", "link 1->2"
    a: float
    b: float
    unit: str = "share"  # "share" (of the window) or "ns" (per step)
    detail: str = ""
    rank: int | None = None  # the rank a "rank" or "compute" change is about; a stage's (first replica's)

    @property
    def delta(self) -> float:
        return self.b - self.a

    def to_dict(self) -> dict[str, Any]:
        out = {
            "scope": self.scope,
            "key": self.key,
            "unit": self.unit,
            "a": _round(self.a),
            "b": _round(self.b),
            "delta": _round(self.delta),
            "detail": self.detail,
        }
        if self.rank is not None:
            out["rank"] = self.rank
        return out


@dataclass
class Comparison:
    """What changed from run A to run B, largest changes first in every list."""

    a: Measures
    b: Measures
    causes: list[Change]  # share of the window per cause
    ranks: list[Change]  # bubble ratio per rank (same ranks only); the ranks in compute_grew first
    rank_causes: dict[int, dict[str, float]]  # rank -> cause -> change of its share
    stages: list[Change]  # imbalance ns per step (same schedule only)
    links: list[Change]  # comm ns per step (same ranks only)
    notes: list[str]
    compute: list[Change] = field(default_factory=list)  # compute ns per step per rank, in rank order
    compute_grew: list[int] = field(default_factory=list)  # ranks whose own compute grew, most first

    @property
    def same_schedule(self) -> bool:
        return schedule_key(self.a.schedule) == schedule_key(self.b.schedule)

    @property
    def same_ranks(self) -> bool:
        return set(self.a.rank_bubble) == set(self.b.rank_bubble)

    @property
    def bubble_delta(self) -> float:
        return self.b.bubble_ratio - self.a.bubble_ratio

    @property
    def step_delta_ns(self) -> float:
        return self.b.step_ns - self.a.step_ns

    @property
    def step_change_pct(self) -> float | None:
        """The step time's change in percent of run A's; None where A has no step time."""
        return 100 * self.step_delta_ns / self.a.step_ns if self.a.step_ns else None

    def top_cause_change(self, rank: int) -> tuple[str, float] | None:
        """The cause whose share of the window changed most on ``rank``, and by how much;
        None where the runs' causes are not compared per rank."""
        causes = self.rank_causes.get(rank)
        if not causes:
            return None
        top = max(causes, key=lambda k: abs(causes[k]))
        return top, causes[top]

    def blame(self) -> list[Change]:
        """The stages' and links' blame that changed, largest change first."""
        return sorted((ch for ch in self.stages + self.links if abs(ch.delta) > 0), key=lambda ch: -abs(ch.delta))

    def rank_order(self) -> str:
        """How the per-rank list is ordered: "rank 2 first (its own compute grew), then ..."."""
        if not self.compute_grew:
            return "largest change first"
        grew = self.compute_grew
        who = f"rank {grew[0]} first (its" if len(grew) == 1 else f"{rank_list(grew)} first (their"
        return f"{who} own compute grew), then the others, largest change first"

    def compute_change(self, rank: int) -> Change | None:
        return next((ch for ch in self.compute if ch.rank == rank), None)

    def incomplete(self) -> list[str]:
        """One line per run with ranks missing: said before anything else."""
        return [
            f"INCOMPLETE RUN {label}: {m.source}: {m.incomplete}: its figures cover the ranks present"
            for label, m in (("A", self.a), ("B", self.b))
            if m.incomplete
        ]

    def matters_most(self) -> Change | None:
        """The change that explains most of the difference, or None if nothing moved."""
        if self.causes:
            top = self.causes[0]
            if abs(top.delta) < NOTABLE_SHARE:
                return None
            return Change("cause", top.key, top.a, top.b, detail=self._where(top.key, top.delta))
        if abs(self.bubble_delta) < NOTABLE_SHARE:
            return None
        detail = ""
        if self.ranks:
            most = max(self.ranks, key=lambda ch: abs(ch.delta))
            detail = f"most on {most.key} ({points(most.delta)})"
        return Change("run", "bubble ratio", self.a.bubble_ratio, self.b.bubble_ratio, detail=detail)

    def headline(self) -> str:
        """The one line that says what matters most."""
        top = self.matters_most()
        if top is None:
            return (
                f"matters most: nothing; no cause moved by {100 * NOTABLE_SHARE:.1f} points of the "
                f"step window or more (bubble ratio {pct(self.a.bubble_ratio)} -> {pct(self.b.bubble_ratio)})"
            )
        if top.scope == "cause":
            line = (
                f"matters most: {CAUSE_NAMES[top.key]} {points(top.delta)} of the step window "
                f"({pct(top.a)} -> {pct(top.b)})"
            )
        else:
            line = f"matters most: {top.key} {points(top.delta)} ({pct(top.a)} -> {pct(top.b)})"
        return f"{line}; {top.detail}" if top.detail else line

    def _where(self, cause: str, delta: float) -> str:
        """What a cause's change comes from (the rank that computes more, the stage or link
        blamed), then the rank that shows most of it (same direction as ``delta``)."""
        parts = []
        blame = self.stages if cause == "imbalance" else self.links if cause == "comm" else []
        top = blame[0] if blame and blame[0].delta * delta > 0 else None
        if cause == "imbalance" and delta > 0 and self.compute_grew:
            parts.append(self._slower(self.compute_grew[0], top))
            if top is not None and top.rank == self.compute_grew[0]:
                top = None  # said with its compute
        if top is not None:
            parts.append(f"{top.key} {signed_ms(top.delta)} ms idle/step")
        if self.rank_causes:
            rank, change = max(
                ((r, c.get(cause, 0.0)) for r, c in self.rank_causes.items()),
                key=lambda rc: rc[1] * (1 if delta >= 0 else -1),
            )
            if change * delta > 0:
                parts.append(f"most on rank {rank} ({points(change)})")
        return ", ".join(parts)

    def _slower(self, rank: int, blamed: Change | None) -> str:
        """ "stage 2 (rank 2) computes 292.4 ms/step more: +755.2 ms idle/step on the ranks that wait for it"."""
        grown = self.compute_change(rank)
        assert grown is not None  # compute_grew names ranks of self.compute
        if blamed is None or blamed.rank != rank:
            return f"rank {rank} computes {ms(grown.delta)} ms/step more"
        return (
            f"{blamed.key} computes {ms(grown.delta)} ms/step more: "
            f"{signed_ms(blamed.delta)} ms idle/step on the ranks that wait for it"
        )

    def to_dict(self) -> dict[str, Any]:
        top = self.matters_most()
        return {
            "kind": "tracekit-diff",
            "tracekit_version": __version__,
            "a": _side(self.a),
            "b": _side(self.b),
            "same_schedule": self.same_schedule,
            "same_ranks": self.same_ranks,
            "incomplete": self.incomplete(),
            "notes": list(self.notes),
            "headline": self.headline(),
            "matters_most": top.to_dict() if top else None,
            "bubble_ratio": {
                "a": _round(self.a.bubble_ratio),
                "b": _round(self.b.bubble_ratio),
                "delta": _round(self.bubble_delta),
            },
            "step_ns": {
                "a": round(self.a.step_ns),
                "b": round(self.b.step_ns),
                "delta": round(self.step_delta_ns),
            },
            "causes": [c.to_dict() for c in self.causes],
            "ranks": [c.to_dict() for c in self.ranks],
            "compute": [c.to_dict() for c in self.compute],
            "compute_grew": list(self.compute_grew),
            "rank_causes": {
                str(r): {c: _round(v) for c, v in causes.items()} for r, causes in self.rank_causes.items()
            },
            "stages": [c.to_dict() for c in self.stages],
            "links": [c.to_dict() for c in self.links],
        }


def compare(a: Measures, b: Measures) -> Comparison:
    """What changed from ``a`` to ``b``."""
    notes = []
    if a.timeline != b.timeline:
        notes.append(
            f"timelines differ (A on the {a.timeline}, B on the {b.timeline}): the host runs ahead of a "
            "GPU, so the figures are not comparable; read both with the same --timeline"
        )
    same_schedule = schedule_key(a.schedule) == schedule_key(b.schedule)
    same_ranks = set(a.rank_bubble) == set(b.rank_bubble)
    both_attributed = bool(a.cause_share and b.cause_share)
    if not same_schedule:
        how = "compared on each cause's share of the step window" if both_attributed else "compared on bubble ratios"
        notes.append(f"schedules differ ({a.schedule_label} vs {b.schedule_label}): {how}")
    if a.formats != b.formats:
        notes.append(f"trace formats differ ({', '.join(a.formats)} vs {', '.join(b.formats)})")
    if not same_ranks:
        notes.append(f"ranks differ ({len(a.rank_bubble)} vs {len(b.rank_bubble)}): no per-rank comparison")
    causes: list[Change] = []
    if both_attributed:
        causes = [Change("cause", c, a.cause_share[c], b.cause_share[c]) for c in CATEGORIES]
    else:
        missing = " and ".join(m.source for m in (a, b) if not m.cause_share)
        notes.append(f"{missing}: no idle time attributed (no pipeline schedule found), so no per-cause comparison")
    ranks: list[Change] = []
    rank_causes: dict[int, dict[str, float]] = {}
    links: list[Change] = []
    compute: list[Change] = []
    if same_ranks:
        ranks = [Change("rank", f"rank {r}", a.rank_bubble[r], b.rank_bubble[r], rank=r) for r in sorted(a.rank_bubble)]
        if a.rank_compute_ns and b.rank_compute_ns:
            compute = [
                Change("compute", f"rank {r}", a.rank_compute_ns[r], b.rank_compute_ns[r], "ns", rank=r)
                for r in sorted(a.rank_compute_ns)
            ]
        if a.rank_cause_share and b.rank_cause_share:
            rank_causes = {
                r: {c: b.rank_cause_share[r][c] - a.rank_cause_share[r][c] for c in CATEGORIES}
                for r in sorted(a.rank_cause_share)
                if r in b.rank_cause_share
            }
        links = [
            Change("link", f"link {s}->{d}", a.link_comm_ns.get((s, d), 0.0), b.link_comm_ns.get((s, d), 0.0), "ns")
            for s, d in sorted(set(a.link_comm_ns) | set(b.link_comm_ns))
        ]
    stages: list[Change] = []
    if same_schedule:
        stage_rank = {**a.stage_rank, **b.stage_rank}
        stages = [
            Change(
                "stage",
                f"stage {s} (rank {stage_rank.get(s, '?')})",
                a.stage_imbalance_ns.get(s, 0.0),
                b.stage_imbalance_ns.get(s, 0.0),
                "ns",
                rank=stage_rank.get(s),
            )
            for s in sorted(set(a.stage_imbalance_ns) | set(b.stage_imbalance_ns))
        ]
    grew = grew_on_their_own(compute, a.step_ns)
    return Comparison(
        a=a,
        b=b,
        causes=_largest_first(causes),
        ranks=_cause_first(ranks, grew),
        rank_causes=rank_causes,
        stages=_largest_first(stages),
        links=_largest_first(links),
        notes=notes,
        compute=compute,
        compute_grew=grew,
    )


def grew_on_their_own(compute: list[Change], step_ns: float) -> list[int]:
    """The ranks whose compute per step grew, and grew more than the ranks' median change, by
    :data:`OWN_COMPUTE_GROWTH` of the step ``step_ns`` each, most grown first: the causes the
    others wait on."""
    if len(compute) < 2 or step_ns <= 0:
        return []
    least = OWN_COMPUTE_GROWTH * step_ns
    median = statistics.median(c.delta for c in compute)
    grown = sorted((c for c in compute if c.delta >= least and c.delta - median >= least), key=lambda c: -c.delta)
    return [c.rank for c in grown if c.rank is not None]


def _largest_first(changes: list[Change]) -> list[Change]:
    return sorted(changes, key=lambda c: -abs(c.delta))


def _cause_first(ranks: list[Change], grew: list[int]) -> list[Change]:
    """The ranks whose own compute grew (in ``grew``'s order), then the others, largest change first."""
    causes = [next(c for c in ranks if c.rank == rank) for rank in grew]
    return causes + _largest_first([c for c in ranks if c.rank not in grew])


def _side(m: Measures) -> dict[str, Any]:
    return {
        "source": m.source,
        "formats": m.formats,
        "schedule": m.schedule,
        "n_steps": m.n_steps,
        "step_ns": round(m.step_ns),
        "bubble_ratio": _round(m.bubble_ratio),
        "causes": {c: _round(v) for c, v in m.cause_share.items()},
        "incomplete": m.incomplete or None,
    }


def _round(x: float) -> float:
    return round(float(x), 6)
