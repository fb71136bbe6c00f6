"""What is wrong with a run and what to try, in sentences built from its own numbers.

:func:`diagnose` turns an :class:`~tracekit.analyze.Analysis` into ranked findings, one per
cause of idle time: stage imbalance, comm latency, host overhead, and the fill/drain the
schedule itself forces. A finding's cost is the device time the cause left idle, as a share
of all ranks' step windows (the attributed idle, summed over ranks and steps).

Ranking: faults (imbalance, comm, overhead) that cost at least ``HIGH_SHARE`` of the device
time come first, largest first: something in this run is broken and costs a lot. Then the
rest by cost, the schedule's own fill/drain among them: every pipeline pays it and only a
change of configuration (more microbatches, interleaving) shrinks it. Findings that only
inform (a fill/drain with nothing to gain, no pipeline found) come last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from tracekit.analyze.device import LAUNCH_BOUND_SHARE
from tracekit.analyze.grouping import int_idxmax, int_items
from tracekit.analyze.shares import share
from tracekit.analyze.theory import theoretical_bubble
from tracekit.model.groups import split_by
from tracekit.model.run import Run, ScheduleInfo, compute_ns, fused_groups, rank_ranges, ranks_phrase
from tracekit.vocab import ACTION_KIND_NAMES, IDLE_CAUSES, rank_list

if TYPE_CHECKING:  # the package imports this module
    from tracekit.analyze import Analysis
    from tracekit.analyze.replicas import SlowReplica
    from tracekit.schemas.analysis import FindingDoc

# Severity by cost (share of the device time): "high" at or above HIGH_SHARE, "medium" at
# or above MEDIUM_SHARE: a fix gains at most that much throughput.
HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.05
# The m what-if raises m (doubling, at most MAX_M_FACTOR times) until the schedule's own
# bubble is at most this share of the step.
TARGET_BUBBLE = 0.10
MAX_M_FACTOR = 8
FAULTS = ("imbalance", "comm", "overhead")


@dataclass(frozen=True)
class Finding:
    """One cause of idle time: what is wrong (headline), what to try (advice), and the
    figures both sentences were built from."""

    cause: str  # "imbalance" | "comm" | "overhead" | "launch_bound" | "fill_drain" | "no_pipeline" | ...
    severity: str  # "high" | "medium" | "low" | "info"
    headline: str
    advice: str
    cost_share: float  # idle device time of this cause / all ranks' step windows
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> FindingDoc:
        # asdict: the fields above by name, ``figures`` copied deep (a dataclass in it as a dict)
        return cast("FindingDoc", asdict(self))


def severity_of(cost_share: float) -> str:
    if cost_share >= HIGH_SHARE:
        return "high"
    return "medium" if cost_share >= MEDIUM_SHARE else "low"


def diagnose(analysis: Analysis) -> list[Finding]:
    """Ranked findings for ``analysis`` (most important first)."""
    launch = _launch_bound(analysis)
    if not analysis.is_pipeline:
        return launch + [_no_pipeline(analysis)]
    window_ns = max(analysis.summary.window_ns, 1)
    totals = _cause_totals(analysis)
    n_steps = max(int(analysis.bubbles["step"].nunique()), 1)
    faults: list[Finding] = []
    imbalance = _imbalance(analysis, totals.get("imbalance", 0), window_ns)
    if imbalance:
        faults.append(imbalance)
    if analysis.attribution is not None:
        for finding in (
            _comm(analysis, totals["comm"], window_ns, n_steps),
            _overhead(analysis, totals["overhead"], window_ns),
            _shared_links(analysis, window_ns),
        ):
            if finding:
                faults.append(finding)
    schedule = _fill_drain(analysis, totals, window_ns)
    faults = _with_launch_bound(faults, launch)
    findings = faults + ([schedule] if schedule else [])
    urgent = sorted((f for f in faults if f.cost_share >= HIGH_SHARE), key=lambda f: -f.cost_share)
    rest = sorted((f for f in findings if f not in urgent and f.severity != "info"), key=lambda f: -f.cost_share)
    ranked = urgent + rest + [f for f in findings if f.severity == "info"]
    if not analysis.run.is_complete:
        return [_from_partial_data(f, analysis.run) for f in ranked]
    return ranked


def _from_partial_data(finding: Finding, run: Run) -> Finding:
    """A finding from a run with ranks missing: said to cover the ranks present, and never
    high: the missing ranks may hold the real cause (a slow stage, a late link)."""
    completeness = run.completeness
    assert completeness is not None  # asked only for an incomplete run
    present = len(completeness.ranks_present)
    severity = "medium" if finding.severity == "high" else finding.severity
    scope = (
        f"On the {present} ranks present (the run is incomplete)"
        if completeness.missing_ranks
        else f"On what was recorded ({ranks_phrase(sorted(completeness.cut_short))} cut short)"
    )
    headline = f"{scope}: {finding.headline[:1].lower()}{finding.headline[1:]}"
    return replace(finding, severity=severity, headline=headline, figures={**finding.figures, "partial": True})


def _cause_totals(analysis: Analysis) -> dict[str, int]:
    if analysis.attribution is None:
        return {}
    table = analysis.attribution.table
    return {c[:-3]: int(table[c].sum()) for c in table.columns if c.endswith("_ns") and c != "idle_ns"}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(ns: float) -> str:
    if 0 < abs(ns) < 50_000:  # below 0.05 ms "0.0 ms" would say nothing
        return f"{ns / 1e3:.0f} us"
    return f"{ns / 1e6:.1f} ms"


def stage_compute_ns(actions: pd.DataFrame) -> pd.Series:
    """Mean compute time per step of each stage on one of its ranks (index: stage): with
    data-parallel replicas a stage runs on a rank per replica, and the mean is over them."""
    actions = actions[actions["step"] >= 0]
    per_step = compute_ns(actions).groupby([actions["stage"], actions["rank"], actions["step"]]).sum()
    return per_step.groupby(level="stage").mean().astype(float)


def _imbalance(analysis: Analysis, idle_ns: int, window_ns: int) -> Finding | None:
    run = analysis.run
    compute = stage_compute_ns(run.actions)
    if len(compute) < 2:
        return None
    blame = analysis.attribution.stage_blame if analysis.attribution is not None else pd.DataFrame()
    if len(blame):
        stage = int_idxmax(blame.groupby("stage")["imbalance_ns"].sum())
    else:
        stage = int_idxmax(compute)
    others = compute.drop(stage)
    ratio = float(compute[stage] / others.median()) if others.median() > 0 else float("inf")
    balanced = float(compute.mean())
    move_share = max(0.0, (compute[stage] - balanced) / compute[stage]) if compute[stage] > 0 else 0.0
    rank = run.schedule.stage_to_rank.get(stage, -1) if run.schedule else -1
    if analysis.attribution is None:
        # Without attribution only the compute split is known: cost is the slow stage's
        # excess over the balanced split, idle on every other rank while it works, over the
        # device time of a step (every rank's window). The excess fits in a window, so at
        # most (ranks - 1) / ranks of it.
        n_ranks = analysis.summary.n_ranks
        n_steps = max(int(analysis.bubbles["step"].nunique()), 1)
        excess_idle = max(0.0, compute[stage] - balanced) * (n_ranks - 1)
        cost = share(excess_idle, window_ns / n_steps, f"{run.source}: the stage imbalance's cost")
    else:
        cost = share(idle_ns, window_ns, f"{run.source}: the stage imbalance's cost")
    ranks = run.schedule.ranks_of_stage(stage) if run.schedule else []
    where = f"stage {stage}" + (f" (rank {rank})" if len(ranks) == 1 else f" ({rank_list(ranks)})" if ranks else "")
    figures = {
        "stage": stage,
        "rank": rank,
        "stage_compute_ns": int(compute[stage]),
        "others_median_compute_ns": int(others.median()),
        "slowdown": round(ratio, 3),
        "balanced_compute_ns": int(balanced),
        "move_share": round(move_share, 3),
        "idle_ns": int(idle_ns),
        "cost_share": round(cost, 4),
    }
    if ratio >= 1.1:
        headline = (
            f"{where[0].upper()}{where[1:]} is {ratio:.1f}x slower than the others ({_ms(compute[stage])} vs "
            f"{_ms(others.median())} of compute per step): the wait for it idles "
            f"{_pct(cost)} of the device time."
        )
        advice = (
            f"Move layers off {where}: about {_pct(move_share)} of its work, so that every "
            f"stage computes about {_ms(balanced)} per step."
        )
    else:
        headline = (
            f"Stage imbalance idles {_pct(cost)} of the device time, most of it waiting on "
            f"{where}, whose compute per step is {ratio:.2f}x the others' median."
        )
        advice = (
            f"Look for uneven work on {where} (slow microbatches, stragglers on its host); "
            "its mean compute is close to the others', so the variation, not the split, costs time."
        )
    return Finding("imbalance", severity_of(cost), headline, advice, cost, figures)


def message_latencies(analysis: Analysis) -> pd.DataFrame:
    """Per message: link, post delay (producer end -> send posted) and wire time (send
    posted -> data at the receiver), in ns, with the message and its producer. Messages
    without a known producer are left out."""
    run = analysis.run
    messages = run.messages
    columns = ["msg_id", "producer_action", "src_rank", "dst_rank", "step", "post_delay_ns", "wire_ns", "latency_ns"]
    if len(messages) == 0:
        return pd.DataFrame(columns=columns)
    # a fused range (OVERLAP_F_B) sends what either part made once the range ends
    actions = run.actions
    group = fused_groups(actions)
    ends = actions["end_ns"].to_numpy()
    if (group >= 0).any():
        last = pd.Series(ends).groupby(group).transform("max").to_numpy()
        ends = np.where(group >= 0, last, ends)
    producer_end = pd.Series(ends, index=actions["action_id"].to_numpy())
    known = messages[messages["producer_action"].isin(producer_end.index)]
    end = producer_end.loc[known["producer_action"]].to_numpy()
    out = known[["msg_id", "producer_action", "src_rank", "dst_rank", "step"]].copy()
    if "leave_ns" in known and (known["leave_ns"] >= 0).any():
        # device messages: posted when the data could leave, then one rendezvous transfer
        # (what the receiving kernel spun before its sender came is not the link's)
        device = (known["leave_ns"] >= 0).to_numpy()
        post = np.maximum(known["leave_ns"].to_numpy() - end, 0)
        wire = known["transfer_ns"].to_numpy()
        host_latency = np.maximum(known["arrival_ns"].to_numpy() - end, 0)
        out["latency_ns"] = np.where(device, post + wire, host_latency)
        out["post_delay_ns"] = np.where(device, post, np.clip(known["send_post_ns"].to_numpy() - end, 0, host_latency))
    else:
        out["latency_ns"] = np.maximum(known["arrival_ns"].to_numpy() - end, 0)
        out["post_delay_ns"] = np.clip(known["send_post_ns"].to_numpy() - end, 0, out["latency_ns"])
    out["wire_ns"] = out["latency_ns"] - out["post_delay_ns"]
    return out[columns]


# A send posted this much later than the link's typical one is the sender's doing, worth naming.
LATE_POST_FACTOR = 3


def _worst_late_post(analysis: Analysis, latencies: pd.DataFrame) -> dict[str, Any] | None:
    """The message whose send was posted latest after its producer ended, where that delay
    stands out (``LATE_POST_FACTOR`` x the median wire time and over 1 ms): an engine or host
    holding one send back, not a slow link."""
    if not len(latencies):
        return None
    worst = latencies.iloc[int(np.argmax(latencies["post_delay_ns"].to_numpy()))]
    floor = max(LATE_POST_FACTOR * float(latencies["wire_ns"].median()), 1e6)
    if float(worst["post_delay_ns"]) < floor:
        return None
    actions = analysis.run.actions
    producer = actions[(actions["action_id"] == int(worst["producer_action"])).to_numpy()].iloc[0]
    return {
        "msg_id": int(worst["msg_id"]),
        "step": int(worst["step"]),
        "src_rank": int(worst["src_rank"]),
        "dst_rank": int(worst["dst_rank"]),
        "kind": str(producer["kind"]),
        "stage": int(producer["stage"]),
        "microbatch": int(producer["microbatch"]),
        "post_delay_ns": int(worst["post_delay_ns"]),
    }


# Transfers this much slower while a TP collective runs on either end, over at least this
# many of each, are a finding.
SHARED_LINK_SLOWDOWN = 1.25
SHARED_LINK_MIN_TRANSFERS = 5
SHARED_LINKS_NAMED = 3  # links and ranks a shared_links finding names


def _shared_links(analysis: Analysis, window_ns: int) -> Finding | None:
    """TP collectives and the pipeline's transfers contending for the same links: transfers
    slower while a TP all-reduce runs on either end (tracekit.analyze.dimensions.SharedLinks).
    The headline names the links where most slowed transfers ran and the ranks whose TP and P2P
    kernels overlapped longest; the trace shows the slowdown, not the topology behind it."""
    links = analysis.dimensions.shared_links if analysis.dimensions is not None else None
    if links is None or links.slowdown < SHARED_LINK_SLOWDOWN:
        return None
    if min(links.n_overlapped, links.n_alone) < SHARED_LINK_MIN_TRANSFERS:
        return None
    cost = (links.median_overlapped_ns - links.median_alone_ns) * links.n_overlapped / window_ns
    worst = [link for link in links.links if link.n_overlapped][:SHARED_LINKS_NAMED]
    on_links = ", ".join(
        f"{link.src_rank}->{link.dst_rank} ({link.n_overlapped}{' transfers' if i == 0 else ''}"
        + (f" at {link.slowdown:.2f}x)" if link.slowdown != 1.0 else ")")
        for i, link in enumerate(worst)
    )
    longest = sorted((r for r, ns in links.overlap_ns.items() if ns > 0), key=lambda r: (-links.overlap_ns[r], r))
    named = longest[:SHARED_LINKS_NAMED]
    n_steps = max(int(analysis.bubbles["step"].nunique()), 1)
    headline = (
        f"Pipeline transfers take {links.slowdown:.2f}x as long while a tensor-parallel collective runs on "
        f"either end (median {links.median_overlapped_ns / 1e6:.2f} ms vs {links.median_alone_ns / 1e6:.2f} ms, "
        f"{links.n_overlapped} of {links.n_overlapped + links.n_alone} transfers; most on links {on_links}): "
        "TP all-reduces and pipeline P2P appear to contend for the same links. TP and P2P kernels overlap "
        f"longest on {rank_list(named)} ("
        + ", ".join(f"{links.overlap_ns[r] / 1e6:.1f}" for r in named)
        + f" ms over {n_steps} step{'s' if n_steps > 1 else ''})."
    )
    advice = (
        "The trace shows the slowdown, not which links the ranks share: check where these ranks sit. Keep each "
        "TP group on the fastest links (within a node: Megatron's rank order puts TP ranks next to each other, "
        "so TP <= GPUs per node keeps them there) and let only pipeline traffic cross nodes; where both must "
        "share a link, posting P2P between actions (Megatron without --overlap-p2p-communication) keeps the "
        "transfers off the TP all-reduces, at the cost of no longer hiding them behind compute."
    )
    return Finding("shared_links", severity_of(cost), headline, advice, cost, dict(links.to_dict()))


def _comm(analysis: Analysis, idle_ns: int, window_ns: int, n_steps: int) -> Finding | None:
    """Messages: whose the latency is. A send posted late after its producer ended is the
    sender's (its engine or host held it back); the time from the post to the data being
    there is the link's. The advice names the one that dominates on the blamed link."""
    if idle_ns <= 0 or analysis.attribution is None:  # comm idle is attributed idle
        return None
    cost = share(idle_ns, window_ns, f"{analysis.run.source}: the comm latency's cost")
    links = analysis.attribution.link_blame
    latencies = message_latencies(analysis)
    figures: dict[str, Any] = {"idle_ns": int(idle_ns), "cost_share": round(cost, 4)}
    link_text = "its links"
    if len(links):
        by_link = links.groupby(["src_rank", "dst_rank"])["comm_ns"].sum().sort_values(ascending=False)
        src, dst = (int(x) for x in by_link.index[0])
        link_text = f"link {src}->{dst}"
        figures.update(src_rank=src, dst_rank=dst, link_idle_ns_per_step=int(by_link.iloc[0] / n_steps))
    if "src_rank" in figures:  # the blamed link's own messages, where it has any
        on_link = latencies[
            (latencies["src_rank"] == figures["src_rank"]) & (latencies["dst_rank"] == figures["dst_rank"])
        ]
        latencies = on_link if len(on_link) else latencies
    worst = _worst_late_post(analysis, latencies)  # the example is one of the blamed link's
    post_share = 0.0
    if len(latencies):
        median_latency = float(latencies["latency_ns"].median())
        median_post = float(latencies["post_delay_ns"].median())
        median_wire = float(latencies["wire_ns"].median())
        total = float(latencies["latency_ns"].sum())
        post_share = float(latencies["post_delay_ns"].sum()) / total if total > 0 else 0.0
        figures.update(
            median_latency_ns=int(median_latency),
            median_post_delay_ns=int(median_post),
            median_wire_ns=int(median_wire),
            post_delay_share=round(post_share, 4),
            n_messages=int(len(latencies)),
        )
    else:
        median_latency = median_post = median_wire = 0.0
    if worst is not None:
        figures["worst_late_post"] = worst
    headline = f"Messages cost {_pct(cost)} of the device time in waiting"
    if "link_idle_ns_per_step" in figures:
        headline += f"; those on {link_text} cost {_ms(figures['link_idle_ns_per_step'])} of idle per step"
    if median_latency:
        headline += f" (a message arrives {_ms(median_latency)} after its producer ends, median)"
    headline += "."
    late = ""
    if worst is not None:
        late = (
            f" The latest: rank {worst['src_rank']} posts its {ACTION_KIND_NAMES.get(worst['kind'], worst['kind'])} "
            f"send of microbatch {worst['microbatch']} (stage {worst['stage']}, step {worst['step']}) to rank "
            f"{worst['dst_rank']} {_ms(worst['post_delay_ns'])} after that action ended."
        )
    if median_latency and post_share >= 0.5:
        sender = figures.get("src_rank")
        who = f"rank {sender}" if sender is not None else "the senders"
        advice = (
            f"The latency is {who}'s, not the link's: sends are posted {_ms(median_post)} after the producing "
            f"action ends (median; {_pct(post_share)} of the latency on {link_text}), while the wire takes "
            f"{_ms(median_wire)}.{late} Post sends as soon as the data is ready (an engine or host thread "
            "holding them back, or a sender that runs behind)."
        )
    else:
        advice = (
            f"The latency is {link_text}'s: a message spends {_ms(median_wire)} on the wire "
            f"(median; posted {_ms(median_post)} after its producer ends).{late} Overlap communication with "
            f"compute or speed up {link_text}."
            if median_latency
            else f"Overlap communication with compute or speed up {link_text}."
        )
    return Finding("comm", severity_of(cost), headline, advice, cost, figures)


def _overhead(analysis: Analysis, idle_ns: int, window_ns: int) -> Finding | None:
    if idle_ns <= 0:
        return None
    cost = share(idle_ns, window_ns, f"{analysis.run.source}: the host overhead's cost")
    actions = analysis.run.actions
    n_actions = max(int((actions["step"] >= 0).sum()), 1)
    per_action = idle_ns / n_actions
    headline = (
        f"Host overhead idles {_pct(cost)} of the device time: ranks sat idle with their "
        f"input there and the previous action done, {_ms(per_action)} per action on average."
    )
    advice = (
        "Cut per-action host work: fewer, larger microbatches, CUDA graphs or less Python "
        "between actions, and keep data loading and the optimizer off the step's critical path."
    )
    figures = {
        "idle_ns": int(idle_ns),
        "cost_share": round(cost, 4),
        "n_actions": n_actions,
        "idle_ns_per_action": int(per_action),
    }
    return Finding("overhead", severity_of(cost), headline, advice, cost, figures)


def _schedule(analysis: Analysis) -> ScheduleInfo:
    """The run's schedule: the pipeline findings are only asked of a pipeline run."""
    sched = analysis.run.schedule
    assert sched is not None, f"{analysis.run.source}: a pipeline finding for a run with no schedule"
    return sched


def m_what_if(analysis: Analysis) -> tuple[int, float | None]:
    """The smallest doubling of m (at most ``MAX_M_FACTOR`` x) that brings the schedule's
    own bubble to ``TARGET_BUBBLE``, and that bubble."""
    sched = _schedule(analysis)
    d = analysis.durations_ns
    t_f, t_b, t_w = _durations(d)
    m = sched.m
    best = (m, theoretical_bubble(sched.name, sched.p, sched.v, m, t_f, t_b, t_w).bubble_ratio)
    factor = 2
    while factor <= MAX_M_FACTOR:
        ratio = theoretical_bubble(sched.name, sched.p, sched.v, m * factor, t_f, t_b, t_w).bubble_ratio
        if ratio is None:
            break
        best = (m * factor, ratio)
        if ratio <= TARGET_BUBBLE:
            break
        factor *= 2
    return best


def _durations(d: dict[str, int]) -> tuple[float, float, float | None]:
    t_f = d.get("F", 1)
    if "I" in d and "W" in d and "B" not in d:
        t_b = d["I"] + d["W"]
    else:
        t_b = d.get("B", d.get("I", 0) + d.get("W", 0)) or 2 * t_f
    return t_f, t_b, d.get("W")


def _fill_drain(analysis: Analysis, totals: dict[str, int], window_ns: int) -> Finding | None:
    sched = _schedule(analysis)
    theory = analysis.theory
    if theory is None or theory.bubble_ratio is None:
        return None
    idle_ns = sum(totals.get(c.key, 0) for c in IDLE_CAUSES if c.kind == "schedule")
    measured = (
        share(idle_ns, window_ns, f"{analysis.run.source}: the fill/drain's cost") if totals else theory.bubble_ratio
    )
    new_m, new_ratio = m_what_if(analysis)
    figures: dict[str, Any] = {
        "schedule": sched.name,
        "p": sched.p,
        "v": sched.v,
        "m": sched.m,
        "theory_bubble": round(theory.bubble_ratio, 4),
        "idle_ns": int(idle_ns),
        "cost_share": round(measured, 4),
        "what_if_m": new_m,
        "what_if_bubble": None if new_ratio is None else round(new_ratio, 4),
    }
    name = f"{sched.name} (p={sched.p}, v={sched.v}, m={sched.m})"
    replay = analysis.balanced_replay_ratio
    if theory.bubble_ratio <= TARGET_BUBBLE:
        if replay is None or replay <= TARGET_BUBBLE:
            headline = (
                f"The schedule's own fill/drain is small: {name} leaves {_pct(theory.bubble_ratio)} "
                f"of the step idle in theory ({_pct(measured)} of the device time measured)."
            )
            advice = "Nothing to gain from the schedule itself; the other findings say where the rest goes."
            return Finding("fill_drain", "info", headline, advice, measured, figures)
        # Fill and drain last as long at any m while the steady state grows with it, so
        # doubling m turns a share s into s / (s + 2 (1 - s)).
        doubled = replay / (replay + 2 * (1 - replay))
        figures.update(balanced_replay_bubble=round(replay, 4), what_if_m=2 * sched.m, what_if_bubble=round(doubled, 4))
        headline = (
            f"{name} as run leaves {_pct(replay)} of each step idle even with balanced stages and "
            f"free messages, against {_pct(theory.bubble_ratio)} in its closed form "
            f"({_pct(measured)} of the device time measured in fill, drain and schedule gaps)."
        )
        suggestions = [_Suggestion(f"raising m to {2 * sched.m}", sched.name, sched.v, 2 * sched.m, doubled)]
        closed = (
            f"Raising m to {2 * sched.m} would cut that share to about {_pct(doubled)}: fill and drain "
            "last as long while the steady state doubles"
        )
        return _advised(analysis, headline, closed, suggestions, measured, figures)
    headline = (
        f"m={sched.m} is small for p={sched.p}: {name} fills and drains the pipeline for "
        f"{_pct(theory.bubble_ratio)} of each step in theory ({_pct(measured)} of the device "
        "time measured)."
    )
    advice = ""
    suggestions = []
    if new_ratio is not None and new_m > sched.m and new_ratio < theory.bubble_ratio:
        advice = (
            f"Raising m to {new_m} cuts the fill/drain bubble from {_pct(theory.bubble_ratio)} to {_pct(new_ratio)}"
        )
        t_f, t_b, t_w = _durations(analysis.durations_ns)
        # every doubling up to the closed form's m: with per-action costs a smaller m may pay more
        factor = 2
        while sched.m * factor <= new_m:
            m = sched.m * factor
            ratio = theoretical_bubble(sched.name, sched.p, sched.v, m, t_f, t_b, t_w).bubble_ratio
            suggestions.append(_Suggestion(f"raising m to {m}", sched.name, sched.v, m, ratio))
            factor *= 2
    t_f, t_b, t_w = _durations(analysis.durations_ns)
    interleaved = theoretical_bubble("Interleaved1F1B", sched.p, 2, sched.m, t_f, t_b, t_w).bubble_ratio
    if sched.name in ("GPipe", "1F1B") and interleaved is not None:
        figures["what_if_interleaved_v2_bubble"] = round(interleaved, 4)
        alternative = f"an interleaved schedule with v=2 gives {_pct(interleaved)} at m={sched.m}"
        advice = f"{advice}; {alternative}" if advice else alternative[0].upper() + alternative[1:]
        suggestions.append(
            _Suggestion(f"Interleaved1F1B with v=2 at m={sched.m}", "Interleaved1F1B", 2, sched.m, interleaved)
        )
    if not advice:
        advice = "Run more microbatches per step or more virtual stages per rank"
    return _advised(analysis, headline, advice, suggestions, measured, figures)


@dataclass(frozen=True)
class _Suggestion:
    """A configuration the closed form suggests, to be replayed on the run's own costs."""

    text: str  # "raising m to 32", as the advice says it
    schedule: str
    v: int
    m: int
    closed_form_bubble: float | None


# Replays per prediction in the findings, and the most replayed actions they may cost.
_FINDING_REPLAYS = 16
_FINDING_REPLAY_BUDGET = 400_000
_FINDING_KEEP = "global-batch"


def _advised(
    analysis: Analysis,
    headline: str,
    closed_form_advice: str,
    suggestions: list[_Suggestion],
    measured: float,
    figures: dict[str, Any],
) -> Finding:
    """The fill/drain finding with its suggestions ranked by their replayed step time (the
    closed form ignores this run's overheads, latencies and spread; its own replay does not):
    those that do not shorten the step are dropped, and when none does the finding only
    informs. Where the run cannot be replayed, the closed form's advice, said to be that."""
    replayed, why_not = _replayed(analysis, suggestions)
    if replayed is None:
        note = f" (closed form only: {why_not})" if why_not else ""
        return Finding(
            "fill_drain", severity_of(measured), headline, closed_form_advice + note + ".", measured, figures
        )
    ranked = sorted(replayed, key=lambda r: r["replay_step_change"])
    figures["replay_keep"] = _FINDING_KEEP
    figures["suggestions"] = ranked
    for row in ranked:  # the figures earlier versions gave, for the closed form's own two suggestions
        if row["m"] == figures.get("what_if_m") and row["schedule"] == _schedule(analysis).name:
            figures.update(
                replay_what_if_bubble=row["replay_bubble"], replay_what_if_step_change=row["replay_step_change"]
            )
        elif row["schedule"] == "Interleaved1F1B" and row["v"] == 2 and "what_if_interleaved_v2_bubble" in figures:
            figures.update(
                replay_interleaved_v2_bubble=row["replay_bubble"],
                replay_interleaved_v2_step_change=row["replay_step_change"],
            )
    helps = [r for r in ranked if r["helps"]]
    dropped = [r for r in ranked if not r["helps"]]
    how = (
        "Replayed with this run's own overheads, latencies and spread (tracekit whatif, --keep global-batch: "
        "an action's work scales as 1/m, its fixed part stays; only approximately true on GPUs)"
    )

    def said(r: dict[str, Any]) -> str:
        closed = "" if r["closed_form_bubble"] is None else f", {_pct(r['closed_form_bubble'])} in closed form"
        return f"{r['text']}: step {r['replay_step_change']:+.0%} (bubble {_pct(r['replay_bubble'])}{closed})"

    if not helps:
        figures["replay_none_helps"] = True
        advice = (
            f"{how}, no change of the schedule shortens this run's step as it stands: "
            + "; ".join(said(r) for r in ranked)
            + ". More, smaller actions pay the per-action overheads and latencies more often; fix those first."
        )
        return Finding("fill_drain", "info", headline, advice, measured, figures)
    advice = f"{how}, best first: " + "; ".join(said(r) for r in helps) + "."
    if dropped:
        advice += (
            " Left out, slower as replayed: "
            + "; ".join(f"{r['text']} (step {r['replay_step_change']:+.0%})" for r in dropped)
            + "."
        )
    return Finding("fill_drain", severity_of(measured), headline, advice, measured, figures)


def _replayed(analysis: Analysis, suggestions: list[_Suggestion]) -> tuple[list[dict[str, Any]] | None, str]:
    """Each suggestion replayed on this run's own costs (tracekit.analyze.whatif), as figures
    (``helps``: the replayed step is shorter than the measured one); None and why when the
    run cannot be replayed."""
    from tracekit.analyze.schedules import GENERATORS
    from tracekit.analyze.costs import cost_model
    from tracekit.analyze.whatif import predict, replays_within

    sched = _schedule(analysis)
    if not suggestions:
        return None, ""
    if analysis.attribution is None:
        return None, "not replayed: the analysis ran without attribution"
    if sched.name not in GENERATORS:  # every schedule whatif can generate
        return None, f"not replayed: tracekit whatif does not generate {sched.name} orders yet"
    # the interleaved alternative needs m to be a multiple of p
    playable = [s for s in suggestions if s.schedule != "Interleaved1F1B" or s.m % sched.p == 0]

    def replays(chosen: list[_Suggestion]) -> int:
        return replays_within(
            _FINDING_REPLAY_BUDGET, sched.p, [(s.schedule, s.v, s.m) for s in chosen], most=_FINDING_REPLAYS
        )

    # on a large run, the largest m first gives way to keep the replays within the budget
    while len(playable) > 1 and replays(playable) < 2:
        playable.remove(max(playable, key=lambda s: s.v * s.m))
    samples = max(2, replays(playable))
    try:
        # the same cost model as tracekit whatif's, each action's fixed part included
        model = cost_model(analysis.run, list(analysis.attribution.graphs.values()))
        measured_step = float(analysis.bubbles.groupby("step")["window_ns"].first().mean())
        found = [(s, predict(model, s.schedule, s.v, s.m, keep=_FINDING_KEEP, samples=samples)) for s in playable]
    except Exception as err:  # noqa: BLE001 - a finding never fails the analysis; whatif says why
        return None, f"not replayed: {err}"
    rows = []
    for s, p in found:
        change = p.step_ns / measured_step - 1 if measured_step else 0.0
        rows.append(
            {
                "text": s.text,
                "schedule": s.schedule,
                "v": s.v,
                "m": s.m,
                "closed_form_bubble": None if s.closed_form_bubble is None else round(s.closed_form_bubble, 4),
                "replay_bubble": round(p.bubble_ratio, 4),
                "replay_step_change": round(change, 4),
                "helps": change < 0,
            }
        )
    return rows, ""


def _with_launch_bound(faults: list[Finding], launch: list[Finding]) -> list[Finding]:
    """A launch-bound rank is where the host overhead comes from: one finding says both, with
    the overhead's attributed cost (its wait reaches every rank down the pipeline)."""
    if not launch:
        return faults
    bound = launch[0]
    overhead = next((f for f in faults if f.cause == "overhead"), None)
    if overhead is None:
        return faults + launch
    cost = max(bound.cost_share, overhead.cost_share)
    headline = (
        f"{bound.headline} Host overhead idles {_pct(overhead.cost_share)} of the device time, "
        "on the other ranks too: they wait for it down the pipeline."
    )
    merged = replace(
        bound,
        severity=severity_of(cost),
        headline=headline,
        cost_share=cost,
        figures={**bound.figures, "overhead": overhead.figures, "cost_share": round(cost, 4)},
    )
    return [merged if f is overhead else f for f in faults]


def _launch_bound(analysis: Analysis) -> list[Finding]:
    """Ranks whose GPU waited for the host to launch the next op for at least
    ``LAUNCH_BOUND_SHARE`` of their window (device timeline only): one finding naming them."""
    figures = analysis.device
    if figures is None:
        return []
    per_rank = figures.per_rank()
    windows = analysis.summary.per_rank
    bound = []
    for rank, wait_ns in int_items(per_rank["launch_wait_ns"]):
        window = windows[rank].window_ns if rank in windows else 0
        if window and wait_ns / window >= LAUNCH_BOUND_SHARE:
            bound.append((rank, int(wait_ns), wait_ns / window))
    if not bound:
        return []
    bound.sort(key=lambda b: -b[2])
    total_window = max(analysis.summary.window_ns, 1)
    waited = sum(b[1] for b in bound)
    cost = share(min(waited, total_window), total_window, f"{analysis.run.source}: the launch waits' cost")
    named = ", ".join(f"rank {r}'s GPU waited for the host {_pct(x)} of the step" for r, _, x in bound[:4])
    more = f" (and {len(bound) - 4} more ranks)" if len(bound) > 4 else ""
    headline = (
        f"The host does not keep the GPU fed: {named}{more}: launch-bound (the next kernel "
        "was not launched yet; that idle is counted as overhead)."
    )
    # Its peers' P2P kernels spin until its own come: their waits are its host's, not theirs
    # (nor their links'), however the queues on their NCCL streams pass it on.
    spun = _spun_for(analysis.run.device_pairs)
    n_steps = max(int(analysis.bubbles["step"].nunique()), 1)
    for r, _, _ in bound[:4]:
        if r in spun:
            peers, spun_ns = spun[r]
            headline += (
                f" The P2P kernels of {ranks_phrase(peers)} spun {_ms(spun_ns / n_steps)} a step waiting for rank {r}."
            )
    advice = (
        "Cut host time per kernel: CUDA graphs (torch.compile mode='reduce-overhead'), fused or larger "
        "kernels, fewer small ops, less Python between launches, no host syncs (.item(), .cpu()) in the step."
    )
    figures_out = {
        "ranks": [
            {
                "rank": r,
                "launch_wait_ns": w,
                "share": round(x, 4),
                "peers_spun_ns": spun[r][1] if r in spun else 0,
                "peers_spinning": spun[r][0] if r in spun else [],
            }
            for r, w, x in bound
        ],
        "cost_share": round(cost, 4),
    }
    return [Finding("launch_bound", severity_of(cost), headline, advice, cost, figures_out)]


def _spun_for(pairs: pd.DataFrame) -> dict[int, tuple[list[int], int]]:
    """Per rank, from the device P2P pairs: the ranks whose kernels spun waiting for its
    kernel, and how long they spun in all (ns)."""
    waiting = pairs["waiting_rank"].to_numpy(np.int64)
    src, dst = pairs["src_rank"].to_numpy(np.int64), pairs["dst_rank"].to_numpy(np.int64)
    spun = (waiting >= 0) & (pairs["wait_ns"].to_numpy(np.int64) > 0)
    waited_for = np.where(waiting == dst, src, dst)[spun]
    out: dict[int, tuple[list[int], int]] = {}
    for rank, rows in split_by(waited_for, np.flatnonzero(spun)).items():
        peers = sorted({int(r) for r in waiting[rows].tolist()})
        out[int(rank)] = (peers, int(pairs["wait_ns"].to_numpy(np.int64)[rows].sum()))
    return out


def _no_pipeline(analysis: Analysis) -> Finding:
    summary = analysis.summary
    idle = summary.bubble_ratio
    n_ranks = summary.n_ranks
    completeness = analysis.run.completeness
    if completeness is not None and completeness.single_rank:
        headline = f"One rank: no pipeline to analyse; it sat idle {_pct(idle)} of its step windows."
    else:
        headline = (
            f"No pipeline-parallel schedule found in these traces; the {n_ranks} rank(s) sat idle "
            f"{_pct(idle)} of their step windows."
        )
    advice = (
        "Record a pipeline-parallel run (torch.distributed.pipelining, PP: labels) to have "
        "idle time attributed to causes."
    )
    return Finding("no_pipeline", "info", headline, advice, idle, {"idle_share": round(idle, 4), "n_ranks": n_ranks})


__all__ = ["Finding", "diagnose", "message_latencies", "m_what_if", "stage_compute_ns"]


# Causes of the findings about patterns across data-parallel replicas (tracekit.analyze.replicas).
REPLICA_CAUSES = ("slow_replica", "slow_rank", "slowest_everywhere")


def replica_findings(analysis: Analysis) -> list[Finding]:
    """Findings that name patterns across data-parallel replicas (a slow replica, a slow rank
    among its peers, a stage slowest in every replica) instead of listing ranks; none for a
    single pipeline or identical replicas."""
    rollup = analysis.replicas
    if rollup is None or rollup.n_replicas < 2 or not analysis.run.is_complete:
        return []
    found = [_slow_replica(slow) for slow in rollup.slow_replicas]
    everywhere = rollup.slowest_everywhere
    if everywhere is not None:
        where = _stages_word(everywhere.stages)
        found.append(
            Finding(
                "slowest_everywhere",
                "info",
                f"{where[0].upper()}{where[1:]} is the slowest in every replica ({everywhere.min_ratio:.2f}x "
                f"to {max(everywhere.median_ratio, everywhere.min_ratio):.2f}x the other stages' median compute, "
                f"in all {rollup.n_replicas} replicas): the model split, not a host.",
                f"Rebalance the split: every replica runs the same layers on {where}, so moving layers off it "
                "helps every replica alike; replacing a host would not.",
                0.0,
                {
                    "place": everywhere.place,
                    "stages": list(everywhere.stages),
                    "ranks": list(everywhere.ranks),
                    "min_ratio": round(everywhere.min_ratio, 3),
                    "median_ratio": round(everywhere.median_ratio, 3),
                    "replicas": rollup.n_replicas,
                },
            )
        )
    return found


def _stages_word(stages: list[int]) -> str:
    return f"stage {stages[0]}" if len(stages) == 1 else "stages " + ",".join(map(str, stages))


def _slow_replica(slow: SlowReplica) -> Finding:
    """One slow replica: slower on every stage (a host), or on some ranks (a GPU)."""
    from tracekit.analyze.replicas import MAX_SLOW_RANKS

    cost = slow.cost_share
    figures = {**slow.to_dict(), "cost_share": round(cost, 4)}
    ranks_text = f"ranks {rank_ranges(slow.replica_ranks)}"
    stretch = (
        f"; its steps take {_ms(slow.excess_per_step_ns)} longer than the other replicas' median, and every "
        f"rank's step window with them ({_pct(cost)} of the device time)"
        if slow.excess_per_step_ns > 0
        else ""
    )
    if slow.every_place:
        headline = (
            f"Replica {slow.replica} ({ranks_text}) is {_pct(slow.min_slowdown - 1)} slower on every stage "
            f"(compute per step {_pct(slow.min_slowdown - 1)} to "
            f"{_pct(max(r.slowdown for r in slow.ranks) - 1)} above the other replicas' median){stretch}: "
            "a slow host?"
        )
        advice = (
            f"Compare the hosts of {ranks_text} with the others' (clocks and thermal throttling, other jobs "
            "on the node, a different GPU or driver): the same stages run faster in every other replica."
        )
        return Finding("slow_replica", severity_of(cost), headline, advice, cost, figures)
    named = slow.ranks[:MAX_SLOW_RANKS]
    parts = [
        f"rank {r.rank} ({_stages_word(r.stages)} of replica {r.replica}) computes {r.slowdown:.2f}x what "
        f"{_stages_word(r.stages)} does in the other replicas ({_ms(r.busy_per_step_ns)} vs "
        f"{_ms(r.others_median_ns)} per step)"
        for r in named
    ]
    more = f" and {len(slow.ranks) - len(named)} more of its ranks" if len(slow.ranks) > len(named) else ""
    headline = f"{'; '.join(parts)}{more}{stretch}: a slow GPU or host?"
    headline = headline[0].upper() + headline[1:]
    which = ", ".join(f"rank {r.rank}" for r in named)
    advice = (
        f"Look at {which} itself (its GPU's clocks and temperature, other processes on it, its host's "
        "load): the same stage runs faster on its peers in the other replicas, so the split is not the cause."
    )
    return Finding("slow_rank", severity_of(cost), headline, advice, cost, figures)


def with_replica_findings(findings: list[Finding], extra: list[Finding]) -> list[Finding]:
    """``findings`` (ranked by :func:`diagnose`) with the replica findings put in by cost:
    each before the first finding that costs less or only informs; the info ones last."""
    out = list(findings)
    for finding in extra:
        if finding.severity == "info":
            out.append(finding)
            continue
        at = next((i for i, f in enumerate(out) if f.severity == "info" or f.cost_share < finding.cost_share), len(out))
        out.insert(at, finding)
    return out
