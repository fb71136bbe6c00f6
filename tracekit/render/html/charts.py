"""The HTML report's bokeh figures: the step timelines, each rank's time by cause, and the
bubble against theory."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tracekit.analyze import Analysis
from tracekit.analyze.report_figures import busy_per_step_ns, place_means, rank_causes_ns
from tracekit.render.html.views import MAX_BARS, TIMELINE_WIDTH_PX, StepView
from tracekit.vocab import ACTION_KIND_NAMES, CATEGORIES, IDLE_CAUSES

if TYPE_CHECKING:  # bokeh is imported where a figure is drawn (the HTML report only)
    from bokeh.models import ColumnDataSource, GlyphRenderer, IndexFilter, LayoutDOM
    from bokeh.plotting import figure

# A hover's rows: (label, bokeh field format), such as ("rank", "@rank").
Tooltips = list[tuple[str, str]]
# A timeline's kind of bar drawn at full resolution when zoomed in: (its filter, its source,
# its merged rows).
Layer = tuple["IndexFilter", "ColumnDataSource", int]
# The bar labels' filters (full, short) and their source.
Labels = tuple["IndexFilter", "IndexFilter", "ColumnDataSource"]


KIND_COLORS = {
    "F": "#4C78A8",
    "B": "#F58518",
    "I": "#E45756",
    "W": "#54A24B",
    "merged": "#8C8C8C",
    "cpu": "#8C8C8C",
    "kernel": "#17BECF",
}
KIND_NAMES = {
    **ACTION_KIND_NAMES,
    "merged": "merged actions",
    "cpu": "CPU ops (top level)",
    "kernel": "GPU work",
}
# A bar carries its action as text where the text fits: "F2.3" (kind, stage, microbatch), or
# on a narrower bar its microbatch alone ("3"; the hover names it in full). Widths are
# estimated at the labels' 8pt: about 6 px a character and 2 px each side. At most this many
# bars a step are labelled (past it, none: the labels would be the picture).
LABEL_CHAR_PX = 6
LABEL_PAD_PX = 4
MAX_TEXT_LABELS = 600
# The stacked bars' parts (busy, then each idle cause, or idle unattributed): their colours
# and legend names, the causes' from tracekit.vocab.
CAUSE_COLORS = {"busy": "#4C78A8", **{c.key: c.color for c in IDLE_CAUSES}, "idle": "#DDDDDD"}
LEGEND_NAMES = {"busy": "busy", **{c.key: c.legend for c in IDLE_CAUSES}, "idle": "idle"}
CRITICAL_COLOR = "#D62728"
# The critical path: a thin outline round its actions and thin links between them, under
# the bars' labels.
CRITICAL_LINE_PX = 1.5
MESSAGE_COLOR = "#333333"


# ---------------------------------------------------------------------------- figures
# Plain bokeh, not holoviews: holoviews' bokeh backend imports panel (~0.4 s, ~120 MB), and
# bokeh's resources then carry every registered model's script, among them panel's
# es-module-shims as a relative <script src> that 404s in a file meant to be self-contained.

# The wheel zooms only with this key held: a bare wheel scrolls the page (bokeh says so on the plot).
ZOOM_MODIFIERS = {"ctrl": True}
# Legend entries per row under the timeline: ~170 px each fits the plotting area's width.
LEGEND_COLUMNS = 6
BAR_TOOLTIPS = [
    ("", "@name"),
    ("rank", "@rank"),
    ("length", "@dur_ms{0.000} ms"),
    ("start", "@x0{0.000} ms"),
]
IDLE_TOOLTIPS = [
    ("idle", "@cause"),
    ("rank", "@rank"),
    ("length", "@dur_ms{0.000} ms"),
    ("blamed on (rank, step)", "@blame"),
]


def _figure(**kwargs: Any) -> figure:
    """A figure drawn on canvas (WebGL is absent from many headless and remote browsers, and
    these plots are small enough for canvas), sized by its plotting area so that axes and a
    legend outside it grow the figure instead of spilling over what follows."""
    from bokeh.plotting import figure

    return figure(output_backend="canvas", tools=[], toolbar_location="right", **kwargs)


def _source(frame: pd.DataFrame) -> ColumnDataSource:
    """The frame's columns as arrays (bokeh's own DataFrame path adds an index column, and
    calls a reset_index(inplace=True) that pandas deprecates)."""
    from bokeh.models import ColumnDataSource

    return ColumnDataSource({c: frame[c].to_numpy() for c in frame.columns})


def _hover(fig: figure, renderer: GlyphRenderer, tooltips: Tooltips, formatters: dict[str, Any] | None = None) -> None:
    from bokeh.models import HoverTool

    fig.add_tools(HoverTool(renderers=[renderer], tooltips=tooltips, formatters=formatters or {}))


def _legend(fig: figure, items: list[tuple[str, list[GlyphRenderer]]], place: str, columns: int | None = None) -> None:
    """One legend entry per label (renderers sharing a label toggle together), outside the
    plotting area; a click hides the entry's layers."""
    from bokeh.models import Legend, LegendItem

    legend = Legend(
        items=[LegendItem(label=label, renderers=rs) for label, rs in items],
        click_policy="hide",
        label_text_font_size="9pt",
        glyph_height=14,
        glyph_width=18,
        spacing=2,
        padding=6,
    )
    if columns is not None:
        legend.orientation = "horizontal"
        legend.ncols = min(columns, len(items))
    fig.add_layout(legend, place)


def timeline_root(views: list[StepView]) -> LayoutDOM | None:
    if not views:
        return None
    from bokeh.models import TabPanel, Tabs

    figures = [_timeline_figure(v) for v in views]
    if len(figures) == 1:
        root = figures[0]
    else:
        root = Tabs(tabs=[TabPanel(child=f, title=f"step {v.step}") for f, v in zip(figures, views)])
    if views[0].groups:
        root = _with_replica_selector(root, figures, views[0].groups)
    root.name = "timeline"
    return root


def _with_replica_selector(root: LayoutDOM, figures: list[figure], groups: list[tuple[str, int, int]]) -> LayoutDOM:
    """A menu above the timeline that shows one replica's lanes at a time (every step's
    figure holds the lanes of all the replicas kept; the menu moves their y range)."""
    from bokeh.layouts import column
    from bokeh.models import CustomJS, Select

    # lists, not a dict: a dict arrives in BokehJS as a Map, which [] does not index
    starts, ends = [last + 0.5 for _, _, last in groups], [first - 0.5 for _, first, _ in groups]
    select = Select(title="replica", options=[t for t, _, _ in groups], value=groups[0][0], width=TIMELINE_WIDTH_PX)
    select.name = "replica-selector"
    select.js_on_change(
        "value",
        CustomJS(
            args={"figures": figures, "starts": starts, "ends": ends},
            code="const i = cb_obj.options.indexOf(cb_obj.value); if (i < 0) return; "
            "for (const f of figures) { f.y_range.start = starts[i]; f.y_range.end = ends[i]; }",
        ),
    )
    return column(select, root)


def _timeline_figure(view: StepView) -> figure:
    from bokeh.models import FixedTicker, PanTool, Range1d, ResetTool, SaveTool, WheelZoomTool

    n = len(view.lanes)
    window_ms = view.window_ns / 1e6
    x_lo, x_hi = -0.01 * window_ms, 1.01 * window_ms
    # y is fixed (every lane stays in view; with replicas, every lane of the one picked); x
    # zooms and pans inside the step's window only
    first, last = (view.groups[0][1], view.groups[0][2]) if view.groups else (0, n - 1)
    shown = last - first + 1
    # with replicas, half a lane each side: the neighbouring replica's glyphs (at most 0.45
    # from their lane) stay out of view
    y_range = Range1d(last + 0.5, first - 0.5) if view.groups else Range1d(n - 0.4, -0.6)
    fig = _figure(
        frame_width=TIMELINE_WIDTH_PX,
        frame_height=int(min(max(34 * shown, 150), 1400)),
        x_range=Range1d(x_lo, x_hi, bounds=(x_lo, x_hi), name=f"step {view.step} time"),
        y_range=y_range,
        x_axis_label="ms since the step window's start",
        title=f"step {view.step}: {window_ms:.1f} ms, {100 * view.bubble_ratio:.1f}% idle"
        + (" (all replicas)" if view.groups else ""),
    )
    wheel = WheelZoomTool(dimensions="width", modifiers=ZOOM_MODIFIERS)
    pan = PanTool(dimensions="width")
    fig.add_tools(pan, wheel, ResetTool(), SaveTool())
    fig.toolbar.active_drag, fig.toolbar.active_scroll = pan, wheel
    fig.grid.visible = False
    fig.title.text_font_size = "12pt"
    # one tick label per lane while they fit (about 14 px each), else every k-th lane
    every = max(1, int(np.ceil(shown / max(1, fig.frame_height // 14))))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(0, n, every)))
    fig.yaxis.major_label_overrides = {i: view.lanes[i] for i in range(0, n, every)}
    items: dict[str, list[GlyphRenderer]] = {}

    def legend_item(renderer: GlyphRenderer, label: str, tooltips: Tooltips | None) -> GlyphRenderer:
        items.setdefault(label, []).append(renderer)
        if tooltips:
            _hover(fig, renderer, tooltips)
        return renderer

    def quads(source: ColumnDataSource, label: str, tooltips: Tooltips | None, **style: Any) -> GlyphRenderer:
        return legend_item(
            fig.quad(left="x0", right="x1", bottom="y0", top="y1", source=source, **style), label, tooltips
        )

    def segments(frame: pd.DataFrame, label: str, tooltips: Tooltips | None, **style: Any) -> GlyphRenderer:
        return legend_item(
            fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=_source(frame), **style), label, tooltips
        )

    # drawn in this order, each over the ones before: idle, bars, messages, the critical
    # path, and the bars' labels on top, on a box of their bar's colour, so that no line
    # crosses a label
    for cause in CATEGORIES:
        part = view.idle[view.idle["cause"] == cause]
        if len(part):
            quads(
                _source(part),
                f"idle: {LEGEND_NAMES[cause]}",
                IDLE_TOOLTIPS,
                fill_color=CAUSE_COLORS[cause],
                line_alpha=0,
            )
    layers = _bar_layers(fig, view, quads)
    if len(view.messages):
        segments(
            view.messages,
            "message (send -> arrival)",
            [
                ("message", "@link (@direction)"),
                ("send left after", "@post_ms{0.000} ms"),
                ("in flight", "@wire_ms{0.000} ms"),
                ("receiver waited", "@wait_ms{0.000} ms"),
            ],
            line_color=MESSAGE_COLOR,
            line_width=1,
            line_alpha=0.55,
        )
    if view.critical_bars is not None and view.critical_links is not None and len(view.critical_bars):
        segments(
            view.critical_links,
            "critical path",
            None,
            line_color=CRITICAL_COLOR,
            line_width=CRITICAL_LINE_PX,
            line_alpha=0.9,
        )
        quads(
            _source(view.critical_bars),
            "critical path",
            [
                ("critical path", "@action on rank @rank"),
                ("compute", "@compute_ms{0.000} ms"),
                ("waited on", "@via @link"),
                ("comm", "@comm_ms{0.000} ms"),
            ],
            fill_alpha=0,
            line_color=CRITICAL_COLOR,
            line_width=CRITICAL_LINE_PX,
        )
    labels = _bar_labels(fig, view)
    if labels is not None or layers:
        _redraw_on_zoom(fig, labels, layers)
    if items:
        _legend(fig, list(items.items()), "below", columns=LEGEND_COLUMNS)
    elif labels is None:  # a figure must draw something (bokeh warns W-1000 otherwise)
        fig.text(x=[x_hi / 2], y=[first], text=["no work recorded in this window"], text_align="center")
    return fig


def _bar_layers(fig: figure, view: StepView, quads: Callable[..., GlyphRenderer]) -> list[Layer]:
    """The bars, one renderer per kind, each drawing the rows its filter picks: the merged
    bars (rows 0 to n-1), or where the step was thinned, zoomed in, the full-resolution bars
    in view (rows n on). Returns (filter, source, n) of each kind with full-resolution rows.

    A bar's name reaches its hover as a number into the step's list of names: a GPU step's
    thousands of kernels have a few dozen names of a hundred characters each."""
    from bokeh.models import CDSView, CustomJSHover, IndexFilter

    every = pd.concat([view.bars, view.detail], ignore_index=True) if view.detail is not None else view.bars
    names = list(pd.unique(every["name"]))
    code = {name: i for i, name in enumerate(names)}
    tooltips = [("", "@name_id{custom}"), *BAR_TOOLTIPS[1:]]
    formatters = {"@name_id": CustomJSHover(args={"names": names}, code="return names[value]")}
    layers: list[Layer] = []
    for kind in KIND_COLORS:
        merged = view.bars[view.bars["kind"] == kind]
        detail = view.detail[view.detail["kind"] == kind] if view.detail is not None else merged.iloc[0:0]
        if not len(merged) and not len(detail):
            continue
        rows = pd.concat([merged, detail], ignore_index=True)
        source = _source(
            pd.DataFrame(
                {
                    **{c: rows[c] for c in ("x0", "x1", "y0", "y1", "dur_ms")},
                    "rank": rows["rank"].astype(np.int32),
                    "name_id": rows["name"].map(code).astype(np.int32),
                }
            )
        )
        shown = IndexFilter(indices=list(range(len(merged))))
        renderer = quads(
            source, KIND_NAMES[kind], None, fill_color=KIND_COLORS[kind], line_color="white", line_width=0.5
        )
        renderer.view = CDSView(filter=shown)
        _hover(fig, renderer, tooltips, formatters)
        if len(detail):
            layers.append((shown, source, len(merged)))
    return layers


def _bar_labels(fig: figure, view: StepView) -> Labels | None:
    """Each action bar's label where it fits, over every line: its full name ("F2.3") or its
    microbatch ("3"), as wide as the bar is at the step's full view. Returns (the full
    labels' filter, the short labels' filter, their source) for :func:`_redraw_on_zoom`, or
    None where no bar is labelled."""
    from bokeh.models import CDSView, IndexFilter

    text = _bar_text(view)
    if not len(text):
        return None
    source = _source(text)
    px_per_ms = TIMELINE_WIDTH_PX / (view.window_ns / 1e6)
    width_px = text["w"] * px_per_ms
    full = width_px >= text["full_px"]
    short = ~full & (width_px >= text["short_px"])
    filters = []
    for column, picked in (("full", full), ("short", short)):
        shown = IndexFilter(indices=[int(i) for i in np.flatnonzero(picked.to_numpy())])
        fig.text(
            x="x",
            y="y",
            text=column,
            source=source,
            view=CDSView(filter=shown),
            text_color="white",
            text_font_size="8pt",
            text_align="center",
            text_baseline="middle",
            background_fill_color="color",
            padding=1,
        )
        filters.append(shown)
    return filters[0], filters[1], source


# Runs in the page as the timeline's x range changes: labels by the width a bar has now, and
# where a step was thinned, its full-resolution bars in view once they are few enough.
_ON_ZOOM = """
const px_per_ms = width_px / (x_range.end - x_range.start);
if (labels.length) {
    const [full_filter, short_filter, source] = labels;
    const w = source.get_column("w"), full_px = source.get_column("full_px"), short_px = source.get_column("short_px");
    const full = [], short = [];
    for (let i = 0; i < w.length; i++) {
        const px = w[i] * px_per_ms;
        if (px >= full_px[i]) full.push(i); else if (px >= short_px[i]) short.push(i);
    }
    full_filter.indices = full;
    short_filter.indices = short;
}
const zoomed = x_range.end - x_range.start < 0.999 * full_ms;
const in_view = layers.map(([, source, n]) => {
    const x0 = source.get_column("x0"), x1 = source.get_column("x1"), rows = [];
    if (zoomed) {
        for (let i = n; i < x0.length; i++) {
            if (x1[i] >= x_range.start && x0[i] <= x_range.end) rows.push(i);
        }
    }
    return rows;
});
const detailed = zoomed && in_view.reduce((sum, rows) => sum + rows.length, 0) <= max_bars;
layers.forEach(([filter, , n], k) => {
    filter.indices = detailed ? in_view[k] : Array.from({length: n}, (_, i) => i);
});
"""


def _redraw_on_zoom(fig: figure, labels: Labels | None, layers: list[Layer]) -> None:
    from bokeh.models import CustomJS

    callback = CustomJS(
        args={
            "x_range": fig.x_range,
            "width_px": TIMELINE_WIDTH_PX,
            "full_ms": fig.x_range.end - fig.x_range.start,
            "max_bars": MAX_BARS,
            "labels": list(labels) if labels is not None else [],
            "layers": [list(layer) for layer in layers],
        },
        code=_ON_ZOOM,
    )
    fig.x_range.js_on_change("start", callback)
    fig.x_range.js_on_change("end", callback)


def _bar_text(view: StepView) -> pd.DataFrame:
    """The action bars that may carry a label (single actions, at most MAX_TEXT_LABELS), with
    their full and short labels, the pixels each needs, and their bar's width and colour."""
    bars = view.bars
    single = bars[(bars["n"] == 1) & bars["kind"].isin(list(ACTION_KIND_NAMES))]
    if len(single) > MAX_TEXT_LABELS:
        single = single.iloc[0:0]
    full = [f"{k}{s}.{m}" for k, s, m in zip(single["kind"], single["stage"], single["microbatch"])]
    short = [str(m) for m in single["microbatch"]]
    return pd.DataFrame(
        {
            "x": ((single["x0"] + single["x1"]) / 2).to_numpy(),
            "y": ((single["y0"] + single["y1"]) / 2).to_numpy(),
            "w": (single["x1"] - single["x0"]).to_numpy(),
            "full": full,
            "short": short,
            "full_px": [LABEL_CHAR_PX * len(t) + LABEL_PAD_PX for t in full],
            "short_px": [LABEL_CHAR_PX * len(t) + LABEL_PAD_PX for t in short],
            "color": [KIND_COLORS[k] for k in single["kind"]],
        }
    )


def causes_root(analysis: Analysis) -> LayoutDOM:
    """Per-rank stacked bars: busy, then idle by cause (ms, all steps)."""

    causes = rank_causes_ns(analysis)
    parts = ["busy", *CATEGORIES] if causes else ["busy", "idle"]
    columns: dict[str, list[Any]] = {"rank": [], **{p: [] for p in parts}}
    for rank, info in analysis.summary.per_rank.items():
        columns["rank"].append(str(rank))
        columns["busy"].append(info.busy_ns / 1e6)
        if causes:
            for cause in CATEGORIES:
                columns[cause].append(causes[rank][cause] / 1e6)
        else:
            columns["idle"].append(info.idle_ns / 1e6)
    if not columns["rank"]:  # no rank has device work (a CPU-only capture that is no pipeline): no bars to draw
        from bokeh.models import Div

        return Div(text="No rank has device work to show.", name="causes")
    n_ranks = len(columns["rank"])
    fig = _figure(
        frame_width=min(max(160, 24 * n_ranks), 1100),
        frame_height=300,
        x_range=columns["rank"],
        x_axis_label="rank",
        y_axis_label="ms (all steps)",
        title="Each rank's time: busy, then idle by cause",
    )
    fig.y_range.start = 0
    fig.xgrid.visible = False
    if n_ranks > 24:
        fig.xaxis.major_label_orientation = np.pi / 2
    return _cause_bars(fig, columns, parts, "rank")


def _cause_bars(fig: figure, columns: dict[str, list[Any]], parts: list[str], x: str) -> figure:
    """Stacked bars of ``parts`` (busy, then idle by cause, ms) per ``x`` (a rank or a stage)
    on ``fig``, with their hovers and legend: the report's "causes" chart."""
    from bokeh.models import ColumnDataSource

    renderers = fig.vbar_stack(
        parts,
        x=x,
        width=0.8,
        source=ColumnDataSource(columns),
        color=[CAUSE_COLORS[p] for p in parts],
        line_color="white",
    )
    for part, renderer in zip(parts, renderers):
        _hover(fig, renderer, [(x, f"@{x}"), (LEGEND_NAMES[part], f"@{{{part}}}{{0.0}} ms")])
    _legend(fig, [(LEGEND_NAMES[p], [r]) for p, r in zip(parts, renderers)], "right")
    fig.name = "causes"
    return fig


def bubble_root(analysis: Analysis) -> LayoutDOM:
    """Measured bubble against the closed form and the balanced replay."""
    from bokeh.models import ColumnDataSource

    theory = analysis.theory
    rows = [("measured", 100 * analysis.summary.bubble_ratio)]
    if analysis.balanced_replay_ratio is not None:
        rows.append(("balanced replay", 100 * analysis.balanced_replay_ratio))
    if theory is not None and theory.bubble_ratio is not None:
        rows.append(("theory", 100 * theory.bubble_ratio))
    colors = {"measured": "#4C78A8", "balanced replay": "#72B7B2", "theory": "#BAB0AC"}
    source = ColumnDataSource(
        {
            "what": [w for w, _ in rows],
            "bubble": [v for _, v in rows],
            "color": [colors[w] for w, _ in rows],
            "text": [f"{v:.1f}%" for _, v in rows],
        }
    )
    top = max(5.0, max(v for _, v in rows) * 1.15)
    fig = _figure(
        frame_width=300,
        frame_height=300,
        x_range=[w for w, _ in rows],
        y_range=(0, top),
        y_axis_label="bubble %",
        title="Bubble: idle share of the step window",
    )
    fig.xgrid.visible = False
    bars = fig.vbar(x="what", top="bubble", width=0.8, color="color", source=source)
    fig.text(
        x="what",
        y="bubble",
        text="text",
        source=source,
        text_align="center",
        text_baseline="bottom",
        text_font_size="11pt",
    )
    _hover(fig, bars, [("", "@what"), ("bubble", "@bubble{0.0}%")])
    fig.name = "bubble"
    return fig


# ---------------------------------------------------------------------------- replicas
# Heat map colours: bokeh's Viridis256, dark for a low bubble, bright yellow for a high one.
HEAT_PALETTE = "Viridis256"
# Height of the heat map in pixels: at least this much per rank while it fits, then shared.
HEAT_ROW_PX = 6
HEAT_MAX_PX = 900


def heatmap_root(analysis: Analysis, order: list[int]) -> LayoutDOM:
    """Bubble ratio per rank (rows, in ``order``) and step (columns), every rank: one image."""
    from bokeh.models import ColorBar, ColumnDataSource, CustomJSHover, FixedTicker, HoverTool, LinearColorMapper

    bubbles = analysis.bubbles
    grid = bubbles.pivot_table(index="rank", columns="step", values="bubble_ratio", aggfunc="first")
    grid = grid.reindex([r for r in order if r in grid.index])
    steps = [int(s) for s in grid.columns]
    n_ranks, n_steps = grid.shape
    image = (100 * grid.to_numpy(dtype=float)).astype(np.float32)  # NaN: a rank without that step
    mapper = LinearColorMapper(palette=HEAT_PALETTE, low=0.0, high=100.0, nan_color="#ffffff")
    fig = _figure(
        frame_width=min(max(240, 40 * n_steps), 1100),
        frame_height=int(min(max(HEAT_ROW_PX * n_ranks, 160), HEAT_MAX_PX)),
        x_range=(-0.5, n_steps - 0.5),
        y_range=(n_ranks - 0.5, -0.5),
        x_axis_label="step",
        y_axis_label="rank (by replica, then stage)",
        title=f"Bubble ratio per rank and step, all {n_ranks} ranks (%)",
    )
    # image[0][0] lies at (x, y) and rows go up in y; the y axis is flipped, so row i is rank order[i]
    source = ColumnDataSource({"image": [image], "x": [-0.5], "y": [-0.5], "dw": [n_steps], "dh": [n_ranks]})
    renderer = fig.image(image="image", x="x", y="y", dw="dw", dh="dh", source=source, color_mapper=mapper)
    every = max(1, int(np.ceil(n_steps / 12)))
    fig.xaxis.ticker = FixedTicker(ticks=list(range(0, n_steps, every)))
    fig.xaxis.major_label_overrides = {i: str(steps[i]) for i in range(0, n_steps, every)}
    label_every = max(1, int(np.ceil(n_ranks / max(1, fig.frame_height // 14))))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(0, n_ranks, label_every)))
    fig.yaxis.major_label_overrides = {i: str(int(grid.index[i])) for i in range(0, n_ranks, label_every)}
    pick = "const i = Math.round(value); return i >= 0 && i < names.length ? String(names[i]) : '';"
    fig.add_tools(
        HoverTool(
            renderers=[renderer],
            tooltips=[("rank", "$y{custom}"), ("step", "$x{custom}"), ("bubble", "@image{0.0}%")],
            formatters={
                "$y": CustomJSHover(args={"names": [int(r) for r in grid.index]}, code=pick),
                "$x": CustomJSHover(args={"names": steps}, code=pick),
            },
        )
    )
    fig.add_layout(ColorBar(color_mapper=mapper, title="bubble %", width=10), "right")
    fig.grid.visible = False
    fig.name = "heatmap"
    return fig


def spread_root(analysis: Analysis) -> LayoutDOM:
    """Per stage, each replica's rank as a dot: bubble ratio, and compute per step."""
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource, FixedTicker

    rollup = analysis.replicas
    assert rollup is not None and rollup.places  # drawn only for a replicated pipeline
    per_rank = analysis.summary.per_rank
    compute_ns = busy_per_step_ns(analysis)
    n = rollup.n_replicas
    columns: dict[str, list[Any]] = {"x": [], "bubble": [], "compute": [], "rank": [], "replica": [], "stage": []}
    for place in rollup.places:
        for i, rank in enumerate(place.ranks):
            # replicas spread across the stage's column so that equal values stay visible
            columns["x"].append(place.place + (0.7 * (i + 0.5) / n - 0.35))
            columns["bubble"].append(100 * per_rank[rank].bubble_ratio)
            columns["compute"].append(compute_ns[rank] / 1e6)
            columns["rank"].append(rank)
            columns["replica"].append(i)
            columns["stage"].append(",".join(map(str, place.stages)))
    source = ColumnDataSource(columns)
    ticks = [p.place for p in rollup.places]
    labels = {p.place: ",".join(map(str, p.stages)) for p in rollup.places}
    figures = []
    for field_name, label, title in (
        ("bubble", "bubble %", "Bubble ratio per stage, one dot per replica"),
        ("compute", "compute ms per step", "Compute per step per stage, one dot per replica"),
    ):
        fig = _figure(frame_width=520, frame_height=300, x_axis_label="stage", y_axis_label=label, title=title)
        dots = fig.scatter(x="x", y=field_name, source=source, size=5, alpha=0.6, color="#4C78A8")
        fig.xaxis.ticker = FixedTicker(ticks=ticks)
        fig.xaxis.major_label_overrides = labels
        fig.xgrid.visible = False
        _hover(
            fig,
            dots,
            [("rank", "@rank"), ("replica", "@replica"), ("stage", "@stage"), (label, f"@{field_name}{{0.0}}")],
        )
        figures.append(fig)
    root = row(*figures)
    root.name = "spread"
    return root


def place_causes_root(analysis: Analysis) -> LayoutDOM:
    """Per stage, mean over replicas: busy, then idle by cause (ms, all steps)."""

    rollup = analysis.replicas
    assert rollup is not None and rollup.places  # drawn only for a replicated pipeline
    places = place_means(analysis)
    attributed = any(p.causes_ns for p in places)
    parts = ["busy", *CATEGORIES] if attributed else ["busy", "idle"]
    n = rollup.n_replicas
    columns: dict[str, list[Any]] = {"stage": [], **{p: [] for p in parts}}
    for place in places:
        columns["stage"].append(",".join(map(str, place.stages)))
        columns["busy"].append(place.busy_ns / 1e6)
        if attributed:
            for cause in CATEGORIES:
                columns[cause].append(place.causes_ns[cause] / 1e6)
        else:
            columns["idle"].append(place.idle_ns / 1e6)
    fig = _figure(
        frame_width=min(max(160, 40 * len(rollup.places)), 1100),
        frame_height=300,
        x_range=columns["stage"],
        x_axis_label="stage",
        y_axis_label=f"ms (all steps, mean over {n} replicas)",
        title="Each stage's time: busy, then idle by cause",
    )
    fig.y_range.start = 0
    fig.xgrid.visible = False
    return _cause_bars(fig, columns, parts, "stage")
