"""``tracekit whatif --no-recompute``: the activation memory recomputation saves, per rank.

On a GENERATED Megatron-core run (tests/gpu_tracegen.py ``recompute_pp4``: not a real trace;
its truth's ``activation_memory`` is what the generator's memory model keeps) and on the REAL
CPU capture sample_traces/pp4_recompute (torch.utils.checkpoint around each stage's layers),
sized from the traces' record_shapes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from gpu_tracegen import SCENARIOS_3D, generate
from tracekit.cli import main
from tracekit.ingest.kineto_shapes import first_input

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text())
ARGS = ["--no-recompute", "-s", "1F1B", "-m", "8", "--no-progress", "--no-cache", "--replays", "4"]


def _whatif(folder: Path, *extra: str) -> tuple[dict, str]:
    """(the --json document, the console output) of whatif --no-recompute on ``folder``."""
    runner = CliRunner()
    doc = runner.invoke(main, ["whatif", str(folder), *ARGS, "--json", *extra])
    assert doc.exit_code == 0, doc.output
    console = runner.invoke(main, ["whatif", str(folder), *ARGS, *extra])
    assert console.exit_code == 0, console.output
    parsed = json.loads(doc.stdout)
    jsonschema.validate(parsed, SCHEMA)
    return parsed, console.output


def test_generated_memory_on_and_off_is_the_generators(tmp_path):
    folder, truth = generate(SCENARIOS_3D["recompute_pp4"], tmp_path)
    doc, console = _whatif(folder)
    memory = doc["recompute_memory"]
    assert memory["unsized"] is None
    got = {r["rank"]: r for r in memory["ranks"]}
    assert sorted(got) == [r["rank"] for r in truth["activation_memory"]["ranks"]]
    for want in truth["activation_memory"]["ranks"]:
        row = got[want["rank"]]
        for key in (
            "in_flight",
            "kept_per_microbatch_bytes",
            "activations_per_microbatch_bytes",
            "peak_recompute_on_bytes",
            "peak_recompute_off_bytes",
        ):
            assert row[key] == want[key], (want["rank"], key)
        assert row["saved_bytes"] == want["peak_recompute_off_bytes"] - want["peak_recompute_on_bytes"]
    assert got[0]["saved_bytes"] > 0 and got[3]["saved_bytes"] == 0  # the last stage holds one at a time
    assert "activation memory per rank, recomputation on (as measured) and off" in console
    assert "sized from record_shapes' Input Dims" in console
    assert any("sized from the traces' op shapes" in a for a in doc["assumptions"])


def test_real_capture_memory_follows_its_model():
    """pp4_recompute: 4 layers a stage, each Linear(hidden) > emulated compute Function > ReLU
    (tracekit/capture/model.py; no ReLU after the model's last layer), float32 rows of
    microbatch_size x hidden. Each backward re-runs a stage's layers: three activations a layer,
    the linear's, the compute Function's and the ReLU's inputs (the weight the emulated
    weight-grad Function takes is no activation). On the last stage the last layer has no ReLU,
    and torch's checkpoint stops re-running once the tensors the backward needs are rebuilt
    (early stop), which leaves out that layer's compute Function: two fewer."""
    run = ROOT / "sample_traces" / "pp4_recompute"
    capture = json.loads((run / "capture.json").read_text())
    compute = capture["compute"]
    p, m, layers = capture["p"], capture["m"], compute["layers_per_stage"]
    kept = compute["microbatch_size"] * compute["hidden"] * 4
    doc, console = _whatif(run)
    memory = doc["recompute_memory"]
    assert memory["unsized"] is None
    for row in memory["ranks"]:
        rank = row["rank"]
        per_microbatch = (3 * layers - (2 if rank == p - 1 else 0)) * kept
        assert row["stages"] == [rank]
        assert row["in_flight"] == min(p - rank, m)  # 1F1B
        assert row["kept_per_microbatch_bytes"] == kept
        assert row["activations_per_microbatch_bytes"] == per_microbatch
        assert row["peak_recompute_off_bytes"] == row["in_flight"] * per_microbatch
        assert row["peak_recompute_on_bytes"] == row["in_flight"] * kept + per_microbatch - kept
        assert row["recomputations_sized"] == m * capture["steps"]
    assert "  0        0          4    8.0 KiB   96.0 KiB  120.0 KiB  384.0 KiB  264.0 KiB" in console


def test_without_recorded_shapes_it_says_it_cannot_size(tmp_path):
    sc = dataclasses.replace(SCENARIOS_3D["recompute_pp4"], name="recompute_noshapes", record_shapes=False)
    folder, _ = generate(sc, tmp_path)
    doc, console = _whatif(folder)
    memory = doc["recompute_memory"]
    assert "record_shapes=True" in memory["unsized"]
    assert all(r["peak_recompute_off_bytes"] is None and r["saved_bytes"] is None for r in memory["ranks"])
    assert "not sized (?): ranks 0, 1, 2, 3: the re-run ops have no recorded shapes" in console
    assert doc["predictions"][0]["label"] == "measured order, no recomputation"  # time still predicted


def test_first_input_sizes():
    assert first_input({"Input Dims": [[8, 256], [256, 256]], "Input type": ["float", "float"]}) == ("8,256", 8192)
    assert first_input({"Input Dims": [[4, 2]], "Input type": ["c10::BFloat16"]}) == ("4,2", 16)
    assert first_input({"Input Dims": [[], [3]], "Input type": ["Scalar", "float"]}) == ("", -1)
    assert first_input({"Input Dims": [[3]], "Input type": ["a type of no known size"]}) == ("", -1)
    assert first_input({}) == ("", -1)
    assert first_input({"Input Dims": [[2, -1]], "Input type": ["float"]}) == ("", -1)


@pytest.mark.parametrize("bad", [b"", b"{not json", b'{"traceEvents": 3}'])
def test_an_unreadable_file_has_no_ops(tmp_path, bad):
    from tracekit.ingest.kineto_shapes import OP_COLUMNS, read_op_inputs

    path = tmp_path / "rank0.json"
    path.write_bytes(bad)
    ops = read_op_inputs(path)
    assert ops.empty and list(ops.columns) == OP_COLUMNS
