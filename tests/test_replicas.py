"""Data-parallel pipelines side by side are several pipelines, not one twice as deep.

The fixtures are the project's real sample captures laid out as a DP x PP job by the
benchmark's input builder (`benchmarks/make_input.py`: each sample rank written again as
rank r+4 of a second replica, its process-group ranks rewritten): real events, replicated.
"""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT, SAMPLES
from tracekit.analyze import analyze
from tracekit import LoadOptions, load
from tracekit.render.json import to_document

sys.path.insert(0, str(ROOT / "benchmarks"))
import make_input  # noqa: E402


def _replicated(tmp_path, sample: str):
    folder = tmp_path / f"{sample}_x2"
    make_input.build_pp(folder, ranks=8, copies=1, sample=sample)
    return folder


@pytest.mark.parametrize("sample,labelled", [("1f1b", False), ("interleaved1f1b", True)])
def test_two_replicas_read_as_two_pipelines_of_p_ranks(tmp_path, sample, labelled):
    single = load(SAMPLES / sample, LoadOptions(jobs=1, rows="analysis"))
    double = load(_replicated(tmp_path, sample), LoadOptions(jobs=1, rows="analysis"))
    s1, s2 = single.schedule, double.schedule
    assert (single.actions["label"] != "").any() == labelled  # both labellings are covered
    assert (s2.name, s2.p, s2.v, s2.m) == (s1.name, s1.p, s1.v, s1.m)
    assert s2.pipelines == [[0, 1, 2, 3], [4, 5, 6, 7]] and s2.replicas == 2
    assert any("data-parallel replicas" in line for line in s2.evidence)
    # each replica's stages are numbered as in the single pipeline (native 1F1B names none)
    assert set(double.actions.loc[double.actions["rank"] >= 4, "stage"]) == set(single.actions["stage"])
    a1, a2 = analyze(single), analyze(double)
    assert a2.theory.bubble_ratio == pytest.approx(a1.theory.bubble_ratio)
    for rank in range(4):
        b1 = a1.bubbles[a1.bubbles["rank"] == rank]["bubble_ratio"].mean()
        for twin in (rank, rank + 4):
            b2 = a2.bubbles[a2.bubbles["rank"] == twin]["bubble_ratio"].mean()
            assert abs(b2 - b1) < 0.01
    # replay edges stay inside a replica: attribution still reproduces every step exactly
    assert all(s.residual_ns == 0 for s in a2.attribution.steps)
    doc = to_document(a2)
    assert doc["schedule"]["replicas"] == 2
    for blame in doc["blame"]["stages"]:
        assert len(blame["ranks"]) == 2 and blame["ranks"][1] == blame["ranks"][0] + 4


def test_a_broken_pipeline_is_not_mistaken_for_replicas(tmp_path):
    """Rank 2's trace missing: ranks {0,1} and {3} exchange no messages with each other,
    yet that is one damaged pipeline, not replicas, and not a p=3 pipeline either."""
    import shutil

    folder = tmp_path / "missing_rank"
    shutil.copytree(SAMPLES / "1f1b", folder)
    (folder / "rank2.json.gz").unlink()
    run = load(folder, LoadOptions(jobs=1, rows="analysis"))
    assert run.schedule.replicas == 1 and run.schedule.p == 4 and run.schedule.name == "unknown"
