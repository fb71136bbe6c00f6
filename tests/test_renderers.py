"""Every renderer is one :class:`tracekit.render.protocol.Renderer`: a name, what it reads,
and one ``render`` that formats every sample's analysis without error."""

from __future__ import annotations

import pytest

from conftest import sample_runs
from tracekit.analyze.compare import measure
from tracekit.analyze.tabular import step_scalars, tables
from tracekit.gate import evaluate
from tracekit.gate.config import CheckConfig, Limit
from tracekit.render.json import to_document
from tracekit.render.protocol import RENDERERS, NamedTable, Renderer

SUBJECTS = ("document", "gate", "analysis", "table", "scalars")


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_each_renderer_satisfies_the_protocol(name):
    renderer = RENDERERS[name]()
    assert isinstance(renderer, Renderer)
    assert renderer.name == name
    assert renderer.reads in SUBJECTS


def _subjects(analysis) -> dict[str, list]:
    """What each kind of renderer reads, of one analysis."""
    config = CheckConfig(max_bubble=Limit(0.99, "--max-bubble"), allow_incomplete=True)
    run_meta = {"source": analysis.run.source, "timeline": analysis.run.timeline}
    return {
        "document": [to_document(analysis)],
        "gate": [evaluate(measure(analysis), config)],
        "analysis": [analysis],
        "table": [NamedTable(name, frame, run_meta) for name, frame in tables(analysis).items()],
        "scalars": [step_scalars(analysis)],
    }


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_every_renderer_renders_every_sample(run_dir, loaded_runs):
    pytest.importorskip("tensorboard")
    _, analysis = loaded_runs(run_dir)
    subjects = _subjects(analysis)
    for name, make in RENDERERS.items():
        renderer = make()
        for subject in subjects[renderer.reads]:
            out = renderer.render(subject)
            assert isinstance(out, (str, bytes)) and out, name
