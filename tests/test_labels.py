"""Label rules as data: built-in tables chosen from the trace, user rules, and what a run
with no pipeline says."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit import LoadOptions, load
from tracekit.cli import main
from tracekit.errors import TracekitError
from tracekit.reconstruct.counts import count_problems
from tracekit.reconstruct.labels import BUILTIN, choose, parse_rule


def _analyze(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["analyze", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "sample, table",
    [("gpipe", "torch-gpipe"), ("interleaved1f1b", "torch-pp"), ("dualpipev", "torch-pp"), ("1f1b", "none")],
)
def test_each_sample_reports_the_table_its_actions_came_from(loaded_runs, sample, table):
    run, _ = loaded_runs(SAMPLES / sample)
    assert run.labels == table
    assert run.actions_from == ("segmentation" if table == "none" else "labels")


def test_the_console_and_json_name_the_labels():
    code, out = _analyze(str(SAMPLES / "gpipe"))
    assert code == 0 and "  labels: torch-gpipe\n" in out
    code, out = _analyze(str(SAMPLES / "1f1b"), "--json")
    assert code == 0
    labels = json.loads(out)["labels"]
    assert labels == {"table": "none", "actions_from": "segmentation", "matched": {}}


def test_user_rules_that_say_what_a_builtin_says_give_the_same_analysis():
    code, builtin = _analyze(str(SAMPLES / "gpipe"), "--json")
    assert code == 0
    code, custom = _analyze(
        str(SAMPLES / "gpipe"),
        "--json",
        "--label-rule",
        r"^Forward (?P<mb>\d+)$=F",
        "--label-rule",
        r"^Backward (?P<mb>\d+)$=B",
    )
    assert code == 0
    a, b = json.loads(builtin), json.loads(custom)
    assert b["labels"]["table"] == "custom"
    assert a["ranks"] == b["ranks"]
    assert a["summary"]["bubble_ratio"] == b["summary"]["bubble_ratio"]


def test_rules_from_pyproject_are_used(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tracekit.labels]\n"^Forward (?P<mb>\\\\d+)$" = "F"\n"^Backward (?P<mb>\\\\d+)$" = "B"\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out = _analyze(str(SAMPLES / "gpipe"), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["labels"]["table"] == "custom"
    assert doc["schedule"]["name"] == "GPipe"


@pytest.mark.parametrize(
    "rule, said",
    [
        ("fwd(=F", "not a regular expression"),
        ("fwd_(?P<mb>\\d+)=X", "unknown kind 'X'"),
        ("fwd_(?P<micro>\\d+)=F", "unknown group(s) micro"),
        ("fwd=kind", "needs a group (?P<kind>"),
        (".*=F", "matches the empty name"),
        ("no-kind-given", "write REGEX=KIND"),
        ("^(a+)+$=F", "exponential time"),  # a hang on a near-miss, refused before any file is read
    ],
)
def test_a_bad_rule_is_one_line_and_exit_2(rule, said):
    code, out = _analyze(str(SAMPLES / "gpipe"), "--label-rule", rule)
    assert code == 2
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], out
    assert "Traceback" not in out


def test_a_bad_pyproject_rule_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.tracekit.labels]\n"fwd(" = "F"\n')
    monkeypatch.chdir(tmp_path)
    code, out = _analyze(str(SAMPLES / "gpipe"))
    assert code == 2 and "pyproject.toml" in out and "not a regular expression" in out


def test_user_rules_that_match_nothing_fall_back_to_the_builtins_and_say_so():
    run = load(SAMPLES / "gpipe", LoadOptions(labels=(r"^step_fwd(?P<mb>\d+)$=F",)))
    assert run.labels == "torch-gpipe"
    assert any("no rule matched an action range" in w and "ward 0` ×12" in w and "gloo:" not in w for w in run.warnings)


def test_builtin_tables_read_the_names_the_frameworks_write():
    """The names the frameworks write, read from their sources: torch.distributed.pipelining's
    ``"PP:" + str(action)``, ScheduleGPipe's ``Backward <mb>``, Megatron's NVTX function ranges."""
    table = {t.name: t for t in BUILTIN}
    assert table["torch-pp"].match("PP:3B7").parse("PP:3B7", 1) == [("B", 3, 7)]
    assert table["torch-pp"].match("PP:(0F5;7B2)OVERLAP_F_B").parse("PP:(0F5;7B2)OVERLAP_F_B", 0) == [
        ("F", 0, 5),
        ("B", 7, 2),
    ]
    assert table["torch-pp"].match("PP:1SEND_F3").role == "comm"
    assert table["torch-pp"].match("PP:2REDUCE_GRAD").role == "comm"
    assert table["torch-gpipe"].match("Backward 4").parse("Backward 4", 2) == [("B", 2, 4)]
    assert table["layer-suffix"].match("attn(F)").parse("attn(F)", 1) == [("F", 1, -1)]
    assert table["layer-suffix"].match("mlp(W)").layer_level
    megatron = "megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving.warmup"
    assert table["megatron-nvtx"].match(megatron).role == "marker"
    assert (
        table["megatron-nvtx"]
        .match("megatron.core.pipeline_parallel.p2p_communication.send_forward_recv_backward")
        .role
        == "comm"
    )
    assert table["deepspeed-nvtx"].match("DeepSpeedEngine.forward").role == "marker"


def test_the_megatron_frames_table_reads_megatrons_own_entry_points_only():
    """Megatron-core's and Megatron-LM's schedules.py forward_step / backward_step frames,
    whatever path prefix torch left; not the interleaved helpers around them (one action would
    count twice), not a training script's own forward_step, not a wrapper of it elsewhere."""
    table = {t.name: t for t in BUILTIN}["megatron-torch"]
    assert table.placed_by_chains
    for name, kind in (
        ("megatron/core/pipeline_parallel/schedules.py(403): forward_step", "F"),
        ("megatron/core/pipeline_parallel/schedules.py(539): backward_step", "B"),
        ("megatron/schedules.py(92): forward_step", "F"),
        ("/workspace/Megatron-LM/megatron/schedules.py(143): backward_step", "B"),
    ):
        assert table.match(name).parse(name, 3) == [(kind, 3, -1)], name
    for name in (
        "pretrain_gpt.py(120): forward_step",
        "megatron/core/pipeline_parallel/schedules.py(1385): forward_step_helper",
        "megatron/core/pipeline_parallel/schedules.py(1458): backward_step_helper",
        "megatron/core/pipeline_parallel/schedules.py(218): forward_step_calc_loss",
        "tracekit/capture/frameworks/megatron.py(328): forward_step",
        "mymegatron/schedules.py(92): forward_step",
    ):
        assert table.match(name) is None, name


def test_a_table_of_markers_only_is_reported_beside_segmentation():
    names = {
        "megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving.steady": 3,
        "megatron.core.pipeline_parallel.p2p_communication.recv_forward": 12,
    }
    choice = choose(names, None)
    assert choice.used is None and choice.name == "megatron-nvtx"


def test_user_rules_come_before_the_builtins():
    custom = parse_rule(r"^PP:(?P<stage>\d+)F(?P<mb>\d+)$=F", "--label-rule")
    from tracekit.reconstruct.labels import custom_set

    choice = choose({"PP:0F1": 1, "PP:0B1": 1}, custom_set([custom]))
    assert choice.used.name == "custom"


def test_rule_errors_are_tracekit_errors():
    with pytest.raises(TracekitError):
        parse_rule("x(=F", "--label-rule")


def test_a_run_with_no_pipeline_says_what_it_saw():
    path = shared_or_skip("kineto-gpu", "hta_nccl_parser_config_nccl_data.json.gz")
    run = load(path)
    said = [w for w in run.warnings if w.startswith("no pipeline-parallel actions found")]
    assert len(said) == 1, run.warnings
    assert "1 rank(s) of 2" in said[0] and "`## forward ##` ×3" in said[0] and "--label-rule" in said[0]


def test_actions_that_do_not_add_up_are_said(loaded_runs):
    run, _ = loaded_runs(SAMPLES / "1f1b")
    assert count_problems(run.actions, run.schedule) == []
    dropped = run.actions.drop(run.actions.index[(run.actions["stage"] == 2) & (run.actions["kind"] == "B")][:1])
    problems = count_problems(dropped, run.schedule)
    assert len(problems) == 1 and "stage 2: 7 B of 8" in problems[0]


def test_late_posting_is_the_senders_and_a_slow_wire_the_links(loaded_runs, tmp_path):
    """1f1b_p2p_delay5ms (real): every send is posted 5 ms after it was requested (a sender
    thread holding it), so the latency is the sender's. The generated slow_link GPU run
    (tests/gpu_tracegen.py) moves data slowly on one link: the wire's."""
    from gpu_tracegen import SCENARIOS, generate
    from tracekit.analyze import analyze
    from tracekit.analyze.diagnosis import diagnose

    _, analysis = loaded_runs(SAMPLES / "1f1b_p2p_delay5ms")
    comm = next(f for f in diagnose(analysis) if f.cause == "comm")
    assert comm.figures["post_delay_share"] > 0.5
    assert comm.advice.startswith(f"The latency is rank {comm.figures['src_rank']}'s, not the link's")
    assert comm.figures["median_post_delay_ns"] >= 5_000_000
    folder, truth = generate(SCENARIOS["slow_link"], tmp_path)
    comm = next(f for f in diagnose(analyze(load(folder))) if f.cause == "comm")
    src, dst = truth["injected"]["link"]
    assert comm.figures["post_delay_share"] < 0.5
    assert comm.advice.startswith(f"The latency is link {src}->{dst}'s")


def test_hand_labelled_layers_group_into_the_schedules_actions(loaded_runs):
    """sample_traces/1f1b_layer_labels (real): torch's 1F1B with a `linear<i>(F)` range
    around every layer's forward and `linear<i>(B)` around its backward parts, inside a
    whole-step `1F1B` range. Each run of layer ranges between P2P ops is one action."""
    from test_unlabelled import one_f_one_b

    run, _ = loaded_runs(SAMPLES / "1f1b_layer_labels")
    assert run.labels == "layer-suffix" and run.actions_from == "labels"
    assert (run.schedule.name, run.schedule.p, run.schedule.v, run.schedule.m) == ("1F1B", 4, 1, 8)
    for (rank, _step), got in run.actions.sort_values("start_ns").groupby(["rank", "step"]):
        assert [(k, int(mb)) for k, mb in zip(got["kind"], got["microbatch"])] == one_f_one_b(int(rank), 4, 8)


def test_layer_labels_and_segmentation_read_the_same_run_alike(loaded_runs):
    """The same real trace read twice: by its layer labels, and with every label dropped
    (in memory, before reconstruction) by segmentation between P2P ops."""
    from tracekit.analyze import analyze
    from tracekit.ingest import read_run
    from tracekit.reconstruct.whole_run import reconstruct

    _, labelled = loaded_runs(SAMPLES / "1f1b_layer_labels")
    from tracekit.ingest.nesting import nesting_depth

    run = read_run(SAMPLES / "1f1b_layer_labels")
    names = run.events["name"].astype(str)
    labels = names.str.fullmatch(r"linear\d+\([FB]\)")
    assert labels.sum() > 0 and (names == "1F1B").sum() == 12
    # the per-layer labels gone, the whole-step "1F1B" range kept (a wrapper the segmentation
    # looks inside); depths as the parser would give them without the labels
    events = run.events[~labels.to_numpy()].reset_index(drop=True)
    gloo = events["name"].isin(["gloo:send", "gloo:recv"]).to_numpy()
    for rank in events["rank"].unique():
        mine = (events["rank"] == rank).to_numpy()
        e = events[mine]
        events.loc[mine, "depth"] = nesting_depth(
            e["pid"].to_numpy(),
            e["tid"].to_numpy(),
            e["start_ns"].to_numpy(),
            e["end_ns"].to_numpy(),
            transparent=gloo[mine],
        )
    run = reconstruct(replace(run, events=events))
    assert run.actions_from == "segmentation" and len(run.actions) == len(labelled.run.actions)
    segmented = analyze(run).summary.per_rank
    by_labels = labelled.summary.per_rank
    for rank in range(4):
        assert abs(segmented[rank].bubble_ratio - by_labels[rank].bubble_ratio) < 0.01, rank


def test_the_readmes_label_rules_are_valid():
    """The README's [tool.tracekit.labels] example and --label-rule examples are rules tracekit takes."""
    import re
    import tomllib
    from pathlib import Path

    from tracekit.reconstruct.labels import rule_of

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```toml\n(\[tool\.tracekit\.labels\]\n.*?)```", readme, re.S).group(1)
    table = tomllib.loads(block)["tool"]["tracekit"]["labels"]
    rules = [rule_of(pattern, kind, "README") for pattern, kind in table.items()]
    assert rules[0].parse("F_3", 1) == [("F", 1, 3)]
    flags = re.findall(r"--label-rule '([^']+)'", readme)
    assert len(flags) >= 2
    forward = parse_rule(flags[0], "README")
    assert forward.parse("fwd_s2_mb5", 0) == [("F", 2, 5)]
