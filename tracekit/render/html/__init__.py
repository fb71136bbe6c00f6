"""The HTML report: one self-contained file (bokeh's JavaScript inlined, nothing fetched)
that shows where a run sat idle and why, for a browser with no network.

Sections: the diagnosis (:func:`tracekit.analyze.diagnosis.diagnose`), an interactive
timeline per step (with data-parallel replicas: of the few replicas the roll-up picks, one
tab each, the slowest first, plus a heat map of every rank's bubble per step and each
stage's spread over the replicas, so the page grows per rank, not per event) (one row per rank, and per GPU stream where the trace has kernels; compute
actions coloured by kind, P2P messages from send to arrival, idle time shaded by cause, the
critical path drawn through it), per-rank busy and idle by cause, measured against
theoretical bubble, blame tables per stage and per link, and the run's metadata.

Figures are made with bokeh and embedded statically with its inline resources (one tab per
step), so the file works offline without a server and fetches nothing. Large runs are thinned before drawing:
at most ``MAX_BARS`` bars, ``MAX_IDLE`` idle spans and ``MAX_MESSAGES`` messages per step,
and ``MAX_DETAILED_STEPS`` steps; the report says where it did so. A thinned step keeps its
bars at full resolution too (up to ``MAX_DETAIL_BARS``), drawn in place of the merged ones
once the zoomed view holds at most ``MAX_BARS`` of them.

Every string that comes from a trace (labels, file names, hosts, warnings, capture.json)
reaches the page escaped: the page template autoescapes, bokeh escapes its JSON data, and
hover tooltips insert values as text. Controls and bidi overrides in those strings (which
a browser would show as nothing, or use to draw the text after them reversed) are shown as
visible escapes (:func:`tracekit.text.for_xml`), on the page and in the timeline's labels.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import jinja2

from tracekit.analyze import Analysis
from tracekit.model.run import rank_ranges
from tracekit.render.html.charts import (
    bubble_root,
    causes_root,
    heatmap_root,
    place_causes_root,
    spread_root,
    timeline_root,
)
from tracekit.render.html.page import page_context
from tracekit.render.html.views import step_views, thinning_notes
from tracekit.text import for_xml

if TYPE_CHECKING:
    from bokeh.models import LayoutDOM
    from markupsafe import Markup

# The page: a Jinja template shipped as package data beside the renderers.
TEMPLATE = "report.html.j2"


def render_report(analysis: Analysis) -> str:
    """The report as one HTML document."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    replicated = _replicated(analysis)
    timeline, notes = report_timeline(analysis)
    causes = report_causes(analysis)
    extra = [heatmap_root(analysis, heatmap_order(analysis)), spread_root(analysis)] if replicated else []
    bubble = bubble_root(analysis) if analysis.is_pipeline else None
    roots = [r for r in (timeline, causes, bubble, *extra) if r is not None]
    context = page_context(analysis, notes)
    context["has_timeline"] = timeline is not None
    context["has_bubble"] = bubble is not None
    context["has_replicas"] = replicated
    page: str = file_html(
        roots,
        resources=INLINE,
        title=f"tracekit report: {analysis.run.source}",
        template=_page_template(),
        template_variables=context,
    )
    return page


def _replicated(analysis: Analysis) -> bool:
    rollup = analysis.replicas
    return analysis.is_pipeline and rollup is not None and rollup.n_replicas > 1 and bool(rollup.places)


def report_timeline(analysis: Analysis) -> tuple[Any, list[str]]:
    """The report's timeline (a bokeh layout, one tab per step drawn; None where there is
    nothing to draw) and the notes on what it left out. With data-parallel replicas: the
    replicas the roll-up picked, one shown at a time (the slowest first, another picked in
    the page)."""
    if not _replicated(analysis):
        views, step_notes = step_views(analysis)
        return timeline_root(views), step_notes + thinning_notes(views)
    rollup = analysis.replicas
    assert rollup is not None  # only for a replicated run
    groups: list[tuple[str, list[int]]] = []
    for replica, why in rollup.timeline_replicas:
        ranks = rollup.replicas[replica]
        idle = 100 * rollup.replica_bubble[replica]
        groups.append((f"replica {replica} (ranks {rank_ranges(ranks)}; {why}; {idle:.1f}% idle)", ranks))
    views, step_notes = step_views(analysis, groups)
    kept = ", ".join(str(r) for r, _ in rollup.timeline_replicas)
    notes = [
        f"Timeline: {len(groups)} of {rollup.n_replicas} data-parallel replicas kept (replicas {kept}; pick one "
        "above the timeline, the slowest is shown first); every rank is in the heat map and the per-stage "
        "distributions.",
        *step_notes,
        *thinning_notes(views),
    ]
    return timeline_root(views), notes


def report_causes(analysis: Analysis) -> Any:
    """The report's causes chart: per rank busy, then idle by cause; with data-parallel
    replicas per stage, the mean over the replicas."""
    return place_causes_root(analysis) if _replicated(analysis) else causes_root(analysis)


def heatmap_order(analysis: Analysis) -> list[int]:
    """The rows of the bubble heat map (:func:`~tracekit.render.html.charts.heatmap_root`):
    by replica, then stage, where the run has data-parallel replicas; else by rank."""
    rollup = analysis.replicas
    if _replicated(analysis):
        assert rollup is not None
        return [r for group in rollup.replicas for r in group]
    return sorted(int(r) for r in analysis.bubbles["rank"].unique())


_ROOT_DIV = '<div id="{}" data-root-id="{}" style="display: contents;"></div>'


def _visible_controls(value: object) -> object:
    """Each value the page shows, with controls as visible escapes (markup is bokeh's own)."""
    return for_xml(value) if isinstance(value, str) and not hasattr(value, "__html__") else value


# A Markdown code span, as the plain-text outputs write a name (`FSDP::post_forward` x4): a
# run of backticks, then the text up to a run of as many (CommonMark's rule).
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def with_code_spans(text: str) -> Markup:
    """``text`` for the page, escaped, its Markdown code spans shown as ``<code>`` (the
    backticks dropped) rather than as literal backticks; controls as visible escapes."""
    from markupsafe import Markup, escape

    parts, at = [], 0
    for span in _CODE_SPAN.finditer(text):
        code = span.group(2)
        if code.startswith(" ") and code.endswith(" ") and code.strip():
            code = code[1:-1]  # CommonMark drops one space each side, there to hold a backtick off the fence
        parts += [escape(for_xml(text[at : span.start()])), Markup("<code>{}</code>").format(for_xml(code))]
        at = span.end()
    parts.append(escape(for_xml(text[at:])))
    return Markup("").join(parts)


def _page_template() -> jinja2.Template:
    """The page, autoescaped: only bokeh's own output is marked safe."""
    from markupsafe import Markup, escape

    env = jinja2.Environment(
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        finalize=_visible_controls,
    )
    env.filters["code_spans"] = with_code_spans
    env.globals["root_div"] = lambda root: Markup(_ROOT_DIV.format(escape(root.elementid), escape(root.id)))
    return env.from_string(files("tracekit.render").joinpath("templates", TEMPLATE).read_text(encoding="utf-8"))
