"""tracekit in a notebook: a run's analysis as pandas DataFrames and the report's own figures.

:func:`analysis` loads and analyses a run (as ``tracekit analyze`` does) and returns a
:class:`RunAnalysis`: every figure is a DataFrame with fixed, documented columns
(:data:`FRAMES` and :data:`tracekit.analyze.tabular.TABLES`), its ``repr`` is a few lines
and Jupyter shows it as a summary (headline, findings, per-rank table). ``.plot`` returns
the bokeh figures the HTML report draws. :func:`compare` says what changed between two
runs (``tracekit diff``), :func:`whatif` predicts other schedules and microbatch counts by
replay (``tracekit whatif``). ``tracekit.analysis``, ``tracekit.compare`` and
``tracekit.whatif`` are these functions.

>>> import tracekit
>>> slow = tracekit.analysis("sample_traces/1f1b_slow_stage2")
>>> print(slow.headline)
1F1B p=4 v=1 m=8: bubble 44.8% measured, 27.3% in theory, 27.3% in the balanced replay
>>> ranks = slow.ranks.set_index("rank")
>>> (ranks[["busy_ns", "idle_ns", "imbalance_ns"]] / 1e6).round(1)  # ms
      busy_ns  idle_ns  imbalance_ns
rank
0      1003.0   1205.4         768.9
1      1000.0   1208.4         772.0
2      1862.7    345.6           0.0
3      1012.6   1195.8         759.3

Times are integer nanoseconds (``*_ns``) as everywhere in tracekit; ratios are 0..1.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tracekit.analyze import Analysis, analyze
from tracekit.analyze.compare import Comparison, measure, schedule_label
from tracekit.analyze.grouping import int_groups
from tracekit.analyze.tabular import CAUSE_COLUMN_SPECS, TableSpec, tables, typed
from tracekit.errors import TracekitError
from tracekit.vocab import IDLE_CAUSES, pct

if TYPE_CHECKING:
    from tracekit.analyze.whatif import Prediction, WhatIf
    from tracekit.loading import LoadOptions
    from tracekit.model.run import Run

# Rows shown in the summary Jupyter draws (the DataFrames hold them all).
_HTML_RANKS = 16

# The frames RunAnalysis, RunComparison and WhatIfResult compute (the tables the export
# writes are tracekit.analyze.tabular.TABLES): each column's type and meaning, in order.
FRAMES: dict[str, TableSpec] = {
    "ranks": TableSpec(
        "One row per rank: its time over every measured step, idle split by cause (the causes "
        "add up to idle_ns where attributed; all 0 where not).",
        {
            "run_id": ("string", "the run (RunAnalysis.run_id)"),
            "rank": ("int64", "global rank"),
            "stages": ("string", "the pipeline stages it runs, comma-separated; empty without a pipeline"),
            "window_ns": ("int64", "its step windows summed, ns"),
            "busy_ns": ("int64", "its compute inside them, ns"),
            "idle_ns": ("int64", "window_ns - busy_ns"),
            "bubble_ratio": ("float64", "idle_ns / window_ns, 0..1"),
            **CAUSE_COLUMN_SPECS,
        },
    ),
    "steps": TableSpec(
        "One row per profiled step: the step's time and all ranks' busy and idle in it, idle split by cause.",
        {
            "run_id": ("string", "the run (RunAnalysis.run_id)"),
            "step": ("int64", "profiler step (ProfilerStep#N)"),
            "step_ns": ("int64", "the step window over all ranks: first compute start to last compute end, ns"),
            "window_ns": ("int64", "the ranks' windows summed, ns"),
            "busy_ns": ("int64", "the ranks' compute summed, ns"),
            "idle_ns": ("int64", "window_ns - busy_ns"),
            "bubble_ratio": ("float64", "idle_ns / window_ns, 0..1"),
            **CAUSE_COLUMN_SPECS,
        },
    ),
    "findings": TableSpec(
        "What is wrong and what to try, most important first (the console's 'what to try').",
        {
            "run_id": ("string", "the run (RunAnalysis.run_id)"),
            "severity": ("string", "high, medium, low or info"),
            "cause": ("string", "what the finding is about: imbalance, comm, overhead, fill_drain, ..."),
            "headline": ("string", "what is wrong, one sentence"),
            "advice": ("string", "what to try"),
            "cost_share": ("float64", "the device time it idles: its idle over all ranks' step windows, 0..1"),
        },
    ),
    "changes": TableSpec(
        "What changed from run A to run B (tracekit diff), per cause, rank, stage and link; "
        "largest change first within each scope.",
        {
            "scope": (
                "string",
                "cause (share of the step window), rank (bubble ratio), compute (ns per step), "
                "stage (imbalance ns per step) or link (comm ns per step)",
            ),
            "key": ("string", "what changed: comm, rank 2, stage 2 (rank 2), link 1->2"),
            "unit": ("string", "share (0..1 of the step window) or ns (per step)"),
            "a": ("float64", "the figure in run A"),
            "b": ("float64", "the figure in run B"),
            "delta": ("float64", "b - a"),
            "rank": ("int64", "the rank a rank, compute or stage row is about; -1 otherwise"),
        },
    ),
    "predictions": TableSpec(
        "One row per what-if prediction (tracekit whatif): the first row replays the measured "
        "order with the same draws (the model's own error), then each target.",
        {
            "run_id": ("string", "the run predicted from (RunAnalysis.run_id)"),
            "label": ("string", "what the row is: 'model of the measured run', 'Interleaved1F1B v=2 m=16', ..."),
            "schedule": ("string", "the schedule replayed"),
            "p": ("int64", "pipeline ranks"),
            "v": ("int64", "stages (chunks) per rank"),
            "m": ("int64", "microbatches per step"),
            "bubble_ratio": ("float64", "predicted idle over the step window, mean over the replays, 0..1"),
            "bubble_sd": ("float64", "its standard deviation over the replays"),
            "step_ns": ("int64", "predicted step time (first compute start to last compute end), mean, ns"),
            "step_sd_ns": ("int64", "its standard deviation, ns"),
            "step_change": ("float64", "step_ns over the measured step time, minus 1 (-0.06: 6% faster)"),
            "theory_bubble_ratio": ("float64", "the closed form (balanced, free messages); NaN where none"),
            "basis": ("string", "measured order or generated order"),
            "keep": ("string", "what m changes keep: global-batch or microbatch"),
        },
    ),
}


def analysis(
    source: str | PathLike[str] | Run,
    options: LoadOptions | None = None,
    *,
    attribution: bool = True,
    run_id: str | None = None,
) -> RunAnalysis:
    """Load a run (a folder of per-rank traces, or one trace file) and analyse it as
    ``tracekit analyze`` does.

    ``source``: the path, or a run :func:`tracekit.load` returned. ``options``: how to
    load it (:class:`tracekit.LoadOptions`). ``attribution=False`` skips the replays that
    split idle time by cause (the cause columns are then 0). ``run_id`` names the run in
    every frame's ``run_id`` column (default: the path as given). Bad input raises
    :class:`tracekit.errors.TracekitError` with the one line the command line prints.

    >>> import tracekit
    >>> a = tracekit.analysis("sample_traces/1f1b", run_id="baseline")
    >>> a
    <tracekit analysis 'baseline': 1F1B p=4 v=1 m=8, 4 ranks, 3 steps, bubble 30.4%, 4 findings>
    >>> a.findings[["severity", "cause"]]
      severity       cause
    0     high  fill_drain
    1      low        comm
    2      low    overhead
    3      low   imbalance
    """
    if isinstance(source, (str, PathLike)):
        from tracekit.loading import load

        run = load(source, options)
    else:
        run = source
    return RunAnalysis(analyze(run, attribution=attribution), run.source if run_id is None else run_id)


class RunAnalysis:
    """One run's analysis (:func:`analysis`), for a notebook: DataFrames, a summary, figures.

    ``.ranks``, ``.steps``, ``.findings`` (:data:`FRAMES`) and the tables of ``tracekit export
    --tables`` (``.actions``, ``.messages``, ``.bubbles``, ``.attribution``,
    ``.stage_blame``, ``.link_blame``, ``.idle_intervals``; on GPU runs the device tables
    too: :meth:`tables`) are DataFrames with fixed columns whatever the run. ``.result`` is
    the full :class:`tracekit.analyze.Analysis` the renderers read.

    >>> import tracekit
    >>> a = tracekit.analysis("sample_traces/1f1b_slow_stage2", run_id="slow")
    >>> idle = a.idle_intervals
    >>> (idle[idle["cause"] == "imbalance"].groupby("blamed_stage")["duration_ns"].sum() / 1e6).round(1)
    blamed_stage
    0      16.3
    1       8.0
    2    2271.2
    3       4.7
    Name: duration_ns, dtype: float64
    >>> round(a.steps["step_ns"].mean() / 1e6)  # ms per step
    736
    """

    def __init__(self, result: Analysis, run_id: str) -> None:
        self.result = result
        self.run_id = run_id
        self._tables: dict[str, pd.DataFrame] | None = None

    @property
    def run(self) -> Run:
        """The run as loaded: files, events, actions, messages, steps, schedule."""
        return self.result.run

    @property
    def headline(self) -> str:
        """The schedule and the bubble ratio measured, in theory and in the balanced replay.

        >>> import tracekit
        >>> tracekit.analysis("sample_traces/interleaved1f1b").headline
        'Interleaved1F1B p=4 v=2 m=8: bubble 23.6% measured, 15.8% in theory, 15.8% in the balanced replay'
        """
        result = self.result
        schedule = self.run.schedule
        parts = [f"bubble {pct(result.summary.bubble_ratio)} measured"]
        if result.theory is not None and result.theory.bubble_ratio is not None:
            parts.append(f"{pct(result.theory.bubble_ratio)} in theory")
        if result.balanced_replay_ratio is not None:
            parts.append(f"{pct(result.balanced_replay_ratio)} in the balanced replay")
        return f"{schedule_label(schedule.to_dict() if schedule else None)}: {', '.join(parts)}"

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables ``tracekit export --tables`` writes, by name (columns:
        :data:`tracekit.analyze.tabular.TABLES`), each with this run's ``run_id``.

        >>> import tracekit
        >>> list(tracekit.analysis("sample_traces/1f1b").tables())
        ['actions', 'messages', 'bubbles', 'attribution', 'stage_blame', 'link_blame', 'idle_intervals']
        """
        if self._tables is None:
            self._tables = tables(self.result, self.run_id)
        return dict(self._tables)

    @property
    def actions(self) -> pd.DataFrame:
        """One row per compute action (TABLES["actions"])."""
        return self.tables()["actions"]

    @property
    def messages(self) -> pd.DataFrame:
        """One row per matched point-to-point message (TABLES["messages"])."""
        return self.tables()["messages"]

    @property
    def bubbles(self) -> pd.DataFrame:
        """One row per rank and step: window, busy, idle, bubble ratio (TABLES["bubbles"])."""
        return self.tables()["bubbles"]

    @property
    def attribution(self) -> pd.DataFrame:
        """One row per rank and step: idle split by cause (TABLES["attribution"])."""
        return self.tables()["attribution"]

    @property
    def stage_blame(self) -> pd.DataFrame:
        """The stages charged with each rank's imbalance idle (TABLES["stage_blame"])."""
        return self.tables()["stage_blame"]

    @property
    def link_blame(self) -> pd.DataFrame:
        """The links charged with each rank's comm idle (TABLES["link_blame"])."""
        return self.tables()["link_blame"]

    @property
    def idle_intervals(self) -> pd.DataFrame:
        """Each idle interval with its cause and the stage or link blamed (TABLES["idle_intervals"])."""
        return self.tables()["idle_intervals"]

    @property
    def ranks(self) -> pd.DataFrame:
        """One row per rank, over every measured step (FRAMES["ranks"]).

        >>> import tracekit
        >>> ranks = tracekit.analysis("sample_traces/1f1b").ranks
        >>> ranks[["rank", "stages", "bubble_ratio"]].round(3)
           rank stages  bubble_ratio
        0     0      0         0.307
        1     1      1         0.302
        2     2      2         0.307
        3     3      3         0.298
        """
        result = self.result
        causes = self._causes_by(["rank"])
        schedule = self.run.schedule
        stages: dict[int, list[int]] = {}
        for stage, rank in sorted(schedule.stage_to_rank.items()) if schedule is not None else []:
            stages.setdefault(int(rank), []).append(int(stage))
        rows = [
            {
                "run_id": self.run_id,
                "rank": rank,
                "stages": ",".join(map(str, stages.get(rank, []))),
                "window_ns": info.window_ns,
                "busy_ns": info.busy_ns,
                "idle_ns": info.idle_ns,
                "bubble_ratio": info.bubble_ratio,
                **causes.get((rank,), dict.fromkeys(CAUSE_COLUMN_SPECS, 0)),
            }
            for rank, info in result.summary.per_rank.items()
        ]
        return typed(pd.DataFrame(rows), FRAMES["ranks"])

    @property
    def steps(self) -> pd.DataFrame:
        """One row per profiled step, all ranks together (FRAMES["steps"]).

        >>> import tracekit
        >>> from tracekit.notebook import CAUSE_COLUMNS
        >>> steps = tracekit.analysis("sample_traces/1f1b").steps
        >>> bool((steps[list(CAUSE_COLUMNS)].sum(axis=1) == steps["idle_ns"]).all())
        True
        """
        bubbles = self.result.bubbles
        causes = self._causes_by(["step"])
        rows = []
        for (step,), window in int_groups(bubbles, ["step"]):
            idle, width = int(window["idle_ns"].sum()), int(window["window_ns"].sum())
            rows.append(
                {
                    "run_id": self.run_id,
                    "step": step,
                    "step_ns": int(window["window_end_ns"].max()) - int(window["window_start_ns"].min()),
                    "window_ns": width,
                    "busy_ns": int(window["busy_ns"].sum()),
                    "idle_ns": idle,
                    "bubble_ratio": idle / width if width else 0.0,
                    **causes.get((step,), dict.fromkeys(CAUSE_COLUMN_SPECS, 0)),
                }
            )
        return typed(pd.DataFrame(rows), FRAMES["steps"])

    @property
    def findings(self) -> pd.DataFrame:
        """What is wrong and what to try, most important first (FRAMES["findings"]).

        >>> import tracekit
        >>> top = tracekit.analysis("sample_traces/1f1b_slow_stage2").findings.iloc[0]
        >>> top["severity"], top["cause"]
        ('high', 'imbalance')
        """
        rows = [
            {
                "run_id": self.run_id,
                "severity": f.severity,
                "cause": f.cause,
                "headline": f.headline,
                "advice": f.advice,
                "cost_share": f.cost_share,
            }
            for f in self.result.findings
        ]
        return typed(pd.DataFrame(rows), FRAMES["findings"])

    def _causes_by(self, keys: list[str]) -> dict[tuple[int, ...], dict[str, int]]:
        """The attribution's cause columns summed per ``keys`` (rank or step)."""
        attributed = self.result.attribution
        if attributed is None or attributed.table.empty:
            return {}
        return {
            key: {column: int(group[column].sum()) for column in CAUSE_COLUMN_SPECS}
            for key, group in int_groups(attributed.table, keys)
        }

    @property
    def plot(self) -> Plots:
        """The report's figures (:class:`Plots`)."""
        return Plots(self.result)

    def text(self) -> str:
        """What ``tracekit analyze`` prints for this run.

        >>> import tracekit
        >>> print(tracekit.analysis("sample_traces/1f1b").text().splitlines()[0])
        tracekit 0.1.0: sample_traces/1f1b
        """
        from tracekit.render.json import to_document
        from tracekit.render.protocol import RENDERERS, text_of

        return text_of(RENDERERS["console"]().render(to_document(self.result)))

    def export(self, folder: str | PathLike[str], csv: bool = False) -> list[Path]:
        """Write :meth:`tables` into ``folder`` as Parquet (and CSV), as ``tracekit export
        --tables`` does (never into the run's own folder); returns the files written.

        >>> import tracekit, tempfile
        >>> out = tempfile.mkdtemp()
        >>> [p.name for p in tracekit.analysis("sample_traces/1f1b").export(out)][:2]
        ['actions.parquet', 'messages.parquet']
        """
        from tracekit.commands.export import table_targets, write_tables

        where, run_dir = Path(folder), Path(self.run.source)
        targets = table_targets(where, run_dir, csv)
        written = write_tables(self.result, where, targets, csv, self.run_id, self.tables())
        return [where / name for name in written]

    def report(self, path: str | PathLike[str]) -> Path:
        """Write the HTML report (``tracekit report``) to ``path``, with its what-if table;
        returns the path.

        >>> import tracekit, tempfile, os
        >>> page = tracekit.analysis("sample_traces/1f1b").report(os.path.join(tempfile.mkdtemp(), "r.html"))
        >>> "Each rank's time: busy, then idle by cause" in page.read_text()
        True
        """
        from tracekit.commands.outputs import run_output
        from tracekit.render.html import render_report

        result = self.result
        if result.whatif is None and result.is_pipeline and result.attribution is not None:
            from tracekit.analyze.report_whatif import report_what_if

            graphs = list(result.attribution.graphs.values())
            result = replace(result, whatif=report_what_if(self.run, graphs, result.bubbles))
        target = run_output(Path(path), "report", Path(self.run.source))
        target.write(render_report(result).encode())
        return Path(path)

    def __repr__(self) -> str:
        schedule = self.run.schedule
        n_steps = int(self.result.bubbles["step"].nunique()) if len(self.result.bubbles) else 0
        n_findings = len(self.result.findings)
        return (
            f"<tracekit analysis {self.run_id!r}: {schedule_label(schedule.to_dict() if schedule else None)}, "
            f"{self.result.summary.n_ranks} ranks, {n_steps} steps, bubble {pct(self.result.summary.bubble_ratio)}, "
            f"{n_findings} finding{'' if n_findings == 1 else 's'}>"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view: the headline, the findings and the per-rank table."""
        findings = "".join(
            f"<li><b>[{html.escape(f.severity)}]</b> {html.escape(f.headline)}<br>"
            f"<span style='color:#555'>{html.escape(f.advice)}</span></li>"
            for f in self.result.findings
        )
        ranks = self.ranks
        shown = ranks.nlargest(_HTML_RANKS, "bubble_ratio").sort_values("rank") if len(ranks) > _HTML_RANKS else ranks
        table = pd.DataFrame(
            {
                "rank": shown["rank"],
                "busy ms": shown["busy_ns"] / 1e6,
                "idle ms": shown["idle_ns"] / 1e6,
                "bubble": shown["bubble_ratio"].map(pct),
                **{c.legend + " ms": shown[c.column] / 1e6 for c in IDLE_CAUSES},
            }
        )
        note = f"<p>the {_HTML_RANKS} ranks of {len(ranks)} that idle most</p>" if len(ranks) > _HTML_RANKS else ""
        return (
            f"<div class='tracekit-analysis'><p><b>tracekit: {html.escape(self.run_id)}</b><br>"
            f"{html.escape(self.headline)}</p><ul>{findings}</ul>{note}"
            f"{table.to_html(index=False, float_format=lambda x: f'{x:.1f}')}</div>"
        )


CAUSE_COLUMNS = tuple(CAUSE_COLUMN_SPECS)  # the idle causes' columns of ranks and steps, in order


@dataclass(frozen=True)
class Plots:
    """The HTML report's figures as bokeh objects. In Jupyter, call bokeh's
    ``output_notebook()`` once, then ``show(a.plot.timeline())``."""

    result: Analysis

    def timeline(self, step: int | None = None) -> Any:
        """The report's timeline: one tab per step drawn, every rank's actions, messages and
        idle time shaded by cause. ``step``: open on that step's tab.

        >>> import tracekit
        >>> fig = tracekit.analysis("sample_traces/1f1b").plot.timeline(step=3)
        >>> fig.name, fig.active
        ('timeline', 1)
        """
        from tracekit.render.html import report_timeline

        root, _ = report_timeline(self.result)
        if root is None:
            raise TracekitError(f"{self.result.run.source}: no step to draw")
        if step is not None:
            tabs = _tabs_of(root)
            titles = [panel.title for panel in tabs.tabs] if tabs is not None else []
            wanted = f"step {step}"
            if tabs is None or wanted not in titles:
                drawn = ", ".join(t.removeprefix("step ") for t in titles) or "one step"
                raise TracekitError(f"step {step}: not drawn; the timeline draws step(s) {drawn}")
            tabs.active = titles.index(wanted)
        return root

    def causes(self) -> Any:
        """The report's causes chart: each rank's time, busy then idle by cause.

        >>> import tracekit
        >>> tracekit.analysis("sample_traces/1f1b").plot.causes().name
        'causes'
        """
        from tracekit.render.html import report_causes

        return report_causes(self.result)

    def heatmap(self) -> Any:
        """The bubble ratio per rank (rows) and step (columns), as the report draws it for
        data-parallel runs.

        >>> import tracekit
        >>> tracekit.analysis("sample_traces/1f1b").plot.heatmap().name
        'heatmap'
        """
        from tracekit.render.html import heatmap_order
        from tracekit.render.html.charts import heatmap_root

        return heatmap_root(self.result, heatmap_order(self.result))

    def bubble(self) -> Any:
        """The report's bar chart: the bubble measured, in the balanced replay and in theory.

        >>> import tracekit
        >>> tracekit.analysis("sample_traces/1f1b").plot.bubble().name
        'bubble'
        """
        from tracekit.render.html.charts import bubble_root

        return bubble_root(self.result)


def _tabs_of(root: Any) -> Any:
    """The Tabs of the report's timeline (the root itself, or under the replica menu), or None."""
    from bokeh.models import Tabs

    if isinstance(root, Tabs):
        return root
    return next((child for child in getattr(root, "children", []) if isinstance(child, Tabs)), None)


class RunComparison:
    """What changed from run A to run B (:func:`compare`): ``.headline``, ``.changes``
    (FRAMES["changes"]) and ``.comparison``, the :class:`tracekit.analyze.compare.Comparison`.

    >>> import tracekit
    >>> d = tracekit.compare(tracekit.analysis("sample_traces/1f1b"), tracekit.analysis("sample_traces/1f1b_p2p_delay5ms"))
    >>> d.changes.query("scope == 'cause'")[["key", "a", "b"]].round(3).head(2)
          key      a      b
    0    comm  0.017  0.176
    1  warmup  0.130  0.107
    """

    def __init__(self, comparison: Comparison, a_id: str, b_id: str) -> None:
        self.comparison = comparison
        self.a_id, self.b_id = a_id, b_id

    @property
    def headline(self) -> str:
        """The change that matters most, in one line (``tracekit diff``'s first line)."""
        return self.comparison.headline()

    @property
    def changes(self) -> pd.DataFrame:
        """Every change, per cause, rank, compute, stage and link (FRAMES["changes"]).

        >>> import tracekit
        >>> d = tracekit.compare(tracekit.analysis("sample_traces/1f1b"), tracekit.analysis("sample_traces/1f1b_slow_stage2"))
        >>> d.changes.iloc[0][["scope", "key"]].tolist()
        ['cause', 'imbalance']
        """
        c = self.comparison
        rows = [
            {**change.to_dict(), "rank": -1 if change.rank is None else change.rank}
            for change in (*c.causes, *c.ranks, *c.compute, *c.stages, *c.links)
        ]
        return typed(pd.DataFrame(rows), FRAMES["changes"])

    def __repr__(self) -> str:
        return f"<tracekit comparison {self.a_id!r} -> {self.b_id!r}: {self.headline}>"

    def _repr_html_(self) -> str:
        c = self.comparison
        causes = self.changes[lambda f: f["scope"] == "cause"]
        table = pd.DataFrame(
            {
                "cause": causes["key"],
                "A": causes["a"].map(pct),
                "B": causes["b"].map(pct),
                "change (points)": (100 * causes["delta"]).round(1),
            }
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in (*c.incomplete(), *c.notes))
        return (
            f"<div class='tracekit-comparison'><p><b>tracekit: {html.escape(self.a_id)} &rarr; "
            f"{html.escape(self.b_id)}</b><br>{html.escape(self.headline)}<br>bubble ratio "
            f"{pct(c.a.bubble_ratio)} &rarr; {pct(c.b.bubble_ratio)}</p><ul>{notes}</ul>"
            f"{table.to_html(index=False)}</div>"
        )


def compare(a: RunAnalysis, b: RunAnalysis) -> RunComparison:
    """What changed from run ``a`` to run ``b``, as ``tracekit diff`` says it: per cause
    (share of the step window), per rank, per stage and link, largest change first.

    >>> import tracekit
    >>> d = tracekit.compare(tracekit.analysis("sample_traces/1f1b"), tracekit.analysis("sample_traces/1f1b_slow_stage2"))
    >>> print(d.headline)  # doctest: +ELLIPSIS
    matters most: stage imbalance +25.0 points of the step window (1.0% -> 26.0%); stage 2 (rank 2) computes 292.4 ms/step more...
    """
    from tracekit.analyze.compare import compare as comparison

    return RunComparison(comparison(measure(a.result), measure(b.result)), a.run_id, b.run_id)


class WhatIfResult:
    """Predictions for other schedules, v and m (:func:`whatif`): ``.predictions``
    (FRAMES["predictions"]), ``.best`` (the fastest row) and ``.whatif``, the
    :class:`tracekit.analyze.whatif.WhatIf` that ``tracekit whatif --json`` prints.

    >>> import tracekit
    >>> w = tracekit.whatif(tracekit.analysis("sample_traces/1f1b_slow_stage2"), ["1F1B"], m=[16, 32])
    >>> w.best.label, bool(w.predictions["step_change"].iloc[1:].lt(0).all())
    ('1F1B v=1 m=16', False)
    """

    def __init__(self, whatif: WhatIf, run_id: str) -> None:
        self.whatif = whatif
        self.run_id = run_id

    @property
    def predictions(self) -> pd.DataFrame:
        """The model of the measured run, then each prediction (FRAMES["predictions"])."""
        w = self.whatif
        rows = [
            {
                "run_id": self.run_id,
                **p.to_dict(),
                "step_change": p.step_ns / w.measured_step_ns - 1 if w.measured_step_ns else 0.0,
                "theory_bubble_ratio": np.nan if p.theory is None else p.theory,
            }
            for p in (w.as_measured, *w.predictions)
        ]
        return typed(pd.DataFrame(rows), FRAMES["predictions"])

    @property
    def best(self) -> Prediction | None:
        """The fastest prediction a user could run (not an ideal-balance bound), or None."""
        from tracekit.analyze.whatif import fastest

        return fastest(self.whatif.predictions, self.whatif.keep)

    def text(self) -> str:
        """What ``tracekit whatif`` prints.

        >>> import tracekit
        >>> w = tracekit.whatif(tracekit.analysis("sample_traces/1f1b"), ["1F1B"], m=[16])
        >>> "1F1B v=1 m=16" in w.text()
        True
        """
        from tracekit.render.whatif import render

        return render(self.whatif)

    def __repr__(self) -> str:
        best = self.best
        said = f"fastest {best.label} at {best.step_ns / 1e6:.1f} ms/step" if best else "nothing replayed faster"
        return (
            f"<tracekit what-if {self.run_id!r}: {len(self.whatif.predictions)} predictions, {said} "
            f"(measured {self.whatif.measured_step_ns / 1e6:.1f} ms/step)>"
        )

    def _repr_html_(self) -> str:
        rows = self.predictions
        table = pd.DataFrame(
            {
                "": rows["label"],
                "bubble": rows["bubble_ratio"].map(pct),
                "step ms": (rows["step_ns"] / 1e6).round(1),
                "step change": rows["step_change"].map(lambda x: f"{100 * x:+.1f}%"),
                "theory": rows["theory_bubble_ratio"].map(lambda x: "" if np.isnan(x) else pct(x)),
            }
        )
        return (
            f"<div class='tracekit-whatif'><p><b>tracekit what-if: {html.escape(self.run_id)}</b> "
            f"(measured {self.whatif.measured_step_ns / 1e6:.1f} ms/step, bubble "
            f"{pct(self.whatif.measured_bubble)})</p>{table.to_html(index=False)}</div>"
        )


def whatif(
    run: RunAnalysis,
    schedules: Sequence[str] = (),
    v: Sequence[int] = (),
    m: Sequence[int] = (),
    *,
    keep: str = "global-batch",
    replays: int = 32,
    seed: int = 0,
) -> WhatIfResult:
    """Predict the run under other schedules, chunks per rank ``v`` and microbatch counts
    ``m`` by replaying its measured costs, as ``tracekit whatif -s ... -v ... -m ...`` does
    (nothing given: its default targets). ``keep``: ``global-batch`` or ``microbatch``.

    >>> import tracekit
    >>> w = tracekit.whatif(tracekit.analysis("sample_traces/1f1b"), ["1F1B", "Interleaved1F1B"], v=[2], m=[16])
    >>> w.predictions[["label", "m"]]
                           label   m
    0  model of the measured run   8
    1              1F1B v=1 m=16  16
    2   Interleaved1F1B v=2 m=16  16
    """
    from tracekit.analyze.costs import cost_model
    from tracekit.analyze.whatif import ALL_TARGETS, KEEPS, requested_targets, what_if

    if keep not in KEEPS:
        raise TracekitError(f"keep={keep!r}: expected one of {', '.join(KEEPS)}")
    unknown = [s for s in schedules if s not in ALL_TARGETS]
    if unknown:
        raise TracekitError(f"schedule {unknown[0]!r}: what-if generates {', '.join(ALL_TARGETS)}")
    if not run.result.is_pipeline:
        raise TracekitError(f"{run.run.source}: no pipeline found, so there is no schedule to change")
    model = cost_model(run.run)
    targets = requested_targets(model, tuple(schedules), tuple(v), tuple(m)) if schedules or v or m else None
    result = what_if(run.run, targets, keep=keep, samples=replays, seed=seed, model=model)
    return WhatIfResult(result, run.run_id)


__all__ = [
    "FRAMES",
    "CAUSE_COLUMNS",
    "Plots",
    "RunAnalysis",
    "RunComparison",
    "WhatIfResult",
    "analysis",
    "compare",
    "whatif",
]
