"""The HTML report: one self-contained file (bokeh's JavaScript inlined, nothing fetched)
that shows where a run sat idle and why, for a browser with no network.

Sections: the diagnosis (:func:`tracekit.analyze.diagnosis.diagnose`), an interactive
timeline per step (one row per rank, and per GPU stream where the trace has kernels; compute
actions coloured by kind, P2P messages from send to arrival, idle time shaded by cause, the
critical path drawn through it), per-rank busy and idle by cause, measured against
theoretical bubble, blame tables per stage and per link, and the run's metadata.

Figures are made with bokeh and embedded statically with its inline resources (one tab per
step), so the file works offline without a server and fetches nothing. Large runs are thinned before drawing:
at most ``MAX_BARS`` bars, ``MAX_IDLE`` idle spans and ``MAX_MESSAGES`` messages per step,
and ``MAX_DETAILED_STEPS`` steps; the report says where it did so.

Every string that comes from a trace (labels, file names, hosts, warnings, capture.json)
reaches the page escaped: the page template autoescapes, bokeh escapes its JSON data, and
hover tooltips insert values as text. Controls and bidi overrides in those strings (which
a browser would show as nothing, or use to draw the text after them reversed) are shown as
visible escapes (:func:`tracekit.text.for_xml`), on the page and in the timeline's labels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jinja2
import numpy as np
import pandas as pd

from tracekit.analyze import Analysis
from tracekit.analyze.attribution import CATEGORIES
from tracekit.analyze.diagnosis import message_latencies, stage_compute_ns
from tracekit.analyze.intervals import idle_intervals
from tracekit.text import for_xml
from tracekit.version import __version__

# Glyph budgets per step timeline; past them the timeline merges and drops (and says so).
MAX_BARS = 3000
MAX_IDLE = 3000
MAX_MESSAGES = 1000
MAX_DETAILED_STEPS = 4
# Width of the timeline's plotting area in pixels: what "narrower than a pixel" means.
TIMELINE_WIDTH_PX = 1150
# Tables longer than this are folded (<details>) so the page stays readable.
FOLD_ROWS = 32

KIND_COLORS = {"F": "#4C78A8", "B": "#F58518", "I": "#E45756", "W": "#54A24B", "merged": "#8C8C8C",
               "cpu": "#8C8C8C", "kernel": "#17BECF"}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad",
              "merged": "merged actions", "cpu": "CPU ops (top level)", "kernel": "GPU work"}
# Bars at least this wide (pixels, unzoomed) carry their action as text, up to this many.
LABEL_MIN_PX = 30
MAX_TEXT_LABELS = 600
CAUSE_COLORS = {"busy": "#4C78A8", "warmup": "#C7C7C7", "drain": "#A5A5A5", "schedule_gaps": "#EECA3B",
                "imbalance": "#FF6B8A", "comm": "#B279A2", "overhead": "#9C755F", "idle": "#D9D9D9"}
CAUSE_NAMES = {"busy": "busy", "warmup": "warm-up", "drain": "drain", "schedule_gaps": "schedule gaps",
               "imbalance": "imbalance", "comm": "comm latency", "overhead": "overhead/other",
               "idle": "idle"}
CRITICAL_COLOR = "#D62728"
MESSAGE_COLOR = "#333333"
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class StepView:
    """What one step's timeline draws: x in ms since the step's window start, y = lane."""

    step: int
    window_ns: int
    bubble_ratio: float          # idle over window, all ranks
    lanes: list[str]
    bars: pd.DataFrame           # x0 x1 y0 y1 kind rank stage microbatch dur_ms n label
    idle: pd.DataFrame           # x0 x1 y0 y1 cause rank dur_ms blame
    messages: pd.DataFrame       # x0 y0 x1 y1 link post_ms wire_ms wait_ms direction
    critical_links: pd.DataFrame | None = None   # x0 y0 x1 y1: one action's end to the next's start
    critical_bars: pd.DataFrame | None = None    # outlines of the critical path's actions
    thinned: dict[str, tuple[int, int]] = field(default_factory=dict)   # what -> (in the run, drawn)
    merge_gap_ns: float = 0.0                    # bars closer than this on a row were merged


def render_report(analysis: Analysis) -> str:
    """The report as one HTML document."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    views, step_notes = step_views(analysis)
    timeline = _timeline_root(views)
    bubble = _bubble_root(analysis) if analysis.is_pipeline else None
    roots = [r for r in (timeline, _causes_root(analysis), bubble) if r is not None]
    context = _page_context(analysis, step_notes + thinning_notes(views))
    context["has_timeline"] = timeline is not None
    context["has_bubble"] = bubble is not None
    return file_html(roots, resources=INLINE, title=f"tracekit report: {analysis.run.source}",
                     template=_page_template(), template_variables=context)


# ---------------------------------------------------------------------------- timeline data

def _lanes(analysis: Analysis, ranks: list[int]) -> tuple[list[str], dict, dict]:
    """Lane names, rank -> lane, (rank, stream) -> lane: a rank's GPU streams under it."""
    events = analysis.run.events
    gpu = events[events["on_gpu"] & events["cat"].isin(_GPU_CATS)]
    streams = gpu.groupby("rank")["tid"].unique().to_dict() if len(gpu) else {}
    names, rank_lane, stream_lane = [], {}, {}
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
    picks = {"first": steps[0], "slowest": by_length[-1], "median": by_length[len(by_length) // 2],
             "last": steps[-1]}
    chosen = sorted(set(picks.values()))
    # one step can hold several roles (the first is often the slowest): name it once
    named = ", ".join(f"step {s} ({', '.join(k for k, v in picks.items() if v == s)})" for s in chosen)
    return chosen, [f"Timeline: {len(chosen)} of {len(steps)} steps drawn in detail: {named}; "
                    "the tables and bars cover every step."]


def step_views(analysis: Analysis) -> tuple[list[StepView], list[str]]:
    """One :class:`StepView` per step drawn, and notes on what was left out."""
    bubbles = analysis.bubbles
    if len(bubbles) == 0:
        return [], []
    windows = bubbles.groupby("step").agg(lo=("window_start_ns", "min"), hi=("window_end_ns", "max"))
    step_ns = {int(s): int(w.hi - w.lo) for s, w in windows.iterrows()}
    steps, notes = chosen_steps(sorted(step_ns), step_ns)
    ranks = sorted(int(r) for r in bubbles["rank"].unique())
    lanes, rank_lane, stream_lane = _lanes(analysis, ranks)
    intervals = idle_intervals(analysis) if analysis.is_pipeline else pd.DataFrame()
    blame = idle_blame(analysis)
    views = []
    for step in steps:
        lo, hi = int(windows.at[step, "lo"]), int(windows.at[step, "hi"])
        views.append(_step_view(analysis, step, lo, hi, lanes, rank_lane, stream_lane, intervals, blame))
    return views, notes


# What an idle span of a cause without a stage or link to blame is put down to.
_BLAMED_ON = {"warmup": "the schedule: pipeline fill", "drain": "the schedule: pipeline drain",
              "schedule_gaps": "the schedule: waits between its actions",
              "overhead": "host overhead between this rank's actions"}
# Culprits named per idle span, largest first; the rest are counted.
MAX_BLAMED = 3


def idle_blame(analysis: Analysis) -> dict[tuple[int, int, str], str]:
    """(rank, step, cause) -> who the rank's idle of that cause in that step is blamed on:
    the stages behind its imbalance and the links behind its comm latency, each with its
    share (the attribution's stage_blame and link_blame), largest first."""
    if analysis.attribution is None:
        return {}
    to_rank = analysis.run.schedule.stage_to_rank if analysis.run.schedule is not None else {}
    out: dict[tuple[int, int, str], str] = {}
    for step in analysis.attribution.steps:
        for rank, rows in step.stage_blame.groupby("rank"):
            rows = rows.sort_values("imbalance_ns", ascending=False)
            out[(int(rank), step.step, "imbalance")] = _culprits(
                [f"stage {int(s)} (rank {to_rank.get(int(s), '?')}) {_ms3(ns)} ms"
                 for s, ns in zip(rows["stage"], rows["imbalance_ns"])])
        for rank, rows in step.link_blame.groupby("rank"):
            rows = rows.sort_values("comm_ns", ascending=False)
            out[(int(rank), step.step, "comm")] = _culprits(
                [f"link {int(a)} -> {int(b)} {_ms3(ns)} ms"
                 for a, b, ns in zip(rows["src_rank"], rows["dst_rank"], rows["comm_ns"])])
    return out


def _culprits(named: list[str]) -> str:
    rest = len(named) - MAX_BLAMED
    return ", ".join(named[:MAX_BLAMED]) + (f" and {rest} more" if rest > 0 else "")


def _step_view(analysis, step, lo, hi, lanes, rank_lane, stream_lane, intervals, blame) -> StepView:
    run = analysis.run
    thinned: dict[str, tuple[int, int]] = {}
    pixel_ns = max((hi - lo) / TIMELINE_WIDTH_PX, 1.0)
    frames = [_action_work(run.actions, step, rank_lane)] if analysis.is_pipeline else \
        _plain_work(analysis, step, rank_lane)
    frames = [f for f in (*frames, _gpu_work(run.events, lo, hi, stream_lane)) if len(f)]
    work = pd.concat(frames, ignore_index=True) if frames else _empty_work()
    bars, merge_gap = decimate(work, MAX_BARS, pixel_ns)
    if merge_gap:
        thinned["bars"] = (len(work), len(bars))
    bars = _to_view_bars(bars, lo)
    idle = _idle_view(intervals, step, lo, rank_lane, merge_gap, thinned, blame)
    messages = _message_view(analysis, step, lo, rank_lane, thinned)
    critical_links, critical_bars = _critical_view(analysis, step, lo, rank_lane)
    rows = analysis.bubbles[analysis.bubbles["step"] == step]
    bubble = float(rows["idle_ns"].sum() / max(int(rows["window_ns"].sum()), 1))
    return StepView(step=step, window_ns=hi - lo, bubble_ratio=bubble, lanes=lanes, bars=bars, idle=idle,
                    messages=messages, critical_links=critical_links, critical_bars=critical_bars, thinned=thinned,
                    merge_gap_ns=merge_gap)


def thinning_notes(views: list[StepView]) -> list[str]:
    """One sentence per kind of thinning, summed over the steps drawn."""
    def total(what: str) -> tuple[int, int]:
        pairs = [v.thinned[what] for v in views if what in v.thinned]
        return sum(a for a, _ in pairs), sum(b for _, b in pairs)

    sentences = []
    if any("bars" in v.thinned for v in views):
        n_in, n_out = total("bars")
        gap_ms = max(v.merge_gap_ns for v in views) / 1e6
        sentences.append(f"{n_in:,} actions and ops drawn as {n_out:,} bars: neighbours on a row less than "
                         f"{gap_ms:.3g} ms apart are merged into one grey bar.")
    if any("idle" in v.thinned for v in views):
        n_in, n_out = total("idle")
        sentences.append(f"The longest {n_out:,} of {n_in:,} idle spans are shaded; the per-rank bars and "
                         "tables count every nanosecond.")
    if any("messages" in v.thinned for v in views):
        n_in, n_out = total("messages")
        sentences.append(f"The {n_out:,} slowest of {n_in:,} messages are drawn.")
    if not sentences:
        return []
    return ["This run is large, so the timeline was thinned to stay responsive (over the steps drawn): "
            + " ".join(sentences)]


def _empty_work() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in ("lane", "start", "end", "kind", "rank", "stage", "microbatch", "label")})


def _action_work(actions: pd.DataFrame, step: int, rank_lane: dict) -> pd.DataFrame:
    acts = actions[actions["step"] == step]
    return pd.DataFrame({
        "lane": acts["rank"].map(rank_lane).to_numpy(), "start": acts["start_ns"].to_numpy(),
        "end": acts["end_ns"].to_numpy(), "kind": acts["kind"].astype(str).to_numpy(),
        "rank": acts["rank"].to_numpy(), "stage": acts["stage"].to_numpy(),
        "microbatch": acts["microbatch"].to_numpy(), "label": acts["label"].astype(str).to_numpy()})


def _gpu_work(events: pd.DataFrame, lo: int, hi: int, stream_lane: dict) -> pd.DataFrame:
    if not stream_lane:
        return _empty_work()
    gpu = events[events["on_gpu"] & events["cat"].isin(_GPU_CATS) & (events["end_ns"] > lo)
                 & (events["start_ns"] < hi)]
    lane = [stream_lane.get((int(r), int(t)), -1) for r, t in zip(gpu["rank"], gpu["tid"])]
    return pd.DataFrame({"lane": lane, "start": gpu["start_ns"].clip(lower=lo).to_numpy(),
                         "end": gpu["end_ns"].clip(upper=hi).to_numpy(), "kind": "kernel",
                         "rank": gpu["rank"].to_numpy(), "stage": -1, "microbatch": -1,
                         "label": gpu["name"].astype(str).to_numpy()}).query("lane >= 0")


def _plain_work(analysis: Analysis, step: int, rank_lane: dict) -> list[pd.DataFrame]:
    """Runs without a pipeline: each rank's top-level CPU work in its step window (GPU work
    has its own stream lanes)."""
    events = analysis.run.events
    rows = analysis.bubbles[analysis.bubbles["step"] == step]
    out = []
    for row in rows.itertuples(index=False):
        ev = events[(events["rank"] == row.rank) & ~events["on_gpu"] & (events["depth"] == 0)
                    & (events["end_ns"] > row.window_start_ns) & (events["start_ns"] < row.window_end_ns)
                    & ~events["name"].str.startswith("ProfilerStep")]
        out.append(pd.DataFrame({
            "lane": rank_lane[int(row.rank)], "start": ev["start_ns"].clip(lower=row.window_start_ns).to_numpy(),
            "end": ev["end_ns"].clip(upper=row.window_end_ns).to_numpy(), "kind": "cpu",
            "rank": int(row.rank), "stage": -1, "microbatch": -1, "label": ev["name"].astype(str).to_numpy()}))
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
    out = pd.DataFrame({
        "lane": grouped["lane"].first(), "start": grouped["start"].min(), "end": grouped["end"].max(),
        "kind": kinds, "rank": grouped["rank"].first(), "stage": grouped["stage"].first(),
        "microbatch": grouped["microbatch"].first(), "label": grouped["label"].first(),
        "n": grouped.size()}).reset_index(drop=True)
    many = out["n"] > 1
    out.loc[many, "label"] = out.loc[many, "n"].map(lambda n: f"{n} merged")
    out.loc[many, ["stage", "microbatch"]] = -1
    return out, gap


def _to_view_bars(bars: pd.DataFrame, lo: int) -> pd.DataFrame:
    return pd.DataFrame({
        "x0": (bars["start"].to_numpy(dtype=np.int64) - lo) / 1e6, "y0": bars["lane"].to_numpy(dtype=float) - 0.38,
        "x1": (bars["end"].to_numpy(dtype=np.int64) - lo) / 1e6, "y1": bars["lane"].to_numpy(dtype=float) + 0.38,
        "kind": bars["kind"].astype(str).to_numpy(), "rank": bars["rank"].to_numpy(dtype=np.int64),
        "stage": bars["stage"].to_numpy(dtype=np.int64), "microbatch": bars["microbatch"].to_numpy(dtype=np.int64),
        "dur_ms": (bars["end"].to_numpy(dtype=np.int64) - bars["start"].to_numpy(dtype=np.int64)) / 1e6,
        "n": bars["n"].to_numpy(dtype=np.int64), "label": _visible_labels(bars["label"])})


def _visible_labels(labels: pd.Series) -> np.ndarray:
    """Event names for the hover text; escaped once per distinct name (they repeat)."""
    labels = labels.astype(str)
    return labels.map({name: for_xml(name) for name in labels.unique()}).to_numpy()


def _idle_view(intervals: pd.DataFrame, step: int, lo: int, rank_lane: dict, merge_gap: float,
               thinned: dict, blame: dict[tuple[int, int, str], str]) -> pd.DataFrame:
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
    return pd.DataFrame({"x0": (spans["start_ns"].to_numpy() - lo) / 1e6, "y0": lane - 0.45,
                         "x1": (spans["end_ns"].to_numpy() - lo) / 1e6, "y1": lane + 0.45,
                         "cause": spans["cause"].to_numpy(), "rank": spans["rank"].to_numpy(),
                         "dur_ms": (spans["end_ns"] - spans["start_ns"]).to_numpy() / 1e6,
                         "blame": [blame.get((int(r), step, c), _BLAMED_ON.get(c, "")) for r, c in
                                   zip(spans["rank"], spans["cause"])]})


def _message_view(analysis: Analysis, step: int, lo: int, rank_lane: dict, thinned: dict) -> pd.DataFrame:
    columns = ["x0", "y0", "x1", "y1", "link", "post_ms", "wire_ms", "wait_ms", "direction"]
    messages = analysis.run.messages
    if not analysis.is_pipeline or len(messages) == 0:
        return pd.DataFrame(columns=columns)
    msgs = messages[(messages["step"] == step) & messages["src_rank"].isin(rank_lane)
                    & messages["dst_rank"].isin(rank_lane)]
    producer_end = analysis.run.actions.set_index("action_id")["end_ns"]
    ready = msgs["producer_action"].map(producer_end).fillna(msgs["send_post_ns"]).astype(np.int64)
    latency = (msgs["arrival_ns"] - ready).clip(lower=0)
    if len(msgs) > MAX_MESSAGES:
        thinned["messages"] = (len(msgs), MAX_MESSAGES)
        keep = latency.nlargest(MAX_MESSAGES).index
        msgs, ready, latency = msgs.loc[keep], ready.loc[keep], latency.loc[keep]
    post = (msgs["send_post_ns"] - ready).clip(lower=0)
    return pd.DataFrame({
        "x0": (msgs["send_post_ns"].to_numpy() - lo) / 1e6, "y0": msgs["src_rank"].map(rank_lane).to_numpy(dtype=float),
        "x1": (msgs["arrival_ns"].to_numpy() - lo) / 1e6, "y1": msgs["dst_rank"].map(rank_lane).to_numpy(dtype=float),
        "link": [f"{s}->{d}" for s, d in zip(msgs["src_rank"], msgs["dst_rank"])],
        "post_ms": post.to_numpy() / 1e6, "wire_ms": (latency - post).clip(lower=0).to_numpy() / 1e6,
        "wait_ms": msgs["recv_wait_ns"].to_numpy() / 1e6, "direction": msgs["direction"].astype(str).to_numpy()})


def _critical_view(analysis: Analysis, step: int, lo: int, rank_lane: dict):
    attribution = analysis.attribution
    if attribution is None:
        return None, None
    by_step = {s.step: s for s in attribution.steps}
    if step not in by_step or not by_step[step].critical_path:
        return None, None
    actions = analysis.run.actions.set_index("action_id")
    path = [p for p in reversed(by_step[step].critical_path) if p["action_id"] in actions.index]
    rows = []
    for p in path:
        a = actions.loc[p["action_id"]]
        y = float(rank_lane[int(a["rank"])])
        rows.append(((int(a["start_ns"]) - lo) / 1e6, y - 0.42, (int(a["end_ns"]) - lo) / 1e6, y + 0.42,
                     f"{p['kind']}{p['stage']}.{p['microbatch']}", int(a["rank"]), p["compute_ns"] / 1e6,
                     p.get("comm_ns", 0) / 1e6, p.get("via", ""), p.get("link", "")))
    bars = pd.DataFrame(rows, columns=["x0", "y0", "x1", "y1", "action", "rank", "compute_ms", "comm_ms", "via", "link"])
    lane = (bars["y0"] + bars["y1"]) / 2
    links = pd.DataFrame({"x0": bars["x1"].to_numpy()[:-1], "y0": lane.to_numpy()[:-1],
                          "x1": bars["x0"].to_numpy()[1:], "y1": lane.to_numpy()[1:]})
    return links, bars


# ---------------------------------------------------------------------------- figures
# Plain bokeh, not holoviews: holoviews' bokeh backend imports panel (~0.4 s, ~120 MB), and
# bokeh's resources then carry every registered model's script, among them panel's
# es-module-shims as a relative <script src> that 404s in a file meant to be self-contained.

# The wheel zooms only with this key held: a bare wheel scrolls the page (bokeh says so on the plot).
ZOOM_MODIFIERS = {"ctrl": True}
# Legend entries per row under the timeline: ~170 px each fits the plotting area's width.
LEGEND_COLUMNS = 6
IDLE_TOOLTIPS = [("idle", "@cause"), ("rank", "@rank"), ("length", "@dur_ms{0.000} ms"),
                 ("blamed on (rank, step)", "@blame")]


def _figure(**kwargs):
    """A figure drawn on canvas (WebGL is absent from many headless and remote browsers, and
    these plots are small enough for canvas), sized by its plotting area so that axes and a
    legend outside it grow the figure instead of spilling over what follows."""
    from bokeh.plotting import figure

    return figure(output_backend="canvas", tools=[], toolbar_location="right", **kwargs)


def _source(frame: pd.DataFrame):
    """The frame's columns as arrays (bokeh's own DataFrame path adds an index column, and
    calls a reset_index(inplace=True) that pandas deprecates)."""
    from bokeh.models import ColumnDataSource

    return ColumnDataSource({c: frame[c].to_numpy() for c in frame.columns})


def _hover(fig, renderer, tooltips) -> None:
    from bokeh.models import HoverTool

    fig.add_tools(HoverTool(renderers=[renderer], tooltips=tooltips))


def _legend(fig, items: list[tuple[str, list]], place: str, columns: int | None = None) -> None:
    """One legend entry per label (renderers sharing a label toggle together), outside the
    plotting area; a click hides the entry's layers."""
    from bokeh.models import Legend, LegendItem

    legend = Legend(items=[LegendItem(label=label, renderers=rs) for label, rs in items], click_policy="hide",
                    label_text_font_size="9pt", glyph_height=14, glyph_width=18, spacing=2, padding=6)
    if columns is not None:
        legend.orientation = "horizontal"
        legend.ncols = min(columns, len(items))
    fig.add_layout(legend, place)


def _timeline_root(views: list[StepView]):
    if not views:
        return None
    from bokeh.models import TabPanel, Tabs

    figures = [_timeline_figure(v) for v in views]
    if len(figures) == 1:
        root = figures[0]
    else:
        root = Tabs(tabs=[TabPanel(child=f, title=f"step {v.step}") for f, v in zip(figures, views)])
    root.name = "timeline"
    return root


def _timeline_figure(view: StepView):
    from bokeh.models import FixedTicker, PanTool, Range1d, ResetTool, SaveTool, WheelZoomTool

    n = len(view.lanes)
    window_ms = view.window_ns / 1e6
    x_lo, x_hi = -0.01 * window_ms, 1.01 * window_ms
    # y is fixed (every lane stays in view); x zooms and pans inside the step's window only
    fig = _figure(frame_width=TIMELINE_WIDTH_PX, frame_height=int(min(max(34 * n, 150), 1400)),
                  x_range=Range1d(x_lo, x_hi, bounds=(x_lo, x_hi)), y_range=Range1d(n - 0.4, -0.6),
                  x_axis_label="ms since the step window's start",
                  title=f"step {view.step}: {window_ms:.1f} ms, {100 * view.bubble_ratio:.1f}% idle")
    wheel = WheelZoomTool(dimensions="width", modifiers=ZOOM_MODIFIERS)
    pan = PanTool(dimensions="width")
    fig.add_tools(pan, wheel, ResetTool(), SaveTool())
    fig.toolbar.active_drag, fig.toolbar.active_scroll = pan, wheel
    fig.grid.visible = False
    fig.title.text_font_size = "12pt"
    # one tick label per lane while they fit (about 14 px each), else every k-th lane
    every = max(1, int(np.ceil(n / max(1, fig.frame_height // 14))))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(0, n, every)))
    fig.yaxis.major_label_overrides = {i: view.lanes[i] for i in range(0, n, every)}
    items: dict[str, list] = {}

    def quads(frame: pd.DataFrame, label: str, tooltips, **style):
        renderer = fig.quad(left="x0", right="x1", bottom="y0", top="y1", source=_source(frame), **style)
        items.setdefault(label, []).append(renderer)
        if tooltips:
            _hover(fig, renderer, tooltips)

    for cause in CATEGORIES:
        part = view.idle[view.idle["cause"] == cause]
        if len(part):
            quads(part, f"idle: {CAUSE_NAMES[cause]}", IDLE_TOOLTIPS,
                  fill_color=CAUSE_COLORS[cause], line_alpha=0, fill_alpha=0.55)
    for kind in KIND_COLORS:
        part = view.bars[view.bars["kind"] == kind]
        if len(part):
            quads(part, KIND_NAMES[kind], [("action", "@kind"), ("rank", "@rank"), ("stage", "@stage"),
                                           ("microbatch", "@microbatch"), ("compute", "@dur_ms{0.000} ms"),
                                           ("start", "@x0{0.000} ms"), ("label", "@label")],
                  fill_color=KIND_COLORS[kind], line_color="white", line_width=0.5)
    text = _bar_text(view)
    if len(text):
        fig.text(x="x", y="y", text="text", source=_source(text), text_color="white", text_font_size="8pt",
                 text_alpha=0.95, text_align="center", text_baseline="middle")
    if len(view.messages):
        renderer = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=_source(view.messages),
                               line_color=MESSAGE_COLOR, line_width=1, line_alpha=0.55)
        items["message (send -> arrival)"] = [renderer]
        _hover(fig, renderer, [("message", "@link (@direction)"), ("send left after", "@post_ms{0.000} ms"),
                               ("in flight", "@wire_ms{0.000} ms"), ("receiver waited", "@wait_ms{0.000} ms")])
    if view.critical_bars is not None and len(view.critical_bars):
        links = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=_source(view.critical_links),
                            line_color=CRITICAL_COLOR, line_width=2.5, line_alpha=0.9)
        items["critical path"] = [links]
        quads(view.critical_bars, "critical path",
              [("critical path", "@action on rank @rank"), ("compute", "@compute_ms{0.000} ms"),
               ("waited on", "@via @link"), ("comm", "@comm_ms{0.000} ms")],
              fill_alpha=0, line_color=CRITICAL_COLOR, line_width=2.5)
    if items:
        _legend(fig, list(items.items()), "below", columns=LEGEND_COLUMNS)
    return fig


def _bar_text(view: StepView) -> pd.DataFrame:
    """Kind, stage and microbatch written on the bars wide enough to hold them."""
    bars = view.bars
    ms_per_px = view.window_ns / 1e6 / TIMELINE_WIDTH_PX
    wide = bars[(bars["n"] == 1) & bars["kind"].isin(["F", "B", "I", "W"])
                & (bars["x1"] - bars["x0"] >= LABEL_MIN_PX * ms_per_px)]
    if len(wide) > MAX_TEXT_LABELS:
        return pd.DataFrame(columns=["x", "y", "text"])
    return pd.DataFrame({"x": (wide["x0"] + wide["x1"]) / 2, "y": (wide["y0"] + wide["y1"]) / 2,
                         "text": [f"{k}{s}.{m}" for k, s, m in zip(wide["kind"], wide["stage"], wide["microbatch"])]})


def _causes_root(analysis: Analysis):
    """Per-rank stacked bars: busy, then idle by cause (ms, all steps)."""
    from bokeh.models import ColumnDataSource

    table = analysis.attribution.table if analysis.attribution is not None else None
    attributed = table is not None and len(table) > 0
    parts = ["busy", *CATEGORIES] if attributed else ["busy", "idle"]
    columns: dict[str, list] = {"rank": [], **{p: [] for p in parts}}
    for rank, info in analysis.summary["per_rank"].items():
        columns["rank"].append(str(rank))
        columns["busy"].append(info["busy_ns"] / 1e6)
        if attributed:
            sums = table[table["rank"] == rank]
            for cause in CATEGORIES:
                columns[cause].append(float(sums[f"{cause}_ns"].sum()) / 1e6)
        else:
            columns["idle"].append(info["idle_ns"] / 1e6)
    if not columns["rank"]:  # no rank has device work (a CPU-only capture that is no pipeline): no bars to draw
        from bokeh.models import Div

        return Div(text="No rank has device work to show.", name="causes")
    n_ranks = len(columns["rank"])
    fig = _figure(frame_width=min(max(160, 24 * n_ranks), 1100), frame_height=300, x_range=columns["rank"],
                  x_axis_label="rank", y_axis_label="ms (all steps)", title="Each rank's time: busy, then idle by cause")
    fig.y_range.start = 0
    fig.xgrid.visible = False
    if n_ranks > 24:
        fig.xaxis.major_label_orientation = np.pi / 2
    renderers = fig.vbar_stack(parts, x="rank", width=0.8, source=ColumnDataSource(columns),
                               color=[CAUSE_COLORS[p] for p in parts], line_color="white")
    for part, renderer in zip(parts, renderers):
        _hover(fig, renderer, [("rank", "@rank"), (CAUSE_NAMES[part], f"@{{{part}}}{{0.0}} ms")])
    _legend(fig, [(CAUSE_NAMES[p], [r]) for p, r in zip(parts, renderers)], "right")
    fig.name = "causes"
    return fig


def _bubble_root(analysis: Analysis):
    """Measured bubble against the closed form and the balanced replay."""
    from bokeh.models import ColumnDataSource

    theory = analysis.theory
    rows = [("measured", 100 * float(analysis.summary["bubble_ratio"]))]
    if analysis.balanced_replay_ratio is not None:
        rows.append(("balanced replay", 100 * analysis.balanced_replay_ratio))
    if theory is not None and theory.bubble_ratio is not None:
        rows.append(("theory", 100 * theory.bubble_ratio))
    colors = {"measured": "#4C78A8", "balanced replay": "#72B7B2", "theory": "#BAB0AC"}
    source = ColumnDataSource({"what": [w for w, _ in rows], "bubble": [v for _, v in rows],
                               "color": [colors[w] for w, _ in rows], "text": [f"{v:.1f}%" for _, v in rows]})
    top = max(5.0, max(v for _, v in rows) * 1.15)
    fig = _figure(frame_width=300, frame_height=300, x_range=[w for w, _ in rows], y_range=(0, top),
                  y_axis_label="bubble %", title="Bubble: idle share of the step window")
    fig.xgrid.visible = False
    bars = fig.vbar(x="what", top="bubble", width=0.8, color="color", source=source)
    fig.text(x="what", y="bubble", text="text", source=source, text_align="center", text_baseline="bottom",
             text_font_size="11pt")
    _hover(fig, bars, [("", "@what"), ("bubble", "@bubble{0.0}%")])
    fig.name = "bubble"
    return fig


# ---------------------------------------------------------------------------- page

def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f}"


def _ms3(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _page_context(analysis: Analysis, notes: list[str]) -> dict:
    run = analysis.run
    findings = analysis.findings
    sched = run.schedule
    summary = analysis.summary
    theory = analysis.theory
    n_steps = int(analysis.bubbles["step"].nunique()) if len(analysis.bubbles) else 0
    facts = [("bubble (measured)", _pct(summary["bubble_ratio"]))]
    if theory is not None:
        facts.append(("theory", f"{_pct(theory.bubble_ratio)}  {theory.formula}"))
    if analysis.balanced_replay_ratio is not None:
        facts.append(("balanced replay", _pct(analysis.balanced_replay_ratio)))
    if sched is not None:
        facts.append(("schedule", f"{sched.name}  p={sched.p} v={sched.v} m={sched.m}"
                      + (f"  x {sched.replicas} replicas" if sched.replicas > 1 else "")))
    if analysis.device is not None:
        facts.append(("timeline", f"device (kernels); host runs ahead by up to "
                                  f"{_ms(analysis.device.host_ahead_max_ns)} ms"))
        if analysis.host_view is not None:
            facts.append(("host-side spans would say", _pct(analysis.host_view["bubble_ratio"])))
    else:
        facts.append(("timeline", "host (CPU op spans)"))
    facts += [("ranks", str(len(summary["per_rank"]))), ("steps", str(n_steps)),
              ("actions", str(len(run.actions))), ("messages", str(len(run.messages)))]
    return {
        "source": run.source, "version": __version__, "findings": findings,
        "top": findings[0] if findings else None, "facts": facts, "notes": notes,
        "rank_rows": _rank_rows(analysis), "cause_headers": [CAUSE_NAMES[c] for c in CATEGORIES],
        "stage_rows": _stage_rows(analysis), "link_rows": _link_rows(analysis),
        "critical": _critical_rows(analysis), "files": [f.describe() for f in run.files],
        "schedule": sched.to_dict() if sched else None, "theory": theory, "capture": _capture_rows(run.capture),
        "profiler": _profiler_rows(run.files), "warnings": list(run.warnings), "fold_rows": FOLD_ROWS,
        "pipeline": analysis.is_pipeline, "whatif": _whatif_rows(analysis),
        "whatif_note": analysis.whatif.note if analysis.whatif is not None else "",
        "incomplete": run.completeness.message() if run.completeness is not None else "",
    }


def _whatif_rows(analysis: Analysis) -> dict | None:
    """The rows of the analysis's what-if table, or None where it has none."""
    result = analysis.whatif.result if analysis.whatif is not None else None
    if result is None:
        return None
    measured = result.measured_step_ns

    def row(p) -> list[str]:
        return [p.label, f"{_pct(p.bubble_ratio)} ±{p.bubble_sd:.1%}", f"{_ms(p.step_ns)} ±{p.step_sd / 1e6:.1f}",
                f"{p.step_ns / measured - 1:+.1%}", _pct(p.theory) if p.theory is not None else ""]

    return {"measured": [_pct(result.measured_bubble), _ms(measured)], "model": row(result.as_measured),
            "rows": [row(p) for p in result.predictions]}


def _rank_rows(analysis: Analysis) -> list[list[str]]:
    table = analysis.attribution.table if analysis.attribution is not None else None
    rows = []
    for rank, info in analysis.summary["per_rank"].items():
        row = [str(rank), _ms(info["busy_ns"]), _ms(info["idle_ns"]), _pct(info["bubble_ratio"])]
        if table is not None and len(table):
            sums = table[table["rank"] == rank]
            row += [_ms(sums[f"{c}_ns"].sum()) for c in CATEGORIES]
        rows.append(row)
    return rows


def _stage_rows(analysis: Analysis) -> list[list[str]]:
    if analysis.attribution is None or not analysis.is_pipeline:
        return []
    blame = analysis.attribution.stage_blame
    compute = stage_compute_ns(analysis.run.actions)
    idle = max(int(analysis.summary["idle_ns"]), 1)
    to_rank = analysis.run.schedule.stage_to_rank
    by_stage = blame.groupby("stage")["imbalance_ns"].sum() if len(blame) else pd.Series(dtype=float)
    median = float(compute.median()) if len(compute) else 0.0
    rows = []
    for stage in sorted(compute.index, key=lambda s: -by_stage.get(s, 0)):
        rows.append([str(int(stage)), str(to_rank.get(int(stage), "?")), _ms(compute[stage]),
                     f"{compute[stage] / median:.2f}x" if median else "n/a",
                     _ms(by_stage.get(stage, 0)), _pct(by_stage.get(stage, 0) / idle)])
    return rows


def _link_rows(analysis: Analysis) -> list[list[str]]:
    if analysis.attribution is None or not analysis.is_pipeline:
        return []
    blame = analysis.attribution.link_blame
    idle = max(int(analysis.summary["idle_ns"]), 1)
    latencies = message_latencies(analysis)
    by_link = blame.groupby(["src_rank", "dst_rank"])["comm_ns"].sum() if len(blame) else pd.Series(dtype=float)
    stats = latencies.groupby(["src_rank", "dst_rank"]).agg(
        n=("latency_ns", "size"), latency=("latency_ns", "median"), post=("post_delay_ns", "median"))
    rows = []
    for link in sorted(stats.index, key=lambda k: -by_link.get(k, 0)):
        s = stats.loc[link]
        rows.append([f"{link[0]} -> {link[1]}", str(int(s["n"])), _ms(s["latency"]), _ms(s["post"]),
                     _ms(by_link.get(link, 0)), _pct(by_link.get(link, 0) / idle)])
    return rows


def _critical_rows(analysis: Analysis) -> dict | None:
    attribution = analysis.attribution
    if attribution is None or not attribution.steps:
        return None
    slowest = max(attribution.steps, key=lambda s: s.measured_makespan_ns)
    path = list(reversed(slowest.critical_path))
    rows = [[f"{p['kind']}{p['stage']}.{p['microbatch']}", str(p["rank"]), _ms(p["compute_ns"]),
             p.get("via", ""), p.get("link", ""), _ms(p.get("comm_ns", 0)), _ms(p.get("overhead_ns", 0))]
            for p in path]
    return {"step": slowest.step, "makespan": _ms(slowest.measured_makespan_ns), "rows": rows,
            "compute": _ms(sum(p["compute_ns"] for p in path)), "comm": _ms(sum(p.get("comm_ns", 0) for p in path))}


def _capture_rows(capture: dict | None) -> list[tuple[str, str]]:
    if not capture:
        return []
    rows = []
    for key in ("command", "tracekit_version", "torch_version", "python_version", "platform", "schedule_class",
                "backend", "created"):
        if key in capture:
            rows.append((key, str(capture[key])))
    compute = capture.get("compute") or {}
    if isinstance(compute, dict) and compute:
        rows.append(("compute", ", ".join(f"{k}={compute[k]}" for k in ("mode", "layer_ms", "layers") if k in compute)))
        if "how" in compute:
            rows.append(("compute, how", str(compute["how"])))
    faults = capture.get("faults") or {}
    if isinstance(faults, dict) and faults:
        rows.append(("faults", str(faults.get("how", faults))))
    return rows


def _profiler_rows(files) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for f in files:
        for key, value in (f.profiler or {}).items():
            seen.setdefault(str(key), str(value))
    return sorted(seen.items())


_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1500px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 20px; margin: 4px 0 12px; font-weight: 600; }
h1 code { font-size: 18px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.verdict { background: #fff; border-left: 6px solid #999; padding: 12px 16px; margin: 8px 0 12px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.verdict.high { border-color: #D62728; } .verdict.medium { border-color: #F58518; } .verdict.low, .verdict.info { border-color: #4C78A8; }
.verdict p { margin: 2px 0; font-size: 16px; } .verdict .advice { color: #333; }
.facts { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 6px 0 4px; color: #444; }
.facts b { color: #222; }
.sev { display: inline-block; min-width: 52px; text-align: center; border-radius: 3px; color: #fff; font-size: 11px; padding: 1px 4px; margin-right: 6px; text-transform: uppercase; }
.sev.high { background: #D62728; } .sev.medium { background: #F58518; } .sev.low, .sev.info { background: #4C78A8; }
ol.findings { padding-left: 20px; } ol.findings li { margin: 6px 0; }
table { border-collapse: collapse; background: #fff; margin: 6px 0 10px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
.figs { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.note { color: #8a5a00; background: #fff8e5; border: 1px solid #f0dca0; padding: 6px 10px; margin: 6px 0; }
.muted { color: #666; } details summary { cursor: pointer; color: #245; margin: 4px 0; }
code { background: #f0f0f0; padding: 0 3px; border-radius: 2px; }
</style>
{{ bokeh_css|safe }}
{{ bokeh_js|safe }}
</head>
<body>
<main>
<h1>tracekit report: <code>{{ source }}</code></h1>
{% if incomplete %}<div class="verdict high" id="incomplete"><p><b>{{ incomplete }}</b></p></div>{% endif %}
{% if top %}
<div class="verdict {{ top.severity }}" id="verdict">
<p><b>{{ top.headline }}</b></p>
<p class="advice">{{ top.advice }}</p>
</div>
{% endif %}
<div class="facts">{% for k, v in facts %}<span>{{ k }}: <b>{{ v }}</b></span>{% endfor %}</div>
{% for note in notes %}<div class="note">{{ note }}</div>{% endfor %}

{% if findings|length > 1 %}
<h2>Findings, most important first</h2>
<ol class="findings">
{% for f in findings %}<li><span class="sev {{ f.severity }}">{{ f.severity }}</span>{{ f.headline }} <span class="muted">{{ f.advice }}</span></li>
{% endfor %}</ol>
{% endif %}

{% if has_timeline %}
<h2>Timeline</h2>
<p class="muted">One row per rank{% if pipeline %}: compute actions coloured by kind (hover for stage, microbatch and
duration), idle time shaded by the cause it is attributed to, messages drawn from the moment the send left to the
moment the data was at the receiver, and the step's critical path in red{% endif %}. Ctrl + scroll zooms in time,
drag pans; click a legend entry to hide it.</p>
<div id="timeline">{{ root_div(roots.timeline) }}</div>
{% endif %}

<h2>Where the time goes</h2>
<div class="figs">
<div>{{ root_div(roots.causes) }}</div>
{% if has_bubble %}<div>{{ root_div(roots.bubble) }}</div>{% endif %}
</div>
{% if theory %}<p class="muted">Theory: {{ theory.schedule }}, {{ theory.formula or "no closed form" }}{% if theory.note %} ({{ theory.note }}){% endif %}.
Balanced replay: this run's own dependency graph replayed with every stage at its kind's typical duration, free messages and no overhead.</p>{% endif %}

{% if whatif_note %}
<h2>What if: other schedules, m, a balanced split</h2>
<div class="note" id="whatif-note">{{ whatif_note }}</div>
{% endif %}
{% if whatif %}
<h2>What if: other schedules, m, a balanced split</h2>
<p class="muted">Each configuration's dependency graph replayed up to 16 times with compute, overheads and latencies drawn from
this run's measured samples (global batch kept; "balanced": layers re-split so every rank computes the same). The
"model of the measured run" row is the model's own error. More with <code>tracekit whatif</code>.</p>
<details><summary>{{ whatif.rows|length }} predictions</summary>
<table><tr><th class="l">configuration</th><th>bubble</th><th>step ms</th><th>vs measured</th><th>closed form</th></tr>
<tr><td class="l">measured</td><td>{{ whatif.measured[0] }}</td><td>{{ whatif.measured[1] }}</td><td></td><td></td></tr>
<tr><td class="l">{{ whatif.model[0] }}</td>{% for c in whatif.model[1:] %}<td>{{ c }}</td>{% endfor %}</tr>
{% for r in whatif.rows %}<tr><td class="l">{{ r[0] }}</td>{% for c in r[1:] %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table></details>
{% endif %}

<h2>Per rank (ms, all steps)</h2>
{% set rank_table %}
<table><tr><th>rank</th><th>busy</th><th>idle</th><th>bubble</th>{% if rank_rows and rank_rows[0]|length > 4 %}{% for h in cause_headers %}<th>{{ h }}</th>{% endfor %}{% endif %}</tr>
{% for row in rank_rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% endset %}
{% if rank_rows|length > fold_rows %}<details><summary>{{ rank_rows|length }} ranks</summary>{{ rank_table }}</details>{% else %}{{ rank_table }}{% endif %}
{% if pipeline %}<p class="muted">The idle causes of a rank add up to its idle time exactly.</p>{% endif %}

{% if stage_rows %}
<h2>Blame: stages</h2>
<p class="muted">Compute per step of each stage, and the idle it caused on all ranks through imbalance (all steps).</p>
{% set stage_table %}
<table><tr><th>stage</th><th>rank</th><th>compute ms / step</th><th>vs median</th><th>imbalance idle ms</th><th>share of idle</th></tr>
{% for row in stage_rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% endset %}
{% if stage_rows|length > fold_rows %}<details><summary>{{ stage_rows|length }} stages</summary>{{ stage_table }}</details>{% else %}{{ stage_table }}{% endif %}
{% endif %}

{% if link_rows %}
<h2>Blame: links</h2>
<p class="muted">Messages per link: latency from the producing action's end to the data being at the receiver (median),
how much of it passed before the send was posted, and the idle the link caused on all ranks (all steps).</p>
{% set link_table %}
<table><tr><th class="l">link</th><th>messages</th><th>latency ms</th><th>send posted after ms</th><th>comm idle ms</th><th>share of idle</th></tr>
{% for row in link_rows %}<tr><td class="l">{{ row[0] }}</td>{% for c in row[1:] %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% endset %}
{% if link_rows|length > fold_rows %}<details><summary>{{ link_rows|length }} links</summary>{{ link_table }}</details>{% else %}{{ link_table }}{% endif %}
{% endif %}

{% if critical %}
<h2>Critical path of the slowest step (step {{ critical.step }}, {{ critical.makespan }} ms)</h2>
<p class="muted">The chain of actions and waits that set the step's length: compute {{ critical.compute }} ms, comm {{ critical.comm }} ms.</p>
<details><summary>{{ critical.rows|length }} actions</summary>
<table><tr><th class="l">action</th><th>rank</th><th>compute ms</th><th class="l">waited on</th><th class="l">link</th><th>comm ms</th><th>overhead ms</th></tr>
{% for r in critical.rows %}<tr><td class="l">{{ r[0] }}</td><td>{{ r[1] }}</td><td>{{ r[2] }}</td><td class="l">{{ r[3] }}</td><td class="l">{{ r[4] }}</td><td>{{ r[5] }}</td><td>{{ r[6] }}</td></tr>
{% endfor %}</table></details>
{% endif %}

<h2>Run</h2>
{% if schedule %}
<p>Schedule <b>{{ schedule.name }}</b>: p={{ schedule.p }}, v={{ schedule.v }}, m={{ schedule.m }}, {{ schedule.placement }} placement{% if schedule.split_backward %}, split backward{% endif %}.</p>
<ul>{% for e in schedule.evidence %}<li>{{ e }}</li>{% endfor %}</ul>
{% else %}<p>No pipeline-parallel schedule recognised.</p>{% endif %}
{% set files_table %}
<table><tr><th class="l">file</th><th class="l">format</th><th>rank</th><th class="l">host</th><th class="l">backend</th><th class="l">clock</th><th class="l">rank from</th><th>events</th><th class="l">truncated</th></tr>
{% for f in files %}<tr><td class="l">{{ f.path }}</td><td class="l">{{ f.format }}</td><td>{{ f.rank }}</td><td class="l">{{ f.host or "" }}</td><td class="l">{{ f.backend or "" }}</td><td class="l">{{ f.clock }}</td><td class="l">{{ f.rank_source }}</td><td>{{ f.n_events_raw }}</td><td class="l">{{ "yes" if f.truncated else "" }}</td></tr>
{% endfor %}</table>
{% endset %}
{% if files|length > fold_rows %}<details><summary>{{ files|length }} files</summary>{{ files_table }}</details>{% else %}{{ files_table }}{% endif %}
{% if capture %}
<h3>capture.json</h3>
<table>{% for k, v in capture %}<tr><th class="l">{{ k }}</th><td class="l">{{ v }}</td></tr>{% endfor %}</table>
{% endif %}
{% if profiler %}
<h3>Profiler</h3>
<table>{% for k, v in profiler %}<tr><th class="l">{{ k }}</th><td class="l">{{ v }}</td></tr>{% endfor %}</table>
{% endif %}
<h3>Warnings</h3>
{% if warnings %}<ul>{% for w in warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% else %}<p class="muted">none</p>{% endif %}
<p class="muted">tracekit {{ version }}</p>
</main>
{{ plot_script|safe }}
</body>
</html>
"""

_ROOT_DIV = '<div id="{}" data-root-id="{}" style="display: contents;"></div>'


def _visible_controls(value):
    """Each value the page shows, with controls as visible escapes (markup is bokeh's own)."""
    return for_xml(value) if isinstance(value, str) and not hasattr(value, "__html__") else value


def _page_template() -> jinja2.Template:
    """The page, autoescaped: only bokeh's own output is marked safe."""
    from markupsafe import Markup, escape

    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, finalize=_visible_controls)
    env.globals["root_div"] = lambda root: Markup(_ROOT_DIV.format(escape(root.elementid), escape(root.id)))
    return env.from_string(_PAGE)
