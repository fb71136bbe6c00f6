"""whatif --search under a memory budget, --link-latency and --overlap-p2p: exact on generated
cost models, and on the project's real sample runs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLES
from generated_costs import constant_cost_model
from tracekit import LoadOptions, load
from tracekit.analyze.memory import ActivationSize, activation_size
from tracekit.analyze.costs import CostModel, LinkChange, parse_link_latency, with_links
from tracekit.analyze.whatif import as_measured, predict, search, what_if
from tracekit.cli import main
from tracekit.errors import TracekitError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text())


def _generated_model(p: int, latency_ns: int, t_f: int = 4000, t_b: int = 8000) -> CostModel:
    """A generated cost model (unit-test fixture, not a trace): constant compute per
    microbatch and rank, no overhead, every message ``latency_ns``."""
    return constant_cost_model(p, {"F": t_f, "B": t_b}, latency_ns)


def test_link_latency_values_parse_and_bad_ones_are_one_line_errors():
    assert parse_link_latency(None) is None
    assert parse_link_latency("x0.5") == LinkChange(factor=0.5, text="x0.5")
    assert parse_link_latency("+2ms") == LinkChange(add_ns=2_000_000, text="+2ms")
    assert parse_link_latency("-500us") == LinkChange(add_ns=-500_000, text="-500us")
    assert parse_link_latency("5ms") == LinkChange(set_ns=5_000_000, text="5ms")
    assert parse_link_latency(None, overlap=True) == LinkChange(overlap=True)
    for bad in ("half", "x", "x-1", "5", "5 parsecs", "ms", "xnan", "-"):
        with pytest.raises(TracekitError, match="--link-latency"):
            parse_link_latency(bad)
    samples = np.array([1_000_000, 3_000_000])
    assert LinkChange(factor=0.5).apply(samples).tolist() == [500_000, 1_500_000]
    assert LinkChange(add_ns=-2_000_000).apply(samples).tolist() == [0, 1_000_000]  # never negative
    assert LinkChange(set_ns=7).apply(samples).tolist() == [7, 7]
    assert LinkChange(overlap=True, factor=3).apply(samples).tolist() == [0, 0]


def test_overlapped_p2p_gives_the_closed_form_and_a_scaled_link_sits_between():
    p, m = 4, 8
    slow = _generated_model(p, latency_ns=2000)
    free = predict(with_links(slow, LinkChange(overlap=True)), "1F1B", 1, m, keep="microbatch", samples=4)
    assert free.step_ns == (m + p - 1) * 12000  # the closed form: messages cost nothing
    half = predict(with_links(slow, LinkChange(factor=0.5)), "1F1B", 1, m, keep="microbatch", samples=4)
    full = predict(slow, "1F1B", 1, m, keep="microbatch", samples=4)
    same = predict(with_links(slow, LinkChange(set_ns=1000)), "1F1B", 1, m, keep="microbatch", samples=4)
    assert free.step_ns < half.step_ns < full.step_ns and same.step_ns == half.step_ns
    assert free.messages_per_step == full.messages_per_step == 2 * m * (p - 1)  # the order is kept


def test_each_extra_virtual_stage_costs_messages_so_a_slow_link_wants_a_small_v():
    p, m = 4, 8

    def step(latency_ns: int, v: int) -> tuple[float, int]:
        got = predict(_generated_model(p, latency_ns), "Interleaved1F1B", v, m, keep="microbatch", samples=4)
        assert got.messages_per_step == 2 * m * (p * v - 1)  # every stage boundary crosses ranks
        return got.step_ns, got.messages_per_step

    assert step(0, 4)[0] < step(0, 2)[0]  # free messages: more chunks, a smaller bubble
    assert step(20_000, 4)[0] > step(20_000, 2)[0]  # a slow link: more chunks, more messages to wait on


@pytest.fixture(scope="module")
def one_f_one_b():
    path = SAMPLES / "1f1b"
    if not list(path.glob("rank*.json.gz")):
        pytest.skip(f"{path} holds no traces")
    return load(path, LoadOptions(jobs=1, rows="analysis"))


def test_search_under_a_budget_that_excludes_the_fastest_option(one_f_one_b):
    size = activation_size(one_f_one_b)  # 8 KiB a microbatch from the P2P messages
    roomy = search(one_f_one_b, 1 << 30, size, samples=8)
    fastest = roomy.search.best
    assert fastest is roomy.search.fastest and fastest.schedule != "1F1B"  # the measured schedule is not the best
    budget = fastest.activation_bytes - 1  # the fastest no longer fits
    tight = search(one_f_one_b, budget, size, samples=8)
    best = tight.search.best
    assert best is not None and best.label != fastest.label and tight.search.fastest.label == fastest.label
    fitting = [p for p in tight.predictions if p.activation_bytes <= budget]
    assert best.activation_bytes <= budget and best.step_ns == min(p.step_ns for p in fitting)
    assert best.step_ns > fastest.step_ns
    # per (schedule, v) the fastest m that fits; GPipe holds all m microbatches: 64 KiB at any m
    per_v = {(p.schedule, p.v): p for p in tight.search.per_v}
    assert set(per_v) >= {
        ("GPipe", 1),
        ("1F1B", 1),
        ("Interleaved1F1B", 2),
        ("Interleaved1F1B", 4),
        ("Interleaved1F1B", 8),
    }
    assert per_v[("GPipe", 1)].activation_bytes == 8 * 8192 > budget
    assert all(p.keep == "global-batch" for p in tight.predictions)
    assert any("P2P message sizes (proxy" in a for a in tight.assumptions)


def test_search_with_nothing_fitting_says_so(one_f_one_b):
    found = search(one_f_one_b, 1, ActivationSize(1 << 20, "--activation-bytes"), samples=4, ms=[8])
    assert found.search.best is None and found.to_dict()["search"]["best"] is None


def test_a_faster_link_shortens_the_measured_order(one_f_one_b):
    model_row = what_if(one_f_one_b, [("1F1B", 1, 8)], samples=8).as_measured
    overlapped = what_if(one_f_one_b, [("1F1B", 1, 8)], samples=8, links=parse_link_latency(None, True))
    slower = what_if(one_f_one_b, [("1F1B", 1, 8)], samples=8, links=parse_link_latency("x10"))
    # the measured order replayed with the link changed is a row of its own; the model row stays
    assert overlapped.as_measured.step_ns == model_row.step_ns
    free_row, free_pred = overlapped.predictions
    slow_row, slow_pred = slower.predictions
    assert free_row.basis == "measured order" and "overlapped" in free_row.label
    assert free_row.step_ns < model_row.step_ns < slow_row.step_ns
    assert free_pred.step_ns < slow_pred.step_ns
    assert as_measured(with_links(overlapped.model, LinkChange(overlap=True)), 8).step_ns == free_row.step_ns


def _cli(*args: str):
    return CliRunner().invoke(main, ["whatif", str(SAMPLES / "1f1b"), "--replays", "4", *args])


def test_cli_search_console_and_json(one_f_one_b):
    result = _cli("--search", "--memory-budget", "20KiB", "-m", "8", "-m", "16", "-m", "32")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "fastest under the budget:" in out and "over budget" in out and "(fastest of all," in out
    assert "P2P message sizes (proxy" in out and "--keep global-batch" in out and "per v" in out
    as_json = _cli("--search", "--memory-budget", "20KiB", "-m", "8", "-m", "16", "--json", "--link-latency", "x2")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["search"]["memory_budget_bytes"] == 20 << 10 and doc["links"] == "every link latency x2"
    assert {p["keep"] for p in doc["predictions"]} == {"global-batch", "as measured"}
    plain = _cli("--overlap-p2p", "-s", "1F1B", "-m", "8", "--json")
    assert plain.exit_code == 0, plain.output
    jsonschema.validate(json.loads(plain.output), SCHEMA)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--search"], "--search needs --memory-budget"),
        (["--memory-budget", "1GiB"], "--memory-budget: no activation size"),  # no [memory] events here
        (["--search", "--memory-budget", "lots"], "--memory-budget 'lots'"),
        (["--link-latency", "fast"], "--link-latency 'fast'"),
        (["--search", "--memory-budget", "1GiB", "--balanced"], "and --search: the search keeps the measured split"),
    ],
)
def test_cli_bad_options_are_one_line_and_exit_2(args, message):
    result = _cli(*args)
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_search_sizes_activations_from_the_memory_events_where_the_trace_has_them():
    path = SAMPLES / "1f1b_profile_memory"
    if not list(path.glob("rank*.json.gz")):
        pytest.skip(f"{path} holds no traces")
    # 1F1B m=8 holds 4 x 32 KiB on rank 0 (the memory events), not 4 x 8 KiB (the P2P proxy)
    result = CliRunner().invoke(
        main, ["whatif", str(path), "--search", "--memory-budget", "100KiB", "-s", "1F1B", "-m", "8", "--replays", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "from the profiler's [memory] events" in result.output
    assert "128.0 KiB  over budget" in result.output and "nothing fits 100.0 KiB" in result.output
    given = CliRunner().invoke(
        main,
        ["whatif", str(path), "--search", "--memory-budget", "100KiB", "-s", "1F1B", "-m", "8", "--replays", "4"]
        + ["--activation-bytes", "8KiB"],
    )
    assert given.exit_code == 0 and "from --activation-bytes" in given.output and "32.0 KiB" in given.output
