"""Layers as the model has them (tracekit/analyze/layers.py): each source of the layer count
(module names, the period of the forward ops, --layer-costs), the refusal of a split that is
not whole layers, and the real captures of issue 32 (sample_traces/layers/, see
sample_traces/README.md): a model whose layer runs one autograd Function twice, and a
transformer-like model of four Linears a layer, with its module names and without them."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from tracekit import load
from tracekit.analyze.layers import (
    _by_module_names,
    _layer_marks,
    layer_costs_from_trace,
    read_layer_costs,
    smallest_period,
)
from tracekit.cli import main
from tracekit.reconstruct.actions import annotation_counts

LAYERS = SAMPLES / "layers"
SLEEP_LINEAR = LAYERS / "sleep_linear_slow_stage2"
TRANSFORMER = LAYERS / "transformer"
TRANSFORMER_STACK = LAYERS / "transformer_with_stack"


# --- the period of an op sequence -------------------------------------------------------------
@pytest.mark.parametrize(
    "ops,unit,repeats",
    [
        # the layer: one Function on the input and one on the weight, then the matmul
        (["S", "S", "lin", "relu"] * 4, ("S", "S", "lin", "relu"), 4),
        # a unit of two ops that repeats 4 times is 4 layers, not 8
        (["fn", "lin"] * 4, ("fn", "lin"), 4),
        # batch slicing before the layers and the loss after them
        (["slice", "view"] + ["W", "lin", "C", "relu"] * 3 + ["mse"], ("W", "lin", "C", "relu"), 3),
        # two Linears a layer: the layer repeats, not the Linear (whose repeats tile less)
        (["ln", "W", "lin", "C", "W", "lin", "C", "add"] * 2, ("ln", "W", "lin", "C", "W", "lin", "C", "add"), 2),
        # nothing repeats: the whole forward once
        (["embed", "W", "lin", "C", "mse"], ("embed", "W", "lin", "C", "mse"), 1),
    ],
)
def test_the_smallest_unit_that_tiles_the_forward_is_one_layer(ops, unit, repeats):
    period = smallest_period(ops)
    assert period is not None and (period.unit, period.repeats) == (unit, repeats)


def test_a_last_repeat_cut_short_is_counted_as_its_ops_say():
    """The last layer of a stage has no ReLU after it: 3 whole repeats and 3 of the unit's 4
    ops (a cut repeat; the layer finder counts it where it holds half the unit's ops or more)."""
    period = smallest_period(["W", "lin", "C", "relu"] * 3 + ["W", "lin", "C", "mse"])
    assert period is not None and (period.unit, period.repeats, period.cut) == (("W", "lin", "C", "relu"), 3, 3)
    assert smallest_period([]) is None


# --- module names -------------------------------------------------------------------------------
def _events(rows: list[tuple[str, str, int, int]]) -> pd.DataFrame:
    """generated events of one rank's main thread: (cat, name, start, end) in ns."""
    return pd.DataFrame(
        {
            "rank": 0,
            "pid": 1,
            "tid": 1,
            "on_gpu": False,
            "cat": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "start_ns": [r[2] for r in rows],
            "end_ns": [r[3] for r in rows],
        }
    )


def _forwards(spans: list[tuple[int, int]]) -> dict[int, pd.DataFrame]:
    return {0: pd.DataFrame({"rank": 0, "start_ns": [s for s, _ in spans], "end_ns": [e for _, e in spans]})}


def test_placed_layer_names_are_taken_before_module_classes():
    """generated: two forwards of a stage, each running Megatron's decoder.layers.3 and .4
    (ranges, a sub-range each too) around nn.Module frames of two Linears a layer: the layer
    is decoder.layers.N (two a forward), not the Linear (four), and each layer starts at its
    first range."""
    rows = []
    for base in (0, 1000):
        for k, index in enumerate((3, 4)):
            s = base + 100 + 400 * k
            rows += [
                ("user_annotation", f"decoder.layers.{index}", s, s + 390),
                ("user_annotation", f"decoder.layers.{index}.mlp", s + 200, s + 380),
                ("python_function", f"nn.Module: Linear_{2 * k}", s + 10, s + 190),
                ("python_function", f"nn.Module: Linear_{2 * k + 1}", s + 210, s + 370),
            ]
    found = _by_module_names(_layer_marks(_events(rows)), _forwards([(105, 895), (1105, 1895)]))
    assert found is not None
    starts, source, detail = found
    assert source == "module-names" and "decoder.layers.N" in detail
    assert starts == {0: [[105, 500], [1105, 1500]]}  # the first layer from the forward's start


def test_the_layer_class_is_the_one_with_more_than_one_instance_and_the_most_time():
    """generated: a stage container (one instance a forward) holding three blocks, each
    holding a Linear, and a ReLU after the first two blocks: the blocks (three, the most time
    of the repeated classes) are the layers."""
    rows = [("python_function", "nn.Module: Sequential_0", 0, 1000)]
    for k in range(3):
        s = 10 + 300 * k
        rows += [
            ("python_function", f"nn.Module: Block_{k}", s, s + 250),
            ("python_function", f"nn.Module: Linear_{k}", s + 5, s + 240),
        ]
        if k < 2:
            rows.append(("python_function", f"nn.Module: ReLU_{k}", s + 260, s + 280))
    found = _by_module_names(_layer_marks(_events(rows)), _forwards([(12, 995)]))
    assert found is not None and "nn.Module: Block_N" in found[2]
    assert found[0] == {0: [[12, 310, 610]]}


def test_no_module_names_no_module_source():
    events = _events([("cpu_op", "aten::linear", 0, 10), ("user_annotation", "PP:0F0", 0, 20)])
    assert _by_module_names(_layer_marks(events), _forwards([(0, 20)])) is None


def test_the_real_megatron_capture_reads_its_module_names():
    """megatron_interleaved_with_stack: Megatron's own schedules with with_stack; the torch
    frames nn.Module: EmulatedLinear_k give the 2 layers of each of the 8 chunks, and each
    layer costs its 3 ms forward sleep and 6 ms backward sleeps plus the rest of its ops
    (the op counts read the batch slicing as a layer of ~0.05 ms before)."""
    costs = layer_costs_from_trace(load(SAMPLES / "megatron_interleaved_with_stack"))
    assert costs.source == "module-names" and costs.measured_split == [2] * 8
    assert "EmulatedLinear_N" in costs.detail
    assert all(3e6 <= c.forward_ns <= 1.4 * 3e6 and 6e6 <= c.backward_ns <= 1.5 * 6e6 for c in costs.layers)


def test_ingest_keeps_module_frames_and_no_label_rule_reads_them():
    run = load(SAMPLES / "megatron_interleaved_with_stack")
    frames = run.events[run.events["cat"] == "python_function"]["name"].astype(str)
    assert frames.str.startswith("nn.Module: EmulatedLinear_").any()
    assert not any(name.startswith("nn.Module") for name in annotation_counts(run.events))


# --- the real captures of issue 32 ---------------------------------------------------------
def test_the_sleep_linear_model_reads_16_layers_not_32():
    """Each layer's input and weight pass TracekitSleep: the op repeats twice a layer (the
    op counts read 31 layers, 7,8,8,8, here; the issue's capture 32). The repeating unit is
    the layer: 16, 4 a stage (stage 0's first layer has no input Function in its forward
    span: its unit starts one op later), and each stage's layers add up to its forwards'
    mean compute."""
    run = load(SLEEP_LINEAR)
    costs = layer_costs_from_trace(run)
    cap = json.loads((SLEEP_LINEAR / "capture.json").read_text())["compute"]
    assert cap["layer_kind"] == "sleep-linear" and cap["layers"] == 16
    assert costs.source == "op-period" and costs.measured_split == [4, 4, 4, 4]
    assert "TracekitSleep > TracekitSleep > aten::linear > aten::relu" in costs.detail
    actions = run.actions[(run.actions["step"] >= 0) & (run.actions["kind"] == "F")]
    for stage in range(4):
        mine = actions[actions["stage"] == stage]
        mean = (mine["end_ns"] - mine["start_ns"]).mean()
        assert sum(c.forward_ns for c in costs.layers if c.stage == stage) == pytest.approx(mean, abs=4)
    # stage 2 ran its sleeps twice as long: its layers cost the most
    per_stage = [sum(c.total_ns for c in costs.layers if c.stage == s) for s in range(4)]
    assert int(np.argmax(per_stage)) == 2


def test_the_sleep_linear_model_gets_a_whole_layer_split_off_its_slow_stage():
    schema = json.loads((SAMPLES.parent / "tracekit" / "schemas" / "whatif.schema.json").read_text())
    result = CliRunner().invoke(
        main, ["whatif", str(SLEEP_LINEAR), "--balanced", "--replays", "8", "--json", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    jsonschema.validate(doc, schema)
    layers = doc["split"]["layer_costs"]
    assert (layers["source"], layers["n_layers"], layers["measured_split"]) == ("op-period", 16, [4, 4, 4, 4])
    best = doc["split"]["searches"][0]["recommended"]
    assert sum(best["split"]) == 16 and best["split"][2] < 4  # layers moved off the slow stage 2
    measured = next(c for c in doc["split"]["searches"][0]["candidates"] if "measured" in c["matches"])
    assert best["step_ns"] < measured["step_ns"]
    console = CliRunner().invoke(main, ["whatif", str(SLEEP_LINEAR), "--balanced", "--replays", "4", "--no-progress"])
    assert "16 layers from the repeating unit of the forward ops, 4,4,4,4 per stage" in console.output


@pytest.mark.parametrize("split", ["11,8,5,8", "4,4,4,3"])
def test_a_split_that_is_not_whole_layers_is_refused_in_one_line(split):
    """11,8,5,8 is the issue's advice in half-layers (32 of them); 4,4,4,3 leaves a layer out."""
    result = CliRunner().invoke(main, ["whatif", str(SLEEP_LINEAR), "--split", split, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "the model has 16 layers from the repeating unit of the forward ops, 4,4,4,4 per stage" in result.output
    assert "whole layers" in result.output


def test_a_split_in_fractions_of_layers_is_refused_in_one_line():
    result = CliRunner().invoke(main, ["whatif", str(SLEEP_LINEAR), "--split", "4.5,3.5,4,4", "--no-progress"])
    assert result.exit_code == 2 and "whole layers" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("folder", [TRANSFORMER_STACK, TRANSFORMER], ids=["module-names", "op-period"])
def test_the_transformer_model_reads_its_12_blocks_with_module_names_and_without(folder):
    """Four Linears a block (qkv, projection, fc1, fc2): the op counts read each Linear as a
    layer (48); the module names give the 12 TransformerLayer blocks (with_stack), and
    without them the repeating unit of 23 ops does."""
    costs = layer_costs_from_trace(load(folder))
    cap = json.loads((folder / "capture.json").read_text())["compute"]
    assert cap["layer_kind"] == "transformer" and cap["layers"] == 12
    assert costs.measured_split == [3, 3, 3, 3]
    if folder == TRANSFORMER_STACK:
        assert costs.source == "module-names" and "nn.Module: TransformerLayer_N" in costs.detail
    else:
        assert costs.source == "op-period" and "(23 ops)" in costs.detail


def test_the_transformer_with_its_module_frames_dropped_reads_the_same_layers():
    """The with_stack capture read as if without with_stack (its Python frames dropped):
    the op period finds the same 12 blocks at the same places."""
    run = load(TRANSFORMER_STACK)
    named = layer_costs_from_trace(run)
    plain = layer_costs_from_trace(dataclasses.replace(run, events=run.events[run.events["cat"] != "python_function"]))
    assert plain.source == "op-period" and plain.measured_split == named.measured_split
    for a, b in zip(named.layers, plain.layers):  # boundaries a frame's start apart at most
        assert a.forward_ns == pytest.approx(b.forward_ns, rel=0.05)
        assert a.backward_ns == pytest.approx(b.backward_ns, rel=0.05)


# --- --layer-costs ---------------------------------------------------------------------------
def test_a_layer_costs_file_says_so(tmp_path):
    """generated_costs.json: two layers, no stages."""
    path = tmp_path / "generated_costs.json"
    path.write_text(json.dumps({"layers": [{"forward_ns": 1, "backward_ns": 2}] * 2}))
    costs = read_layer_costs(path)
    assert costs.source == "file" and costs.found() == "2 layers from --layer-costs"
    assert costs.to_dict()["n_layers"] == 2
