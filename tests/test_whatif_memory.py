"""Activation memory on every what-if row and split candidate, and --memory-budget without
--search: on sample_traces/1f1b_profile_memory (sized from its [memory] events) and on a
generated cost model (not a trace) whose splits differ in what their first stage holds."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from generated_costs import constant_cost_model
from tracekit import load
from tracekit.analyze.layers import LayerCost, LayerCosts
from tracekit.analyze.memory import (
    ActivationSize,
    activation_bytes_per_rank,
    activation_size_from_memory,
    in_flight_per_rank,
    layer_activation_bytes,
)
from tracekit.analyze.schedules import orders_for
from tracekit.analyze.split import search_split
from tracekit.cli import main
from tracekit.ingest.kineto_memory import read_memory_events

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text())
PROFILED = SAMPLES / "1f1b_profile_memory"


def _whatif(*args: str) -> dict:
    result = CliRunner().invoke(main, ["whatif", str(PROFILED), "--json", "--no-progress", "--replays", "8", *args])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    jsonschema.validate(doc, SCHEMA)
    return doc


@pytest.fixture(scope="module")
def roomy() -> dict:
    return _whatif()


def test_every_row_is_sized_by_the_memory_model_of_its_schedule(roomy):
    """Each row's per-rank figures are the memory model's own for its (schedule, v, m): peak
    in flight on the generated order x the rank's measured size / v x measured m / m."""
    run = load(PROFILED)
    size = activation_size_from_memory(run, {f.rank: read_memory_events(f.path) for f in run.files})
    assert size is not None and roomy["memory"]["activation_source"] == size.source
    assert roomy["memory"]["activation_bytes_per_microbatch"] == size.bytes_per_microbatch
    measured = roomy["measured"]
    p, m0 = measured["p"], measured["m"]
    for row in roomy["predictions"]:
        orders = orders_for(row["schedule"], p, row["v"], row["m"])[0]
        want = activation_bytes_per_rank(orders, size, row["v"], row["m"], m0, "global-batch", list(range(p)))
        assert row["activation_bytes_per_rank"] == [want[r] for r in range(p)]
        # the same from the in-flight counts, by hand
        counts = in_flight_per_rank(orders)
        by_hand = [round(counts[r] * size.of_rank(r) / row["v"] * m0 / row["m"]) for r in range(p)]
        assert row["activation_bytes_per_rank"] == by_hand
        assert row["activation_bytes"] == max(by_hand)
        assert "over_budget" not in row  # no budget given
    assert roomy["memory"]["fastest_within_budget"] == roomy["memory"]["fastest"]


def test_the_fastest_row_over_the_budget_is_not_the_recommendation(roomy):
    rows = [r for r in roomy["predictions"] if r["basis"] == "generated order"]
    fastest = min(rows, key=lambda r: r["step_ns"])
    assert roomy["memory"]["fastest"] == fastest["label"]
    budget = fastest["activation_bytes"] - 1  # the fastest no longer fits
    assert any(r["activation_bytes"] <= budget for r in rows)  # something else does
    tight = _whatif("--memory-budget", str(budget))
    fitting = [r for r in tight["predictions"] if r["activation_bytes"] <= budget]
    assert {r["label"] for r in tight["predictions"] if r["over_budget"]} == {
        r["label"] for r in rows if r["activation_bytes"] > budget
    }
    best = min(fitting, key=lambda r: r["step_ns"])
    assert tight["memory"]["fastest_within_budget"] == best["label"] != fastest["label"]
    assert tight["memory"]["fastest"] == fastest["label"]
    assert tight["memory"]["memory_budget_bytes"] == budget
    # the framework's config lines follow the recommendation, not the faster row over budget
    text = CliRunner().invoke(
        main, ["whatif", str(PROFILED), "--no-progress", "--replays", "8", "--memory-budget", str(budget)]
    )
    assert text.exit_code == 0, text.output
    assert f"fastest step (--keep global-batch): {best['label']}," in text.output
    assert f"(fastest of all, {fastest['label']} at" in text.output
    assert f"{fastest['label']} " in text.output and "over budget" in text.output


def test_nothing_fits_is_said_in_one_line():
    tight = _whatif("--memory-budget", "1KiB")
    assert tight["memory"]["fastest_within_budget"] is None
    assert all(r["over_budget"] for r in tight["predictions"])
    text = CliRunner().invoke(
        main, ["whatif", str(PROFILED), "--no-progress", "--replays", "4", "--memory-budget", "1KiB"]
    )
    assert text.exit_code == 0
    assert "nothing fits the memory budget 1.0 KiB: every row is over it" in text.output
    assert "fastest step" not in text.output


def test_a_budget_with_nothing_to_size_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["whatif", str(SAMPLES / "1f1b"), "--no-progress", "--memory-budget", "1MiB"])
    assert result.exit_code == 2
    assert "no activation size" in result.output and "--activation-bytes" in result.output
    assert "Traceback" not in result.output
    # --activation-bytes sizes it instead
    given = CliRunner().invoke(
        main,
        ["whatif", str(SAMPLES / "1f1b"), "--json", "--no-progress", "--replays", "4", "--activation-bytes", "1MiB"],
    )
    assert given.exit_code == 0, given.output
    doc = json.loads(given.output)
    assert doc["memory"]["activation_bytes_per_microbatch"] == 1 << 20
    assert all(r["activation_bytes"] is not None for r in doc["predictions"])


def test_rows_without_evidence_stay_as_they_were():
    """No profile_memory, no --activation-bytes, no budget: no memory key, no per-rank figures."""
    result = CliRunner().invoke(main, ["whatif", str(SAMPLES / "1f1b"), "--json", "--no-progress", "--replays", "4"])
    doc = json.loads(result.output)
    assert "memory" not in doc
    assert all(r["activation_bytes"] is None and "activation_bytes_per_rank" not in r for r in doc["predictions"])


# --- splits: a generated cost model (not a trace) -----------------------------------------

P, M, LAYERS = 4, 8, 12
PER_RANK = 3 * 1024  # one microbatch on a rank's 3 measured layers: 1 KiB a layer


def _layers() -> LayerCosts:
    costs = [LayerCost(i, 4000, 8000, i // 3, 1) for i in range(LAYERS)]
    return LayerCosts(costs, "file", "generated_layers (unit test)", [3, 3, 3, 3])


def _layer_bytes() -> list[float]:
    size = ActivationSize(PER_RANK, "generated")
    return layer_activation_bytes(size, LAYERS, [3, 3, 3, 3], {s: s for s in range(P)})


def test_a_layer_gets_its_ranks_share_and_a_stage_holds_its_layers():
    assert _layer_bytes() == [1024.0] * LAYERS
    uneven = layer_activation_bytes(
        ActivationSize(0, "generated", {0: 6000, 1: 3000}), 8, [6, 2], {0: 0, 1: 1}
    )  # rank 0 ran 6 layers, rank 1 ran 2
    assert uneven == [1000.0] * 6 + [1500.0] * 2
    model = constant_cost_model(P, {"F": 4000 * 3, "B": 8000 * 3})
    search = search_split(
        model, _layers(), "1F1B", 1, M, samples=4, n_candidates=8, slack=0.5, layer_bytes=_layer_bytes()
    )
    assert len(search.candidates) > 2
    for c in search.candidates:
        # each stage's figure follows its layers; 1F1B's rank r holds min(p - r, m) of its stage
        assert c.stage_activation_bytes == [1024 * n for n in c.split]
        want = [min(P - r, M) * 1024 * n for r, n in enumerate(c.split)]
        assert c.prediction.activation_bytes_per_rank == want
        assert c.activation_bytes == max(want)
        assert c.to_dict()["stage_activation_bytes"] == [1024 * n for n in c.split]


def test_the_fastest_split_over_the_budget_is_not_recommended():
    model = constant_cost_model(P, {"F": 4000 * 3, "B": 8000 * 3})
    args = dict(samples=4, n_candidates=8, slack=0.5, layer_bytes=_layer_bytes())
    roomy = search_split(model, _layers(), "1F1B", 1, M, **args)
    fastest = roomy.recommended
    assert fastest is not None and fastest.split == [3, 3, 3, 3]  # equal layers: the even split
    budget = fastest.activation_bytes - 1
    assert any(c.activation_bytes <= budget for c in roomy.candidates)  # a lighter first stage fits
    tight = search_split(model, _layers(), "1F1B", 1, M, memory_budget=budget, **args)
    best = tight.recommended
    fitting = [c for c in tight.candidates if c.activation_bytes <= budget]
    assert best is not None and best.split != fastest.split and best.activation_bytes <= budget
    assert best.prediction.step_ns == min(c.prediction.step_ns for c in fitting)
    assert best.prediction.step_ns > fastest.prediction.step_ns
    assert all(c.prediction.over_budget == (c.activation_bytes > budget) for c in tight.candidates)
    # nothing fits: no recommendation at all
    none = search_split(model, _layers(), "1F1B", 1, M, memory_budget=1, **args)
    assert none.recommended is None and none.to_dict()["recommended"] is None
    assert all(c.role != "recommended" for c in none.candidates)


def test_balanced_on_the_profiled_sample_sizes_its_splits():
    """The capture's 16 layers 4,4,4,4: the measured split's stages hold the measured ranks'
    own activations per microbatch, and its 1F1B row and its split row agree."""
    doc = _whatif("--balanced")
    best = doc["split"]["searches"][0]["recommended"]
    row = next(r for r in doc["predictions"] if r["label"] == "1F1B v=1 m=8")
    assert best["split"] == [4, 4, 4, 4]
    assert best["activation_bytes_per_rank"] == row["activation_bytes_per_rank"]
    per_rank = row["activation_bytes_per_rank"]
    assert best["stage_activation_bytes"] == [per_rank[r] // min(P - r, M) for r in range(P)]
