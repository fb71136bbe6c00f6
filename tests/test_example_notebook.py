"""examples/tracekit.ipynb runs headless from top to bottom (nbclient, a real IPython kernel)
and shows what it promises: the inline summary of a run, the report's timeline drawn by
bokeh, a comparison, what-if rows and the exported tables. The notebook is committed without
outputs; each checked cell is found by its tag."""

from __future__ import annotations

import json

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

NOTEBOOK = ROOT / "examples" / "tracekit.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook after a run, and a map from each cell's tag to its outputs."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's tracekit
    try:
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        client = NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        )
        client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    finally:
        mp.undo()
    by_tag = {cell.metadata["tags"][0]: cell.outputs for cell in notebook.cells if cell.metadata.get("tags")}
    return notebook, by_tag


def _data(outputs, mime: str) -> list[str]:
    return [o["data"][mime] for o in outputs if mime in o.get("data", {})]


def test_the_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


def test_the_notebook_shows_the_inline_summary(executed):
    _, by_tag = executed
    (page,) = _data(by_tag["summary"], "text/html")
    assert "class='tracekit-analysis'" in page
    assert "1F1B p=4 v=1 m=8: bubble 44.8% measured" in page
    assert "Stage 2 (rank 2) is 1.9x slower than the others" in page  # the first finding
    assert page.count("<tr") == 1 + 4  # the per-rank table: a header and one row per rank
    (text,) = _data(by_tag["summary"], "text/plain")
    assert text.startswith("<tracekit analysis 'slow stage 2': 1F1B p=4 v=1 m=8") and "\n" not in text


def test_the_notebook_draws_the_reports_timeline(executed):
    _, by_tag = executed
    (embed,) = _data(by_tag["timeline"], "application/javascript")
    assert _data(by_tag["timeline"], "application/vnd.bokehjs_exec.v0+json")
    # the document bokeh embeds holds the report's timeline: one tab per step, named as in the report
    start = embed.index("const docs_json = ") + len("const docs_json = ")
    docs, _ = json.JSONDecoder().raw_decode(embed, start)
    (doc,) = docs.values()
    (root,) = doc["roots"]
    assert root["attributes"]["name"] == "timeline"
    assert [tab["attributes"]["title"] for tab in root["attributes"]["tabs"]] == ["step 2", "step 3", "step 4"]
    assert _data(by_tag["causes"], "application/vnd.bokehjs_exec.v0+json")


def test_the_notebook_compares_predicts_and_exports(executed):
    _, by_tag = executed
    (comparison,) = _data(by_tag["compare"], "text/html")
    assert "matters most: stage imbalance" in comparison
    (predictions,) = _data(by_tag["whatif"], "text/html")
    assert "Interleaved1F1B v=2 m=16" in predictions and "model of the measured run" in predictions
    (written,) = _data(by_tag["export"], "text/plain")
    assert "'idle_intervals.parquet'" in written
    (steps,) = _data(by_tag["concat"], "text/plain")
    assert "1f1b" in steps and "slow stage 2" in steps
