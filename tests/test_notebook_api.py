"""The notebook API (tracekit.analysis, compare, whatif): its frames carry the analysis's own
figures with the documented columns, its summaries are short and escaped, and its plots are
the report's figures. Runs: the captured sample runs (sample_traces/)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import tracekit
from conftest import SAMPLES
from tracekit.analyze.tabular import step_scalars
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.notebook import CAUSE_COLUMNS, FRAMES, RunAnalysis
from tracekit.render.json import to_document

SLOW_STAGE2 = SAMPLES / "1f1b_slow_stage2"
PLAIN = SAMPLES / "1f1b"
PANDAS_DTYPES = {"int64": "int64", "Int64": "Int64", "float64": "float64", "string": "string"}


@pytest.fixture
def slow(loaded_runs) -> RunAnalysis:
    return RunAnalysis(loaded_runs(SLOW_STAGE2)[1], "slow")


def _check_columns(frame: pd.DataFrame, name: str) -> None:
    spec = FRAMES[name]
    assert list(frame.columns) == list(spec.columns), name
    for column, (dtype, doc) in spec.columns.items():
        assert str(frame[column].dtype) == PANDAS_DTYPES[dtype], (name, column)
        assert doc


def test_the_frames_carry_the_reports_figures(slow):
    doc = to_document(slow.result)
    ranks, steps, findings = slow.ranks, slow.steps, slow.findings
    for frame, name in ((ranks, "ranks"), (steps, "steps"), (findings, "findings")):
        _check_columns(frame, name)
        assert (frame["run_id"] == "slow").all()
    assert {r["rank"]: (r["busy_ns"], r["idle_ns"]) for r in doc["ranks"]} == {
        int(r.rank): (int(r.busy_ns), int(r.idle_ns)) for r in ranks.itertuples()
    }
    assert {r["rank"]: r["causes"] for r in doc["ranks"]} == {
        int(r["rank"]): {c: int(r[c]) for c in CAUSE_COLUMNS} for _, r in ranks.iterrows()
    }
    assert ranks["stages"].tolist() == ["0", "1", "2", "3"]
    # per step: all ranks' idle, split by cause exactly; the step time and bubble as TensorBoard gets them
    assert (steps[list(CAUSE_COLUMNS)].sum(axis=1) == steps["idle_ns"]).all()
    assert steps["idle_ns"].sum() == ranks["idle_ns"].sum() == slow.bubbles["idle_ns"].sum()
    scalars = step_scalars(slow.result).set_index(["step", "tag"])["value"]
    for row in steps.itertuples():
        assert row.step_ns / 1e6 == pytest.approx(scalars[(row.step, "pipeline/step_ms")])
        assert row.bubble_ratio == pytest.approx(scalars[(row.step, "pipeline/bubble_ratio")])
    assert findings[["severity", "headline", "advice"]].to_dict("records") == [
        {"severity": f["severity"], "headline": f["headline"], "advice": f["advice"]} for f in doc["findings"]
    ]


def test_the_summary_is_short_and_escaped(slow, monkeypatch):
    text = repr(slow)
    assert text == "<tracekit analysis 'slow': 1F1B p=4 v=1 m=8, 4 ranks, 3 steps, bubble 44.8%, 4 findings>"
    assert len(repr(slow.result)) > 10_000  # what a notebook showed before: the whole dataclass
    page = slow._repr_html_()
    assert slow.headline in page and page.count("<li>") == len(slow.result.findings)
    hostile = RunAnalysis(slow.result, "<script>alert(1)</script>")
    assert "<script>" not in hostile._repr_html_() and "&lt;script&gt;" in hostile._repr_html_()
    # a large run shows the ranks that idle most, and says so
    monkeypatch.setattr("tracekit.notebook._HTML_RANKS", 2)
    few = slow._repr_html_()
    assert "the 2 ranks of 4 that idle most" in few and few.count("<tr") == 1 + 2
    assert "<td>2</td>" not in few  # rank 2, the slow stage, idles least


def test_the_plots_are_the_reports_figures(slow):
    from bokeh.models import Tabs

    from tracekit.render.html import render_report, report_timeline

    timeline = slow.plot.timeline()
    assert isinstance(timeline, Tabs) and timeline.name == "timeline"
    drawn, _ = report_timeline(slow.result)
    assert [t.title for t in timeline.tabs] == [t.title for t in drawn.tabs] == ["step 2", "step 3", "step 4"]
    assert [len(t.child.renderers) for t in timeline.tabs] == [len(t.child.renderers) for t in drawn.tabs]
    assert slow.plot.timeline(step=4).active == 2
    with pytest.raises(TracekitError, match=r"^step 9: not drawn; the timeline draws step\(s\) 2, 3, 4$"):
        slow.plot.timeline(step=9)
    assert slow.plot.causes().name == "causes"
    heat = slow.plot.heatmap()
    image = heat.renderers[0].data_source.data["image"][0]
    grid = slow.bubbles.pivot_table(index="rank", columns="step", values="bubble_ratio")
    assert image.shape == grid.shape and abs(image - 100 * grid.to_numpy()).max() < 1e-3
    page = render_report(slow.result)
    assert all(f'"name":"{name}"' in page for name in ("timeline", "causes", "bubble"))


def test_compare_says_what_tracekit_diff_says(loaded_runs, monkeypatch):
    monkeypatch.setattr(
        "tracekit.commands.diff.load_with_progress", lambda path, *_: loaded_runs(Path(path))[0]
    )  # the command's loading is tested elsewhere
    a, b = RunAnalysis(loaded_runs(PLAIN)[1], "a"), RunAnalysis(loaded_runs(SLOW_STAGE2)[1], "b")
    diff = tracekit.compare(a, b)
    doc = json.loads(CliRunner().invoke(main, ["diff", str(PLAIN), str(SLOW_STAGE2), "--json"]).stdout)
    assert diff.headline == doc["headline"]
    changes = diff.changes
    _check_columns(changes, "changes")
    for listed, scope in (("causes", "cause"), ("ranks", "rank"), ("stages", "stage"), ("links", "link")):
        rows = changes[changes["scope"] == scope]
        assert rows[["key", "a", "b"]].round(6).values.tolist() == [[c["key"], c["a"], c["b"]] for c in doc[listed]]
    assert repr(diff).startswith("<tracekit comparison 'a' -> 'b': matters most: stage imbalance")
    assert "&rarr;" in diff._repr_html_()


def test_whatif_predicts_what_tracekit_whatif_does(slow, loaded_runs, monkeypatch):
    monkeypatch.setattr(
        "tracekit.commands.whatif.load_with_progress", lambda path, *_, **__: loaded_runs(Path(path))[0]
    )
    w = tracekit.whatif(slow, ["1F1B", "Interleaved1F1B"], v=[2], m=[16], replays=8)
    args = ["whatif", str(SLOW_STAGE2), "-s", "1F1B", "-s", "Interleaved1F1B", "-v", "2", "-m", "16", "--replays", "8"]
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    rows = w.predictions
    _check_columns(rows, "predictions")
    expected = [doc["model_of_measured"], *doc["predictions"]]
    assert rows[["label", "m", "step_ns"]].values.tolist() == [[p["label"], p["m"], p["step_ns"]] for p in expected]
    measured = doc["measured"]["step_ns"]
    assert rows["step_change"].tolist() == pytest.approx([p["step_ns"] / measured - 1 for p in expected], abs=1e-6)
    assert w.best is not None and w.best.label in rows["label"].tolist()[1:]
    for bad, message in (
        ({"schedules": ["2F2B"]}, "schedule '2F2B': what-if generates "),
        ({"keep": "batch"}, "keep='batch': expected one of global-batch, microbatch"),
    ):
        with pytest.raises(TracekitError, match=message):
            tracekit.whatif(slow, **bad)


def test_export_writes_the_tables_and_never_into_the_run(slow, tmp_path):
    written = slow.export(tmp_path / "tables", csv=True)
    assert sorted(p.name for p in written) == sorted(
        f"{name}.{ext}" for name in slow.tables() for ext in ("parquet", "csv")
    )
    for name, frame in slow.tables().items():
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tables" / f"{name}.parquet"), frame)
    with pytest.raises(TracekitError, match="lies inside the run folder"):
        slow.export(SLOW_STAGE2 / "tables")
    assert not (SLOW_STAGE2 / "tables").exists()


def test_analysis_takes_a_path_or_a_loaded_run_and_refuses_bad_input(loaded_runs, tmp_path):
    run, result = loaded_runs(PLAIN)
    from_run = tracekit.analysis(run, run_id="plain")
    assert from_run.run is run and from_run.run_id == "plain"
    assert from_run.ranks.drop(columns="run_id").equals(RunAnalysis(result, "x").ranks.drop(columns="run_id"))
    with pytest.raises(TracekitError):
        tracekit.analysis(tmp_path / "no such run")
