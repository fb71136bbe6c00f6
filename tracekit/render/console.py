"""The console summary of ``tracekit analyze``: plain text, readable in any terminal or CI log.

It renders the JSON document (:func:`tracekit.render.json.to_document`), so every figure
shown is one a script can read too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracekit.render.document import (
    cause_totals,
    device_totals,
    idle_by_cause,
    overlap_per_rank_ns,
    replay_totals,
)
from tracekit.schemas.analysis import (
    AnalysisDocument,
    FindingDoc,
    LayoutDoc,
    PathStepDoc,
    RankRow,
    ScheduleDoc,
    SpreadDoc,
    SpreadNsDoc,
    StageBlameDoc,
)
from tracekit.text import for_terminal, map_strings
from tracekit.vocab import (
    ACTION_KIND_NAMES,
    CAUSE_NAMES,
    IDLE_CAUSES,
    PLACEMENT_LEGENDS,
    ms,
    pct,
    rank_list,
)

# The findings about patterns across replicas (tracekit.analyze.diagnosis.REPLICA_CAUSES: the
# console renders a stored document and imports no analysis code).
_REPLICA_CAUSES = ("slow_replica", "slow_rank", "slowest_everywhere")

# Column headings of the causes in the per-rank table (narrow: the table has one per cause).
_LABELS = {c.key: c.label for c in IDLE_CAUSES}


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


# More ranks than this (or more than one replica): rows per stage over replicas and the worst ranks.
ROLLUP_RANKS = 16
# Ranks listed under the roll-up unless --ranks says otherwise.
WORST_RANKS = 8


class ConsoleRenderer:
    """The console summary (:func:`render`) as a :class:`~tracekit.render.protocol.Renderer`."""

    name = "console"
    reads = "document"

    def __init__(self, ranks: str | int = "auto") -> None:
        self.ranks = ranks

    def render(self, doc: AnalysisDocument) -> str:
        return render(doc, self.ranks)


def render(doc: AnalysisDocument, ranks: str | int = "auto") -> str:
    """The console summary of one analysis document.

    ``ranks``: "auto" (every rank of a small single pipeline; past ``ROLLUP_RANKS`` ranks or
    with data-parallel replicas, one row per stage over the replicas and the ``WORST_RANKS``
    worst ranks), "all" (every rank) or a number of worst ranks to list."""
    # Paths, host and event names in the document are someone else's text: every string is
    # made inert for the terminal here, once, so no field can be missed further down.
    doc = map_strings(doc, for_terminal)
    completeness = doc.get("completeness")
    # An incomplete run says so before any figure: they cover only the ranks present.
    out: list[str] = [completeness["message"]] if completeness and completeness["message"] else []
    s = doc["summary"]
    formats = sorted({f["format"] for f in doc["files"]})
    n_files = len({f["path"] for f in doc["files"]})
    out.append(f"tracekit {doc['tracekit_version']}: {doc['source']}")
    out.append(
        f"  {n_files} file(s) ({', '.join(formats)}), {s['n_ranks']} rank(s), "
        f"{s['n_steps']} step(s), {s['n_actions']} actions, {s['n_messages']} messages matched"
    )
    out.extend(_timeline(doc))
    sched = doc["schedule"]
    if not doc["pipeline"] or sched is None:
        out.append("")
        # what busy counts (analyze.bubbles.measure_plain): on the host's timeline, kernels
        # where the trace has them (--timeline host), else CPU ops and annotations
        work = "device work" if doc.get("timeline") == "device" else "recorded work (kernels if any, else CPU ops)"
        if completeness and len(completeness["ranks_present"]) == 1 and not completeness["missing_ranks"]:
            out.append(f"One rank: no pipeline to analyse. Busy/idle of its {work}:")
        else:
            out.append(
                "No pipeline-parallel schedule found in these traces (see the warning below for "
                f"what was seen). Per-rank busy/idle of the {work}:"
            )
        out.append("")
        out.append(_plain_rank_table(doc, _shown_ranks(doc, ranks)))
        findings = _findings(doc)
        out.extend([""] + findings[:-1] if findings else [])
        out.extend(_warnings(doc))
        return "\n".join(out)
    replicas = sched.get("replicas", 1)
    layout = _layout(doc)
    theory = doc["theory"]
    if not (completeness and completeness["missing_ranks"]):  # a trace cut short still shows the pipeline's shape
        out.append(
            f"  schedule: {sched['name']}  p={sched['p']} v={sched['v']} m={sched['m']}  "
            f"({_shape(sched)})" + (f"  x {replicas} data-parallel pipelines" if replicas > 1 and not layout else "")
        )
        if layout:
            out.append(f"  layout: {layout['line']}")
        out.append(f"  labels: {_labels_line(doc)}")
        out.append("")
        out.append(
            f"bubble ratio  {pct(s['bubble_ratio'])} measured   "
            f"{pct(theory['bubble_ratio'] if theory else None)} theory {theory['formula'] if theory else ''}   "
            f"{pct(theory['balanced_replay_bubble_ratio'] if theory else None)} balanced replay"
        )
        out.extend(_dimension_lines(doc))
        out.extend(_design_lines(doc))
    else:
        out.append(f"  schedule: not recognised (ranks missing; {sched['p']} ranks in the job, m={sched['m']} seen)")
        out.append("")
        out.append(
            f"bubble ratio  {pct(s['bubble_ratio'])} measured on the ranks present   "
            "(no theory, no replay: they need the whole pipeline)"
        )
    out.append("")
    out.extend(_stage_rollup(doc, ranks))
    # Without attribution (--no-attribution, an incomplete run) there are no causes to show.
    totals = cause_totals(doc)
    shown = tuple(totals)
    listed = _shown_ranks(doc, ranks)
    replica = _replica_column(doc) if listed is not None else {}
    headers = ["rank", *(["replica"] if replica else []), "busy ms", "idle ms", "bubble", *[_LABELS[c] for c in shown]]
    rows: list[list[str]] = []
    for r in doc["ranks"] if listed is None else listed:
        causes = r.get("causes", {})
        rows.append(
            [
                str(r["rank"]),
                *([str(replica.get(r["rank"], "?"))] if replica else []),
                ms(r["busy_ns"]),
                ms(r["idle_ns"]),
                pct(r["bubble_ratio"]),
                *[ms(causes.get(f"{c}_ns", 0)) for c in shown],
            ]
        )
    rows.append(
        [
            "all",
            *([""] if replica else []),
            ms(s["busy_ns"]),
            ms(s["idle_ns"]),
            pct(s["bubble_ratio"]),
            *[ms(totals[c]) for c in shown],
        ]
    )
    if listed is not None:
        out.append(
            f"the {len(listed)} worst of {len(doc['ranks'])} ranks (highest bubble first; --ranks all for every rank):"
        )
    out.append(table(headers, rows))
    if shown:
        out.append(f"  (idle ms per cause, summed over steps; causes add up to idle exactly; {_column_legend(shown)})")
    out.append("")
    out.extend(_findings(doc))
    if shown:
        out.extend(_causes(doc))
    out.extend(_replay(doc))
    out.extend(_warnings(doc))
    return "\n".join(out)


# A microbatch spread worth a line of its own (TeraPipe is always shown).
SLICE_LINE_GROWTH = 1.2


def _design_lines(doc: AnalysisDocument) -> list[str]:
    """What a flush-free pipeline's steps are, and how much dearer later slices are."""
    lines = []
    sched = doc["schedule"]
    if sched and sched.get("flush_free"):
        lines.append(
            "  no flush: a step is one rank's stretch between two of its weight updates (steps of "
            "different ranks overlap by design); only the pipeline's fill is schedule idle"
        )
    slices = doc.get("slices")
    if slices and ((sched and sched["name"].startswith("TeraPipe")) or slices["growth"] >= SLICE_LINE_GROWTH):
        share = slices["skew_idle_share"]
        tail = (
            f"; skew accounts for {pct(share)} of idle"
            if share is not None and share >= 0
            else (f"; skew shortens idle by {pct(-share)}" if share is not None else "")
        )
        lines.append(
            f"  slices: later slices cost up to {slices['growth']:.1f}x the first "
            f"(microbatch {slices['dearest']} the dearest){tail}"
        )
    return lines


def _timeline(doc: AnalysisDocument) -> list[str]:
    """Which clock the figures are on, and how far the host-side figure is from them."""
    device = doc.get("device")
    if doc.get("timeline") != "device" or not device:
        return []
    lines = [f"  device timeline from kernels; host runs ahead by up to {ms(device['host_ahead_max_ns'])} ms"]
    host = doc.get("host_view")
    if host and host["bubble_ratio"] is not None and doc["summary"]["bubble_ratio"] is not None:
        lines.append(f"  (host-side spans would say idle {pct(host['bubble_ratio'])}; --timeline host for that view)")
    totals = device_totals(doc)
    before = [r["rank"] for r in device.get("ranks", []) if r.get("before_profile_ns")]
    if before:
        lines.append(
            f"  {ms(totals['before_profile_ns'])} ms of device work launched before the profile began "
            f"({f'rank {before[0]}' if len(before) == 1 else rank_list(sorted(before))}) "
            "ran at the first step's start: left out of every step"
        )
    step_end = totals["step_end_per_step_ns"]
    if step_end >= 50_000:  # 0.05 ms a step: "0.0 ms" would say nothing
        lines.append(
            f"  {ms(step_end)} ms of device work per step after the pipeline's window "
            "(optimizer, gradient collectives; all ranks): its own share, not bubble"
        )
    collective = device.get("collective_pairs") or []
    if collective:
        lines.append(
            f"  {len(collective)} SendRecv kernel pairs of collectives (such as all_to_all; not P2P): "
            f"{ms(totals['collective_wait_ns'])} ms spinning for the peer, "
            f"{ms(totals['collective_transfer_ns'])} ms moving data"
        )
    pairs = device.get("p2p_pairs") or []
    if pairs:
        lines.append(
            f"  {len(pairs)} device P2P kernel pairs: {ms(totals['p2p_wait_ns'])} ms spinning for the peer, "
            f"{ms(totals['p2p_transfer_ns'])} ms moving data"
        )
    return lines


# Findings on the console, worst first; the rest are counted (all are in --json and the report).
SHOWN_FINDINGS = 3


def _actionable(doc: AnalysisDocument) -> list[FindingDoc]:
    """The findings that ask for something (info ones are for --json and the report)."""
    return [f for f in doc.get("findings", []) if f["severity"] != "info"]


def _findings(doc: AnalysisDocument) -> list[str]:
    findings = _actionable(doc)
    if not findings:
        return []
    out = ["what to try:"]
    for f in findings[:SHOWN_FINDINGS]:
        out.append(f"  [{f['severity']}] {f['headline']}")
        out.append(f"         {f['advice']}")
    if len(findings) > SHOWN_FINDINGS:
        out.append(f"  +{len(findings) - SHOWN_FINDINGS} more (--json, report)")
    out.append("")
    return out


def _labels_line(doc: AnalysisDocument) -> str:
    """ "torch-pp" or "none (actions segmented between point-to-point ops)"."""
    labels = doc["labels"]
    table = labels["table"]
    if labels["actions_from"] == "labels":
        return table
    return f"{table} (actions segmented between point-to-point ops)"


def _plain_rank_table(doc: AnalysisDocument, listed: list[RankRow] | None) -> str:
    device_doc = doc.get("device")
    device = {r["rank"]: r for r in (device_doc["ranks"] if device_doc else [])}
    collective = {rank: r.get("collective_idle_ns", 0) for rank, r in device.items()}
    in_collectives = any(collective.values())
    rows = [
        [str(r["rank"]), ms(r["window_ns"]), ms(r["busy_ns"]), ms(r["idle_ns"]), pct(r["bubble_ratio"])]
        + ([ms(collective.get(r["rank"], 0))] if in_collectives else [])
        for r in (doc["ranks"] if listed is None else listed)
    ]
    headers = ["rank", "window ms", "busy ms", "idle ms", "idle share"]
    text = table(headers + (["of it in collectives ms"] if in_collectives else []), rows)
    if in_collectives:
        text += (
            "\n  (busy: compute kernels, copies and sets; a collective kernel (all_reduce, all_to_all, ...) "
            "is not busy: its time spent waiting for peers or moving data is idle, shown beside it)"
        )
    rollup = doc.get("rollup")
    if listed is None or rollup is None:  # ranks are listed worst first from the roll-up only
        return text
    spread = rollup["bubble_ratio"]
    return (
        f"the {len(listed)} of {len(doc['ranks'])} ranks with the highest idle share (--ranks all for every rank); "
        f"idle share over ranks: min {pct(spread['min'])}, median {pct(spread['median'])}, max {pct(spread['max'])}\n"
        + text
    )


def _rolled_up(doc: AnalysisDocument) -> bool:
    """Whether the run is summarised instead of listed rank by rank (see :func:`render`)."""
    rollup = doc.get("rollup")
    return rollup is not None and (rollup["n_replicas"] > 1 or len(doc["ranks"]) > ROLLUP_RANKS)


def _shown_ranks(doc: AnalysisDocument, ranks: str | int) -> list[RankRow] | None:
    """The rank rows to list, worst first; None for every rank in rank order."""
    rollup = doc.get("rollup")
    if ranks == "all" or (ranks == "auto" and not _rolled_up(doc)) or not rollup:
        return None
    count = WORST_RANKS if ranks == "auto" else int(ranks)
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    return [by_rank[r] for r in rollup["ranks_by_bubble"][:count] if r in by_rank]


def _dimension_lines(doc: AnalysisDocument) -> list[str]:
    """TP and DP collective time of a 3-D parallel job, and the bubble with busy counted as
    compute only (where TP collectives made the two differ)."""
    dims = doc.get("dimensions")
    if not dims:
        return []
    each = dims["per_rank_step_ns"]
    out = []
    if dims["tp_ns"]:
        out.append(
            f"  TP collectives  {pct(dims['tp_share_of_busy'])} of busy, {ms(each['tp_ns'])} ms per step and rank "
            f"(inside the actions); bubble counting compute only {pct(dims['bubble_ratio_compute_only'])}"
        )
    links = dims.get("shared_links")
    if links and any(links["overlap_ns"].values()):
        out.append(
            f"  TP and PP kernels overlap  {ms(overlap_per_rank_ns(dims))} ms "
            f"a rank; transfers while a TP collective runs: median {ms(links['median_transfer_overlapped_ns'])} ms "
            f"({links['n_transfers_overlapped']}), otherwise {ms(links['median_transfer_alone_ns'])} ms "
            f"({links['n_transfers_alone']})"
        )
    if dims["recompute_ns"]:
        stages = ", ".join(f"stage {s['stage']} {pct(s['recompute_share_of_busy'])}" for s in dims["stages"][:8])
        out.append(
            f"  recomputation  {pct(dims['recompute_share_of_busy'])} of busy, {ms(each['recompute_ns'])} ms per step "
            f"and rank: forward ops run again in the backward ({stages})"
        )
    if dims["dp_ns"]:
        out.append(
            f"  DP gradient collectives  {ms(each['dp_ns'])} ms per step and rank: {ms(each['dp_after_own_ns'])} ms "
            f"after the rank's own last action (its wait before the optimizer), {ms(each['dp_exposed_ns'])} ms "
            "after the pipeline's window"
        )
    return out


def _layout(doc: AnalysisDocument) -> LayoutDoc | None:
    """The job's layout where it is more than one pipeline of single ranks (TP, DP, ...)."""
    layout = doc.get("layout")
    if not layout or all(size == 1 for role, size in layout["dims"].items() if role != "pp"):
        return None
    return layout


def _replica_column(doc: AnalysisDocument) -> dict[int, int]:
    """rank: its replica, where there are several."""
    rollup = doc.get("rollup")
    if not rollup or rollup["n_replicas"] < 2:
        return {}
    return {rank: i for i, group in enumerate(rollup["replicas"]) for rank in group}


def _stage_rollup(doc: AnalysisDocument, ranks: str | int) -> list[str]:
    """One row per stage over the replicas, and the patterns across them."""
    rollup = doc.get("rollup")
    if not rollup or rollup["n_replicas"] < 2 or ranks == "all" or not rollup["places"]:
        return []

    def spread(values: SpreadDoc | SpreadNsDoc, fmt: Callable[[Any], str]) -> list[str]:
        return [fmt(values["min"]), fmt(values["median"]), fmt(values["max"])]

    rows: list[list[str]] = []
    for place in rollup["places"]:
        bubble = place["bubble_ratio"]
        rows.append(
            [
                ",".join(map(str, place["stages"])) + (f" tp{place['tp_rank']}" if "tp_rank" in place else ""),
                *spread(bubble, pct),
                "-" if bubble["min"] == bubble["max"] else str(place["worst_replica"]),
                *spread(place["idle_per_step_ns"], ms),
                *spread(place["busy_per_step_ns"], ms),
                "-"
                if place["busy_per_step_ns"]["min"] == place["busy_per_step_ns"]["max"]
                else str(place["slowest_replica"]),
                _LABELS.get(place["top_cause"], "") if place["top_cause"] else "",
            ]
        )
    headers = ["stage", "bubble min", "median", "max", "worst"]
    headers += ["idle/step min", "median", "max", "compute/step min", "median", "max", "slowest", "top cause"]
    n = rollup["n_replicas"]
    out = [
        f"per stage over {n} data-parallel replicas (min / median / max over replicas; ms per step; worst: the "
        "replica with the highest bubble, slowest: with the most compute; - where all are equal):",
        table(headers, rows),
    ]
    shown = {f["headline"] for f in _actionable(doc)[:SHOWN_FINDINGS]}
    patterns = [f for f in doc.get("findings", []) if f["cause"] in _REPLICA_CAUSES]
    if not patterns:
        within = pct(rollup["slow_factor"] - 1)
        out.append(
            f"  across replicas: no pattern (every stage's compute within {within} of the other replicas' median)"
        )
    for f in patterns:
        if f["headline"] not in shown or f["severity"] == "info":
            out.append(f"  across replicas: {f['headline']}")
    out.append("")
    return out


def _causes(doc: AnalysisDocument) -> list[str]:
    out = ["where the idle time goes:"]
    for cause, value, percent_of_idle in idle_by_cause(doc):
        line = f"  {CAUSE_NAMES[cause]:<17} {ms(value):>9} ms  {percent_of_idle:5.1f}% of idle"
        if cause == "imbalance" and doc["blame"]["stages"]:
            top = doc["blame"]["stages"][:3]
            line += "  <- " + ", ".join(f"stage {b['stage']} ({_ranks(b)}) {ms(b['imbalance_ns'])} ms" for b in top)
        if cause == "comm" and doc["blame"]["links"]:
            links = doc["blame"]["links"][:3]
            line += "  <- " + ", ".join(f"link {b['src_rank']}->{b['dst_rank']} {ms(b['comm_ns'])} ms" for b in links)
        out.append(line)
    out.append("")
    return out


def _replay(doc: AnalysisDocument) -> list[str]:
    replay = replay_totals(doc)
    if replay is None:
        return []
    out = [
        f"replay fidelity: {replay['n_steps']} step(s) replayed, largest residual {ms(replay['worst_residual_ns'])} ms "
        "(measured minus replayed step time; the causes rest on the replay)"
    ]
    path = replay["critical_path"]
    if path:
        shown = path[:12]
        chain = " > ".join(_action(p) for p in shown)
        more = f" > ... ({len(path)} actions)" if len(path) > 12 else ""
        out.append(
            f"critical path of step {replay['step']}: compute {ms(replay['path_compute_ns'])} ms, "
            f"comm {ms(replay['path_comm_ns'])} ms"
        )
        out.append(f"  {chain}{more}")
        out.append(f"  ({_path_legend(shown)})")
    out.append("")
    return out


def _action(entry: PathStepDoc) -> str:
    """An action on the critical path, short: ``r0:F0.3``."""
    return f"r{entry['rank']}:{entry['kind']}{entry['stage']}.{entry['microbatch']}"


def _kind_name(kind: str) -> str:
    return ACTION_KIND_NAMES.get(kind, kind)


def _path_legend(path: list[PathStepDoc]) -> str:
    """What the short names of a critical path say, by its first action, and the other kinds in it."""
    first = path[0]
    legend = (
        f"{_action(first)} = rank {first['rank']}'s {_kind_name(first['kind'])} of stage {first['stage']}, "
        f"microbatch {first['microbatch']}"
    )
    others = sorted({p["kind"] for p in path} - {first["kind"]}, key=lambda k: (k not in ACTION_KIND_NAMES, k))
    return "; ".join([legend, *(f"{kind} = {_kind_name(kind)}" for kind in others)])


def _column_legend(shown: tuple[str, ...]) -> str:
    """The rank table's cut-short cause headings, spelt out: "imbal: stage imbalance, ovhd: overhead/other"."""
    return ", ".join(
        f"{_LABELS[c]}: {CAUSE_NAMES[c]}" for c in shown if _LABELS[c] not in CAUSE_NAMES[c].replace("-", "").split()
    )


def _shape(sched: ScheduleDoc) -> str:
    """ "loop placement: stage s on rank s mod p; split backward" (a custom placement as it is)."""
    legend = PLACEMENT_LEGENDS.get(sched["placement"])
    placement = f"{sched['placement']} placement" + (f": {legend}" if legend else "")
    split = "split backward" if sched["split_backward"] else ""
    return f"{placement}{'; ' if legend else ', '}{split}" if split else placement


def _warnings(doc: AnalysisDocument) -> list[str]:
    if not doc["warnings"]:
        return []
    shown = doc["warnings"][:10]
    out = [f"warnings ({len(doc['warnings'])}):"]
    out.extend(f"  - {w}" for w in shown)
    if len(doc["warnings"]) > 10:
        out.append(f"  ... and {len(doc['warnings']) - 10} more (see --json)")
    return out


def _ranks(blame: StageBlameDoc) -> str:
    """ "rank 2", or "ranks 2,6" where data-parallel replicas run the stage too."""
    ranks = blame.get("ranks") or [blame["rank"]]
    return f"rank {ranks[0]}" if len(ranks) == 1 else rank_list(ranks)
