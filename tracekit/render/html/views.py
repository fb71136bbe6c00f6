"""What each step's timeline in the HTML report draws: lanes, bars, idle spans by cause,
messages and the critical path, in ms since the step's window, thinned to a glyph budget
(and the notes that say where it was thinned). Data only: :mod:`.charts` draws it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from tracekit.analyze import Analysis
from tracekit.analyze.intervals import idle_intervals
from tracekit.analyze.report_figures import Culprit, StepFigures, culprits, message_timings, step_figures
from tracekit.model.names import FRAME_CATEGORY
from tracekit.text import for_xml
from tracekit.vocab import ACTION_KIND_NAMES, IDLE_CAUSES

# Glyph budgets per step timeline; past them the timeline merges and drops (and says so).
MAX_BARS = 3000
# A thinned step also keeps up to this many bars at full resolution, drawn in place of the
# merged ones once the zoomed view holds at most MAX_BARS of them. Each adds about 26 bytes
# to the page (bokeh gzips the columns: the 9,364 ops of a real two-GPU nsys run, 0.24 MB);
# a step past it keeps the merged bars only, and says so.
MAX_DETAIL_BARS = 50_000
MAX_IDLE = 3000
MAX_MESSAGES = 1000
MAX_DETAILED_STEPS = 4
# Width of the timeline's plotting area in pixels: what "narrower than a pixel" means.
TIMELINE_WIDTH_PX = 1150
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class StepView:
    """What one step's timeline draws: x in ms since the step's window start, y = lane."""

    step: int
    window_ns: int
    bubble_ratio: float  # idle over window, all ranks (of every replica, drawn or not)
    lanes: list[str]
    bars: pd.DataFrame  # x0 x1 y0 y1 kind rank stage microbatch dur_ms n name
    idle: pd.DataFrame  # x0 x1 y0 y1 cause rank dur_ms blame
    messages: pd.DataFrame  # x0 y0 x1 y1 link post_ms wire_ms wait_ms direction
    critical_links: pd.DataFrame | None = None  # x0 y0 x1 y1: one action's end to the next's start
    critical_bars: pd.DataFrame | None = None  # outlines of the critical path's actions
    thinned: dict[str, tuple[int, int]] = field(default_factory=dict)  # what -> (in the run, drawn)
    merge_gap_ns: float = 0.0  # bars closer than this on a row were merged
    # A thinned step's bars before merging (columns as ``bars``), or None where nothing was
    # merged or there were more than MAX_DETAIL_BARS of them.
    detail: pd.DataFrame | None = None
    # Data-parallel replicas drawn one at a time: (title, first lane, last lane), the first shown.
    groups: list[tuple[str, int, int]] = field(default_factory=list)


def _lanes(analysis: Analysis, ranks: list[int]) -> tuple[list[str], dict[int, int], dict[tuple[int, int], int]]:
    """Lane names, rank -> lane, (rank, stream) -> lane: a rank's GPU streams under it."""
    events = analysis.run.events
    gpu = events[events["on_gpu"] & events["cat"].isin(_GPU_CATS)]
    streams = gpu.groupby("rank")["tid"].unique().to_dict() if len(gpu) else {}
    names: list[str] = []
    rank_lane: dict[int, int] = {}
    stream_lane: dict[tuple[int, int], int] = {}
    for r in ranks:
        rank_lane[r] = len(names)
        names.append(f"rank {r}")
        for tid in sorted(int(t) for t in streams.get(r, [])):
            stream_lane[(r, tid)] = len(names)
            names.append(f"rank {r} stream {tid}")
    return names, rank_lane, stream_lane


def chosen_steps(steps: list[int], step_ns: dict[int, int]) -> tuple[list[int], list[str]]:
    """The steps drawn in detail (all, or first, slowest, median and last) and a note."""
    if len(steps) <= MAX_DETAILED_STEPS:
        return steps, []
    by_length = sorted(steps, key=lambda s: step_ns.get(s, 0))
    picks = {"first": steps[0], "slowest": by_length[-1], "median": by_length[len(by_length) // 2], "last": steps[-1]}
    chosen = sorted(set(picks.values()))
    # one step can hold several roles (the first is often the slowest): name it once
    named = ", ".join(f"step {s} ({', '.join(k for k, v in picks.items() if v == s)})" for s in chosen)
    return chosen, [
        f"Timeline: {len(chosen)} of {len(steps)} steps drawn in detail: {named}; the tables and bars cover every step."
    ]


def step_views(
    analysis: Analysis, groups: list[tuple[str, list[int]]] | None = None
) -> tuple[list[StepView], list[str]]:
    """One :class:`StepView` per step drawn, and notes on what was left out.

    ``groups``: draw only these ranks, as (title, ranks) of data-parallel replicas shown one
    at a time (the first at the start), in this order; default every rank. The step windows
    stay the run's."""
    bubbles = analysis.bubbles
    if len(bubbles) == 0:
        return [], []
    windows = step_figures(analysis)
    step_ns = {step: w.end_ns - w.start_ns for step, w in windows.items()}
    steps, notes = chosen_steps(sorted(step_ns), step_ns)
    present = sorted(int(r) for r in bubbles["rank"].unique())
    if groups is None:
        ranks = present
    else:
        known = set(present)
        groups = [(title, [r for r in members if r in known]) for title, members in groups]
        groups = [(title, members) for title, members in groups if members]
        ranks = [r for _, members in groups for r in members]
    lanes, rank_lane, stream_lane = _lanes(analysis, ranks)
    spans = []
    for title, members in groups or []:
        own = [rank_lane[r] for r in members] + [lane for (r, _), lane in stream_lane.items() if r in members]
        spans.append((title, min(own), max(own)))
    intervals = idle_intervals(analysis) if analysis.is_pipeline else pd.DataFrame()
    if len(intervals) and len(ranks) < len(present):
        intervals = intervals[intervals["rank"].isin(rank_lane)]
    blame = idle_blame(analysis)
    views = []
    for step in steps:
        view = _step_view(analysis, step, windows[step], lanes, rank_lane, stream_lane, intervals, blame)
        view.groups = spans
        views.append(view)
    return views, notes


# What an idle span of a cause without a stage or link to blame is put down to.
_BLAMED_ON = {c.key: c.blamed_on for c in IDLE_CAUSES if c.blamed_on}
# Culprits named per idle span, largest first; the rest are counted.
MAX_BLAMED = 3


def idle_blame(analysis: Analysis) -> dict[tuple[int, int, str], str]:
    """(rank, step, cause) -> who the rank's idle of that cause in that step is blamed on:
    the stages behind its imbalance and the links behind its comm latency, each with its
    share (the attribution's stage_blame and link_blame), largest first."""
    return {key: _culprits([_culprit(c) for c in found]) for key, found in culprits(analysis).items()}


def _culprit(c: Culprit) -> str:
    if c.link is not None:
        return f"link {c.link[0]} -> {c.link[1]} {_ms3(c.blamed_ns)} ms"
    return f"stage {c.stage} (rank {'?' if c.stage_rank is None else c.stage_rank}) {_ms3(c.blamed_ns)} ms"


def _culprits(named: list[str]) -> str:
    rest = len(named) - MAX_BLAMED
    return ", ".join(named[:MAX_BLAMED]) + (f" and {rest} more" if rest > 0 else "")


def _step_view(
    analysis: Analysis,
    step: int,
    window: StepFigures,
    lanes: list[str],
    rank_lane: dict[int, int],
    stream_lane: dict[tuple[int, int], int],
    intervals: pd.DataFrame,
    blame: dict[tuple[int, int, str], str],
) -> StepView:
    run = analysis.run
    lo, hi = window.start_ns, window.end_ns
    thinned: dict[str, tuple[int, int]] = {}
    pixel_ns = max((hi - lo) / TIMELINE_WIDTH_PX, 1.0)
    frames = (
        [_action_work(run.actions, step, rank_lane)] if analysis.is_pipeline else _plain_work(analysis, step, rank_lane)
    )
    frames = [f for f in (*frames, _gpu_work(run.events, lo, hi, stream_lane)) if len(f)]
    work = pd.concat(frames, ignore_index=True) if frames else _empty_work()
    bars, merge_gap = decimate(work, MAX_BARS, pixel_ns)
    detail = None
    if merge_gap:
        thinned["bars"] = (len(work), len(bars))
        if len(work) <= MAX_DETAIL_BARS:  # with room for every bar, decimate only sorts them
            detail = _to_view_bars(decimate(work, len(work), pixel_ns)[0], lo)
    bars = _to_view_bars(bars, lo)
    if detail is not None:
        bars.loc[bars["n"] > 1, "name"] += ": zoom in to see each"
    idle = _idle_view(intervals, step, lo, rank_lane, merge_gap, thinned, blame)
    messages = _message_view(analysis, step, lo, rank_lane, thinned)
    critical_links, critical_bars = _critical_view(analysis, step, lo, rank_lane)
    return StepView(
        step=step,
        window_ns=hi - lo,
        bubble_ratio=window.bubble_ratio,
        lanes=lanes,
        bars=bars,
        idle=idle,
        messages=messages,
        critical_links=critical_links,
        critical_bars=critical_bars,
        thinned=thinned,
        merge_gap_ns=merge_gap,
        detail=detail,
    )


def thinning_notes(views: list[StepView]) -> list[str]:
    """One sentence per kind of thinning, summed over the steps drawn."""

    def total(what: str) -> tuple[int, int]:
        pairs = [v.thinned[what] for v in views if what in v.thinned]
        return sum(a for a, _ in pairs), sum(b for _, b in pairs)

    sentences = []
    if any("bars" in v.thinned for v in views):
        n_in, n_out = total("bars")
        gap_ms = max(v.merge_gap_ns for v in views) / 1e6
        sentences.append(
            f"{n_in:,} actions and ops drawn as {n_out:,} bars: neighbours on a row less than "
            f"{gap_ms:.3g} ms apart are merged into one bar."
        )
        sentences.append(_detail_sentence([v for v in views if "bars" in v.thinned]))
    if any("idle" in v.thinned for v in views):
        n_in, n_out = total("idle")
        sentences.append(
            f"The longest {n_out:,} of {n_in:,} idle spans are shaded; the per-rank bars and "
            "tables count every nanosecond."
        )
    if any("messages" in v.thinned for v in views):
        n_in, n_out = total("messages")
        sentences.append(f"The {n_out:,} slowest of {n_in:,} messages are drawn.")
    if not sentences:
        return []
    return [
        "This run is large, so the timeline was thinned to stay responsive (over the steps drawn): "
        + " ".join(sentences)
    ]


def _detail_sentence(thinned: list[StepView]) -> str:
    """What zooming in shows of the thinned steps: every action and op where they were kept."""
    kept = sum(v.detail is not None for v in thinned)
    if not kept:
        return f"Over {MAX_DETAIL_BARS:,} a step, only the merged bars are kept: zooming in shows no more."
    reveal = (
        f"Zoom in (Ctrl + scroll) to see every one: once the view holds at most {MAX_BARS:,} of them, "
        "each action and op is drawn instead of the merged bars"
    )
    if kept == len(thinned):
        return reveal + "."
    return reveal + f" (in the steps with at most {MAX_DETAIL_BARS:,}; the others keep the merged bars)."


def _empty_work() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in ("lane", "start", "end", "kind", "rank", "stage", "microbatch", "label")})


def _action_work(actions: pd.DataFrame, step: int, rank_lane: dict[int, int]) -> pd.DataFrame:
    acts = actions[(actions["step"] == step) & actions["rank"].isin(rank_lane)]
    return pd.DataFrame(
        {
            "lane": acts["rank"].map(rank_lane).to_numpy(),
            "start": acts["start_ns"].to_numpy(),
            "end": acts["end_ns"].to_numpy(),
            "kind": acts["kind"].astype(str).to_numpy(),
            "rank": acts["rank"].to_numpy(),
            "stage": acts["stage"].to_numpy(),
            "microbatch": acts["microbatch"].to_numpy(),
            "label": acts["label"].astype(str).to_numpy(),
        }
    )


def _gpu_work(events: pd.DataFrame, lo: int, hi: int, stream_lane: dict[tuple[int, int], int]) -> pd.DataFrame:
    if not stream_lane:
        return _empty_work()
    gpu = events[events["on_gpu"] & events["cat"].isin(_GPU_CATS) & (events["end_ns"] > lo) & (events["start_ns"] < hi)]
    lane = [stream_lane.get((int(r), int(t)), -1) for r, t in zip(gpu["rank"], gpu["tid"])]
    return pd.DataFrame(
        {
            "lane": lane,
            "start": gpu["start_ns"].clip(lower=lo).to_numpy(),
            "end": gpu["end_ns"].clip(upper=hi).to_numpy(),
            "kind": "kernel",
            "rank": gpu["rank"].to_numpy(),
            "stage": -1,
            "microbatch": -1,
            "label": gpu["name"].astype(str).to_numpy(),
        }
    ).query("lane >= 0")


def _plain_work(analysis: Analysis, step: int, rank_lane: dict[int, int]) -> list[pd.DataFrame]:
    """Runs without a pipeline: each rank's top-level CPU work in its step window (GPU work
    has its own stream lanes): ops at the top of their thread, or right below a
    ``ProfilerStep#N`` on the thread that holds the step marks."""
    events = analysis.run.events
    rows = analysis.bubbles[(analysis.bubbles["step"] == step) & analysis.bubbles["rank"].isin(rank_lane)]
    is_mark = events["name"].str.startswith("ProfilerStep")
    threads = pd.MultiIndex.from_arrays([events["pid"], events["tid"]])
    under_mark = threads.isin(threads[is_mark.to_numpy()])
    out = []
    row: Any  # a bubble row (pandas types its fields as any scalar)
    for row in rows.itertuples(index=False):
        ev = events[
            (events["rank"] == row.rank)
            & ~events["on_gpu"]
            & ((events["depth"] == 0) | ((events["depth"] == 1) & under_mark))
            & (events["end_ns"] > row.window_start_ns)
            & (events["start_ns"] < row.window_end_ns)
            & ~is_mark
            & (events["cat"] != FRAME_CATEGORY)  # a Python frame holds ops; it is none
        ]
        out.append(
            pd.DataFrame(
                {
                    "lane": rank_lane[int(row.rank)],
                    "start": ev["start_ns"].clip(lower=row.window_start_ns).to_numpy(),
                    "end": ev["end_ns"].clip(upper=row.window_end_ns).to_numpy(),
                    "kind": "cpu",
                    "rank": int(row.rank),
                    "stage": -1,
                    "microbatch": -1,
                    "label": ev["name"].astype(str).to_numpy(),
                }
            )
        )
    return out


def decimate(work: pd.DataFrame, cap: int, pixel_ns: float) -> tuple[pd.DataFrame, float]:
    """Merge neighbouring bars on a lane until at most ``cap`` remain, widening the gap that
    counts as "neighbouring" from one pixel by doubling. Returns the bars (with ``n``, how
    many were merged into each) and the gap used (0 when nothing was merged)."""
    work = work.sort_values(["lane", "start"], kind="stable").reset_index(drop=True)
    work["n"] = 1
    if len(work) <= cap:
        return work, 0.0
    span = float(work["end"].max() - work["start"].min()) or 1.0
    gap = pixel_ns
    while True:
        prev_end = work.groupby("lane")["end"].cummax().groupby(work["lane"]).shift()
        new = prev_end.isna() | (work["start"] - prev_end > gap)
        group = new.cumsum()
        if group.iloc[-1] <= cap or gap > span:
            break
        gap *= 2
    grouped = work.groupby(group, sort=True)
    kinds = grouped["kind"].first().where(grouped["kind"].nunique() == 1, "merged")
    out = pd.DataFrame(
        {
            "lane": grouped["lane"].first(),
            "start": grouped["start"].min(),
            "end": grouped["end"].max(),
            "kind": kinds,
            "rank": grouped["rank"].first(),
            "stage": grouped["stage"].first(),
            "microbatch": grouped["microbatch"].first(),
            "label": grouped["label"].first(),
            "n": grouped.size(),
        }
    ).reset_index(drop=True)
    many = out["n"] > 1
    out.loc[many, "label"] = out.loc[many, "n"].map(lambda n: f"{n} merged")
    out.loc[many, ["stage", "microbatch"]] = -1
    return out, gap


def _to_view_bars(bars: pd.DataFrame, lo: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "x0": (bars["start"].to_numpy(dtype=np.int64) - lo) / 1e6,
            "y0": bars["lane"].to_numpy(dtype=float) - 0.38,
            "x1": (bars["end"].to_numpy(dtype=np.int64) - lo) / 1e6,
            "y1": bars["lane"].to_numpy(dtype=float) + 0.38,
            "kind": bars["kind"].astype(str).to_numpy(),
            "rank": bars["rank"].to_numpy(dtype=np.int64),
            "stage": bars["stage"].to_numpy(dtype=np.int64),
            "microbatch": bars["microbatch"].to_numpy(dtype=np.int64),
            "dur_ms": (bars["end"].to_numpy(dtype=np.int64) - bars["start"].to_numpy(dtype=np.int64)) / 1e6,
            "n": bars["n"].to_numpy(dtype=np.int64),
            "name": _bar_names(bars),
        }
    )


def _bar_names(bars: pd.DataFrame) -> np.ndarray:
    """Each bar's full name for its hover: "F2.3: forward, stage 2, microbatch 3" and the
    trace's label where it has one, an op's own name, or "12 merged"."""
    labels = pd.Series(_visible_labels(bars["label"]), index=bars.index)
    action = bars["kind"].isin(list(ACTION_KIND_NAMES)) & (bars["n"] == 1)
    names = labels.copy()
    names[action] = [
        f"{k}{s}.{m}: {ACTION_KIND_NAMES[k]}, stage {s}, microbatch {m}" + (f" ({label})" if label else "")
        for k, s, m, label in zip(
            bars.loc[action, "kind"], bars.loc[action, "stage"], bars.loc[action, "microbatch"], labels[action]
        )
    ]
    return names.to_numpy(dtype=object)


def _visible_labels(labels: pd.Series) -> np.ndarray:
    """Event names for the hover text; escaped once per distinct name (they repeat)."""
    labels = labels.astype(str)
    return labels.map({name: for_xml(name) for name in labels.unique()}).to_numpy()


def _idle_view(
    intervals: pd.DataFrame,
    step: int,
    lo: int,
    rank_lane: dict[int, int],
    merge_gap: float,
    thinned: dict[str, tuple[int, int]],
    blame: dict[tuple[int, int, str], str],
) -> pd.DataFrame:
    columns = ["x0", "y0", "x1", "y1", "cause", "rank", "dur_ms", "blame"]
    if len(intervals) == 0:
        return pd.DataFrame(columns=columns)
    spans = intervals[intervals["step"] == step]
    total = len(spans)
    spans = spans[spans["end_ns"] - spans["start_ns"] > merge_gap]
    if len(spans) > MAX_IDLE:
        spans = spans.assign(length=spans["end_ns"] - spans["start_ns"]).nlargest(MAX_IDLE, "length")
    if len(spans) < total:
        thinned["idle"] = (total, len(spans))
    lane = spans["rank"].map(rank_lane).to_numpy(dtype=float)
    return pd.DataFrame(
        {
            "x0": (spans["start_ns"].to_numpy() - lo) / 1e6,
            "y0": lane - 0.45,
            "x1": (spans["end_ns"].to_numpy() - lo) / 1e6,
            "y1": lane + 0.45,
            "cause": spans["cause"].to_numpy(),
            "rank": spans["rank"].to_numpy(),
            "dur_ms": (spans["end_ns"] - spans["start_ns"]).to_numpy() / 1e6,
            "blame": [
                blame.get((int(r), step, c), _BLAMED_ON.get(c, "")) for r, c in zip(spans["rank"], spans["cause"])
            ],
        }
    )


def _message_view(
    analysis: Analysis, step: int, lo: int, rank_lane: dict[int, int], thinned: dict[str, tuple[int, int]]
) -> pd.DataFrame:
    columns = ["x0", "y0", "x1", "y1", "link", "post_ms", "wire_ms", "wait_ms", "direction"]
    if not analysis.is_pipeline or len(analysis.run.messages) == 0:
        return pd.DataFrame(columns=columns)
    msgs = message_timings(analysis, step, rank_lane)
    if len(msgs) > MAX_MESSAGES:  # the longest latencies kept
        thinned["messages"] = (len(msgs), MAX_MESSAGES)
        msgs = msgs.loc[msgs["latency_ns"].nlargest(MAX_MESSAGES).index]
    return pd.DataFrame(
        {
            "x0": (msgs["send_post_ns"].to_numpy() - lo) / 1e6,
            "y0": msgs["src_rank"].map(rank_lane).to_numpy(dtype=float),
            "x1": (msgs["arrival_ns"].to_numpy() - lo) / 1e6,
            "y1": msgs["dst_rank"].map(rank_lane).to_numpy(dtype=float),
            "link": [f"{s}->{d}" for s, d in zip(msgs["src_rank"], msgs["dst_rank"])],
            "post_ms": msgs["post_ns"].to_numpy() / 1e6,
            "wire_ms": msgs["wire_ns"].to_numpy() / 1e6,
            "wait_ms": msgs["recv_wait_ns"].to_numpy() / 1e6,
            "direction": msgs["direction"].astype(str).to_numpy(),
        }
    )


def _critical_view(
    analysis: Analysis, step: int, lo: int, rank_lane: dict[int, int]
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    attribution = analysis.attribution
    if attribution is None:
        return None, None
    by_step = {s.step: s for s in attribution.steps}
    if step not in by_step or not by_step[step].critical_path:
        return None, None
    actions = analysis.run.actions.set_index("action_id")
    path = [
        p
        for p in reversed(by_step[step].critical_path)
        if p["action_id"] in actions.index and int(cast(int, actions.at[p["action_id"], "rank"])) in rank_lane
    ]
    if not path:  # the step's critical path runs through another replica
        return None, None
    rows = []
    for p in path:
        a: Any = actions.loc[p["action_id"]]  # the action's row (ids are unique)
        y = float(rank_lane[int(a["rank"])])
        rows.append(
            (
                (int(a["start_ns"]) - lo) / 1e6,
                y - 0.42,
                (int(a["end_ns"]) - lo) / 1e6,
                y + 0.42,
                f"{p['kind']}{p['stage']}.{p['microbatch']}",
                int(a["rank"]),
                p["compute_ns"] / 1e6,
                p.get("comm_ns", 0) / 1e6,
                p.get("via", ""),
                p.get("link", ""),
            )
        )
    bars = pd.DataFrame(
        rows, columns=["x0", "y0", "x1", "y1", "action", "rank", "compute_ms", "comm_ms", "via", "link"]
    )
    lane = (bars["y0"] + bars["y1"]) / 2
    links = pd.DataFrame(
        {
            "x0": bars["x1"].to_numpy()[:-1],
            "y0": lane.to_numpy()[:-1],
            "x1": bars["x0"].to_numpy()[1:],
            "y1": lane.to_numpy()[1:],
        }
    )
    return links, bars


def _ms3(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"
