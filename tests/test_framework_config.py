"""What-if advice in the framework's own words: which framework ran, and every name the config
lines hold checked against that framework's source.

The names are checked two ways. Against the installed source where the framework is installed
(torch's pipelining always is with the ``capture`` extra; megatron-core and DeepSpeed where a
developer installed them: their tests skip otherwise). And always against the lists below,
each name with the upstream commit, file and line it was read from: Megatron-LM's training
flags live in megatron/training/arguments.py and its config dataclasses, which the
megatron-core wheel does not ship; torchtitan does not install here at all.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import math
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES
from tracekit import load
from tracekit.analyze.framework import detect_framework
from tracekit.analyze.framework_config import (
    RunFacts,
    Target,
    config_lines,
    deepspeed_uniform,
    megatron_layout,
    torchtitan_fqns,
)
from tracekit.cli import main
from tracekit.model import schedules as traits
from tracekit.model.frameworks import FRAMEWORKS

SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "whatif.schema.json").read_text())

# --- the frameworks' names, read from their sources -------------------------------------------

# NVIDIA/Megatron-LM: argparse flags of pretrain_gpt.py. Flags generated from a config
# dataclass field get "--" + the field name with "_" as "-" (megatron/training/argument_utils.py:95).
MEGATRON_LM_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_FLAGS = {
    "--pipeline-model-parallel-size": "megatron/core/model_parallel_config.py:83 (field pipeline_model_parallel_size)",
    "--num-layers": "megatron/core/transformer/transformer_config.py:65 (field num_layers)",
    "--decoder-first-pipeline-num-layers": "megatron/training/arguments.py:3095",
    "--decoder-last-pipeline-num-layers": "megatron/training/arguments.py:3099",
    "--pipeline-model-parallel-layout": "megatron/training/arguments.py:3103",
    "--num-layers-per-virtual-pipeline-stage": "megatron/training/arguments.py:3114",
    "--num-virtual-stages-per-pipeline-rank": "megatron/training/arguments.py:3116",
    "--micro-batch-size": "megatron/training/config/training_config.py:11 (field micro_batch_size)",
    "--global-batch-size": "megatron/training/config/training_config.py:15 (field global_batch_size)",
}
# The megatron-core config fields behind those flags (what an installed megatron-core holds).
MEGATRON_CORE_FIELDS = {
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--num-layers": "num_layers",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--num-layers-per-virtual-pipeline-stage": "virtual_pipeline_model_parallel_size",
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
}
# pytorch/torchtitan: ParallelismConfig and TrainingConfig fields, given as --<section>.<field>
# (tests/unit_tests/test_no_new_cli_options.py at the same commit lists every one of them).
TORCHTITAN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
TORCHTITAN_KEYS = {
    "parallelism.pipeline_parallel_degree": "torchtitan/config/configs.py:180",
    "parallelism.module_fqns_per_model_part": "torchtitan/config/configs.py:187",
    "parallelism.pipeline_parallel_first_stage_less_layers": "torchtitan/config/configs.py:197",
    "parallelism.pipeline_parallel_last_stage_less_layers": "torchtitan/config/configs.py:203",
    "parallelism.pipeline_parallel_layers_per_stage": "torchtitan/config/configs.py:209",
    "parallelism.pipeline_parallel_schedule": "torchtitan/config/configs.py:216",
    "parallelism.num_pp_microbatches": "torchtitan/config/configs.py:232",
    "training.num_tokens_per_microbatch_per_dp_rank": "torchtitan/config/configs.py:37",
}
# deepspeedai/DeepSpeed: PipelineModule's arguments and the config keys.
DEEPSPEED_COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
DEEPSPEED_NAMES = {
    "PipelineModule": "deepspeed/runtime/pipe/module.py:86",
    "num_stages": "deepspeed/runtime/pipe/module.py:127",
    "partition_method": "deepspeed/runtime/pipe/module.py:133",
    "train_batch_size": "deepspeed/runtime/constants.py:19",
    "train_micro_batch_size_per_gpu": "deepspeed/runtime/constants.py:95",
    "gradient_accumulation_steps": "deepspeed/runtime/constants.py:107",
}
KNOWN = {"megatron": set(MEGATRON_FLAGS), "torchtitan": set(TORCHTITAN_KEYS), "deepspeed": set(DEEPSPEED_NAMES)}
# torch.distributed.pipelining's names are checked against the installed torch.
TORCH_NAMES = {"PipelineStage", "stage_index", "num_stages", "n_microbatches", "pipeline", "split_spec", "SplitPoint"}
TORCH_NAMES |= {"BEGINNING"} | {s.runner for s in traits.SCHEDULES if not s.design}


def _targets():
    """A grid of recommendations: every schedule what-if generates, v, m up and down, both
    keeps, the measured split, even, first/last-shaped and irregular splits."""
    splits = {1: [None, (4, 4, 4, 4), (5, 4, 4, 3), (3, 4, 4, 5), (6, 4, 3, 3), (1, 1, 1, 13)]}
    splits[2] = [None, (2,) * 8, (3, 2, 2, 1, 3, 2, 2, 1), (3, 1, 2, 2, 1, 3, 2, 2)]
    for schedule in traits.names(generated=True):
        for v in (1, 2) if traits.BY_NAME[schedule].chunks != "one" else (1,):
            if traits.BY_NAME[schedule].chunks == "two" and v != 2:
                continue
            for m, keep, split in itertools.product((4, 8, 16, 12), ("global-batch", "microbatch"), splits[v]):
                yield Target(f"{schedule} v={v} m={m}", schedule, 4, v, m, keep, split)


FACTS = [RunFacts(8, 1, 16, 8), RunFacts(8, 2, None, None), RunFacts(8, 1, 16, 3)]


def _every_config():
    for framework in FRAMEWORKS:
        for target, facts in itertools.product(_targets(), FACTS):
            yield config_lines(framework, target, facts)


def _megatron_tokens(config) -> set[str]:
    """Every --flag the Megatron lines, notes and reasons mention, but tracekit's own (--keep)."""
    from tracekit.commands.whatif import command

    tracekit_flags = {opt for param in command.params for opt in param.opts}
    texts = [line.text for line in config.lines] + [line.note for line in config.lines]
    texts += list(config.notes) + list(config.cannot)
    return {token for text in texts for token in re.findall(r"--[a-z][a-z0-9-]+", text)} - tracekit_flags


def test_every_name_emitted_is_the_frameworks():
    seen: dict[str, set[str]] = {name: set() for name in FRAMEWORKS}
    for config in _every_config():
        for line in config.lines:
            assert line.names, line
            seen[config.framework] |= set(line.names)
            for name in line.names:  # each name is in the line it belongs to
                assert name.removeprefix("parallelism.").removeprefix("training.") in line.text
        if config.framework == "megatron":
            seen["megatron"] |= _megatron_tokens(config)
    for framework, known in KNOWN.items():
        assert seen[framework] <= known, (framework, seen[framework] - known)
    assert seen["torch"] <= TORCH_NAMES, seen["torch"] - TORCH_NAMES
    # the grid reaches every name: a name the writers never use is no name to keep
    assert seen["megatron"] == set(MEGATRON_FLAGS)
    assert seen["torchtitan"] == set(TORCHTITAN_KEYS)
    assert seen["deepspeed"] == set(DEEPSPEED_NAMES)


def test_torch_names_are_in_the_installed_torch():
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    from torch.distributed.pipelining.schedules import get_schedule_class

    for schedule in traits.SCHEDULES:
        if schedule.design:
            continue
        cls = getattr(pipelining, schedule.runner)
        assert "n_microbatches" in inspect.signature(cls.__init__).parameters, schedule.runner
    stage = inspect.signature(pipelining.PipelineStage.__init__).parameters
    assert {"stage_index", "num_stages"} <= set(stage)
    assert "split_spec" in inspect.signature(pipelining.pipeline).parameters
    assert pipelining.SplitPoint.BEGINNING
    # torchtitan's pipeline_parallel_schedule takes torch's get_schedule_class names
    from tracekit.analyze.framework_config import TORCHTITAN_SCHEDULES

    for name in TORCHTITAN_SCHEDULES:
        assert get_schedule_class(name).__name__ == traits.BY_NAME[name].runner


def _installed(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def test_megatron_flags_are_fields_of_the_installed_megatron_core():
    core = _installed("megatron.core")
    if core is None:
        pytest.skip("megatron-core is not installed (pip install 'tracekit[megatron]')")
    source = (core / "model_parallel_config.py").read_text() + (
        core / "transformer" / "transformer_config.py"
    ).read_text()
    for flag, name in MEGATRON_CORE_FIELDS.items():
        assert re.search(rf"^    {name}: ", source, re.M), (flag, name)


def test_deepspeed_names_are_in_the_installed_deepspeed():
    root = _installed("deepspeed")
    if root is None:
        pytest.skip("DeepSpeed is not installed (pip install 'tracekit[deepspeed]')")
    module = (root / "runtime" / "pipe" / "module.py").read_text()
    assert re.search(r"^class PipelineModule\(", module, re.M)
    assert re.search(r"\bnum_stages=None", module) and re.search(r"\bpartition_method='parameters'", module)
    assert "method == 'uniform'" in module
    constants = (root / "runtime" / "constants.py").read_text()
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert f'"{key}"' in constants, key


# --- the lines are valid for the recommendation ----------------------------------------------


def _layout_stages(layout: str) -> list[str]:
    """Megatron's layout string unrolled (x*N is N x's), one string per stage."""
    return [re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), stage) for stage in layout.split("|")]


def _megatron_split(config, n_layers: int, p: int, v: int) -> list[int]:
    """The split Megatron builds from these lines, by its documented rules: a layout lists
    every stage; else the first/last ranks take their counts, the middle ranks the rest evenly,
    a rank's count split evenly over its v chunks; else every stage the same."""
    flags = dict(line.text.split(" ", 1) for line in config.lines)
    if "--pipeline-model-parallel-layout" in flags:
        stages = _layout_stages(flags["--pipeline-model-parallel-layout"].strip("'"))
        assert stages[0].startswith("E") and stages[-1].endswith("L")
        assert "".join(stages).count("E") == 1 and "".join(stages).count("L") == 1
        return [s.count("t") for s in stages]
    first = int(flags.get("--decoder-first-pipeline-num-layers", 0)) or None
    last = int(flags.get("--decoder-last-pipeline-num-layers", 0)) or None
    given = [r for r, n in ((0, first), (p - 1, last)) if n is not None]
    middle = (n_layers - (first or 0) - (last or 0)) // max(1, p - len(given))
    per_rank = [first if r == 0 and first else last if r == p - 1 and last else middle for r in range(p)]
    return [per_rank[s % p] // v for s in range(p * v)]


@pytest.mark.parametrize(
    ("split", "v", "flags"),
    [
        ((4, 4, 4, 4), 1, set()),
        ((5, 4, 4, 3), 1, {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}),
        ((3, 4, 4, 5), 1, {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}),
        ((4, 4, 4, 8), 1, {"--decoder-last-pipeline-num-layers"}),
        ((6, 4, 3, 3), 1, {"--pipeline-model-parallel-layout"}),
        ((2,) * 8, 2, {"--num-layers-per-virtual-pipeline-stage"}),
        (
            (3, 2, 2, 1, 3, 2, 2, 1),
            2,
            {
                "--decoder-first-pipeline-num-layers",
                "--decoder-last-pipeline-num-layers",
                "--num-virtual-stages-per-pipeline-rank",
            },
        ),
        ((3, 1, 2, 2, 1, 3, 2, 2), 2, {"--pipeline-model-parallel-layout"}),
    ],
)
def test_megatron_lines_build_the_split(split, v, flags):
    config = config_lines(
        "megatron", Target("x", "1F1B" if v == 1 else "Interleaved1F1B", 4, v, 8, "global-batch", split), FACTS[0]
    )
    emitted = {line.names[0] for line in config.lines}
    assert emitted - {"--pipeline-model-parallel-size", "--num-layers"} == flags
    assert f"--num-layers {sum(split)}" in [line.text for line in config.lines]
    assert _megatron_split(config, sum(split), 4, v) == list(split)
    assert not config.cannot


def test_megatron_lines_build_the_split_in_the_installed_megatron_core():
    """The same lines, given to megatron-core's own TransformerConfig (its checks run in
    __post_init__) and its own layer count per (rank, virtual stage)."""
    pytest.importorskip("megatron.core.transformer.transformer_block")
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    p = 4
    for split, v in [
        ((5, 4, 4, 3), 1),
        ((6, 4, 3, 3), 1),
        ((3, 2, 2, 1, 3, 2, 2, 1), 2),
        ((3, 1, 2, 2, 1, 3, 2, 2), 2),
    ]:
        config = config_lines(
            "megatron", Target("x", "1F1B" if v == 1 else "Interleaved1F1B", p, v, 8, "global-batch", split), FACTS[0]
        )
        flags = dict(line.text.split(" ", 1) for line in config.lines)
        layout = flags.get("--pipeline-model-parallel-layout", "").strip("'") or None
        first = flags.get("--decoder-first-pipeline-num-layers")
        last = flags.get("--decoder-last-pipeline-num-layers")
        built = TransformerConfig(
            num_layers=int(flags["--num-layers"]),
            hidden_size=8,
            num_attention_heads=1,
            pipeline_dtype=torch.float32,
            pipeline_model_parallel_size=int(flags["--pipeline-model-parallel-size"]),
            virtual_pipeline_model_parallel_size=int(flags["--num-virtual-stages-per-pipeline-rank"])
            if "--num-virtual-stages-per-pipeline-rank" in flags
            else None,
            num_layers_in_first_pipeline_stage=None if first is None else int(first),
            num_layers_in_last_pipeline_stage=None if last is None else int(last),
            pipeline_model_parallel_layout=layout,
        )
        if layout is not None:
            per_stage = [
                built.pipeline_model_parallel_layout.layout[s % p][s // p].count(LayerType.decoder)
                for s in range(p * v)
            ]
        else:
            per_stage = [
                get_num_layers_to_build(built, vp_stage=(s // p if v > 1 else None), pp_rank=s % p)
                for s in range(p * v)
            ]
        assert per_stage == list(split), (split, flags)


def test_megatron_says_which_schedules_and_batches_it_cannot_run():
    for schedule in ("GPipe", "ZB-H1", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        v = traits.chunks_per_rank(schedule, several=2)
        config = config_lines("megatron", Target("x", schedule, 4, v, 8, "global-batch"), FACTS[0])
        assert not config.lines and config.cannot and schedule in config.cannot[0]
    # 3 samples a microbatch at m=8, the same global batch in 16 microbatches: 1.5 samples each, refused
    config = config_lines("megatron", Target("x", "1F1B", 4, 1, 16, "global-batch"), FACTS[2])
    assert any("not a whole number" in c for c in config.cannot)
    # m = global batch / (micro batch x DP): the global batch kept, the micro batch halved
    config = config_lines("megatron", Target("x", "1F1B", 4, 1, 16, "global-batch"), FACTS[0])
    assert {"--micro-batch-size 4", "--global-batch-size 64"} <= {line.text for line in config.lines}
    config = config_lines("megatron", Target("x", "1F1B", 4, 1, 16, "microbatch"), FACTS[0])
    assert "--global-batch-size 128" in {line.text for line in config.lines}
    # unknown sizes: a placeholder that says what to put, never a made-up number
    config = config_lines("megatron", Target("x", "1F1B", 4, 1, 16, "global-batch"), FACTS[1])
    (line,) = [line for line in config.lines if line.names == ("--micro-batch-size",)]
    assert line.placeholder and "<the run's x 1/2>" in line.text and "DP 2" in line.note


def test_megatron_layout_string():
    assert megatron_layout([6, 4, 3, 3]) == "Et*6|t*4|t*3|t*3L"
    assert megatron_layout([1, 2]) == "Et|t*2L"
    assert [s.count("t") for s in _layout_stages(megatron_layout([1, 5, 1, 9]))] == [1, 5, 1, 9]


def test_torchtitan_lines_build_the_split():
    facts = FACTS[0]
    for split, v in [((4, 4, 4, 4), 1), ((2,) * 8, 2)]:
        config = config_lines(
            "torchtitan", Target("x", "1F1B" if v == 1 else "Interleaved1F1B", 4, v, 8, "global-batch", split), facts
        )
        values = {line.names[0]: line.text.split(" ")[1] for line in config.lines}
        per_stage = int(values["parallelism.pipeline_parallel_layers_per_stage"])
        first = int(values["parallelism.pipeline_parallel_first_stage_less_layers"])
        last = int(values["parallelism.pipeline_parallel_last_stage_less_layers"])
        # torchtitan's stage count from a layers-per-stage (pipeline_parallel.py, _get_pipeline_metadata)
        assert math.ceil((16 + first + last) / per_stage) == 4 * v
        assert per_stage == split[0]
    config = config_lines("torchtitan", Target("x", "1F1B", 4, 1, 8, "global-batch", (6, 4, 3, 3)), facts)
    (line,) = [line for line in config.lines if line.names == ("parallelism.module_fqns_per_model_part",)]
    parts = eval(line.text.split(" = ", 1)[1])  # the line is a Python literal
    assert parts == torchtitan_fqns([6, 4, 3, 3])
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == [6, 4, 3, 3]
    assert [name for part in parts for name in part] == [
        "tok_embeddings",
        *(f"layers.{i}" for i in range(16)),
        "norm",
        "lm_head",
    ]
    config = config_lines("torchtitan", Target("x", "ZB-H1", 4, 1, 8, "global-batch"), facts)
    assert not config.lines and "at least 2 stages a rank" in config.cannot[0]


def test_deepspeed_lines_and_what_they_cannot_say():
    assert deepspeed_uniform(16, 4) == [4, 4, 4, 4]
    assert deepspeed_uniform(18, 4) == [5, 5, 4, 4]  # the first layers % stages stages one more
    assert deepspeed_uniform(6, 4) == [2, 2, 1, 1]
    config = config_lines("deepspeed", Target("x", "1F1B", 4, 1, 8, "global-batch", (5, 5, 4, 4)), FACTS[0])
    assert "partition_method='uniform'" in config.lines[0].text and not config.cannot
    config = config_lines("deepspeed", Target("x", "1F1B", 4, 1, 8, "global-batch", (6, 4, 3, 3)), FACTS[0])
    assert "[0, 6, 10, 13, 16]" in config.cannot[0] and "no partition_method" in config.cannot[0]
    config = config_lines("deepspeed", Target("x", "1F1B", 4, 1, 16, "global-batch"), FACTS[0])
    assert {'"gradient_accumulation_steps": 16', '"train_micro_batch_size_per_gpu": 4', '"train_batch_size": 64'} <= {
        line.text for line in config.lines
    }
    for schedule, v in (("Interleaved1F1B", 2), ("GPipe", 1), ("ZBVZeroBubble", 2)):
        config = config_lines("deepspeed", Target("x", schedule, 4, v, 8, "global-batch"), FACTS[0])
        assert not config.lines and "TrainSchedule" in config.cannot[0]


def test_torch_lines_place_the_stages():
    config = config_lines("torch", Target("x", "ZBVZeroBubble", 4, 2, 8, "global-batch"), FACTS[0])
    texts = [line.text for line in config.lines]
    assert "(r, 7 - r)" in texts[0] and "ScheduleZBVZeroBubble(stages, n_microbatches=8" in texts[1]
    config = config_lines("torch", Target("x", "1F1B", 4, 1, 16, "global-batch", (6, 4, 3, 3)), FACTS[0])
    texts = [line.text for line in config.lines]
    assert texts[0].startswith("schedule = Schedule1F1B(stage, n_microbatches=16")
    assert re.findall(r'"layers\.(\d+)"', texts[1]) == ["6", "10", "13"]
    config = config_lines("torch", Target("x", "ZB-H1", 4, 1, 8, "global-batch"), FACTS[0])
    assert "ScheduleInterleavedZeroBubble([stage]," in config.lines[0].text


# --- which framework ran ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded():
    return {name: load(SAMPLES / name) for name in ("megatron_1f1b", "deepspeed_1f1b", "1f1b", "interleaved1f1b")}


def test_the_samples_frameworks(loaded):
    assert detect_framework(loaded["megatron_1f1b"]).evidence == (
        "capture.json",
        "Megatron's process-group descriptions",
    )
    assert detect_framework(loaded["deepspeed_1f1b"]).name == "deepspeed"
    assert detect_framework(loaded["1f1b"]).name == "torch"
    assert detect_framework(loaded["1f1b"], "torchtitan").evidence == ("--framework",)


def _copy_traces(sample: str, folder: Path, name: str = "rank{}.json.gz") -> Path:
    """The sample's traces without its capture.json: what the traces alone say."""
    folder.mkdir(parents=True)
    for trace in sorted((SAMPLES / sample).glob("rank*.json.gz")):
        shutil.copy(trace, folder / name.format(re.search(r"\d+", trace.name).group()))
    return folder


def test_frameworks_from_the_traces_alone(tmp_path):
    megatron = load(_copy_traces("megatron_1f1b", tmp_path / "megatron"))
    assert detect_framework(megatron).evidence == ("Megatron's process-group descriptions",)
    torch_pp = load(_copy_traces("interleaved1f1b", tmp_path / "torch"))
    assert detect_framework(torch_pp).evidence == ("label table torch-pp",)
    # torchtitan's profiler folders: iteration_<N>/rank<R>_trace.json.gz (torchtitan/tools/profiler.py)
    titan = tmp_path / "titan"
    _copy_traces("interleaved1f1b", titan / "profiling" / "traces" / "iteration_10", "rank{}_trace.json.gz")
    found = detect_framework(load(titan))
    assert found.name == "torchtitan" and "label table torch-pp" in found.evidence
    # DeepSpeed on the CPU leaves nothing of its own in a trace: not recognised, and said how to name it
    deepspeed = detect_framework(load(_copy_traces("deepspeed_1f1b", tmp_path / "deepspeed")))
    assert deepspeed.name is None and "--framework megatron|torchtitan|deepspeed|torch" in deepspeed.line()


# --- the command line, on the samples ---------------------------------------------------------


def _whatif(*args: str) -> str:
    result = CliRunner().invoke(main, ["whatif", *args, "--replays", "4", "--no-progress"])
    assert result.exit_code == 0, result.output
    return result.output


def _check_names(doc: dict) -> None:
    for config in doc["framework"]["configs"]:
        names = {n for line in config["lines"] for n in line["names"]}
        framework = config["framework"]
        assert names <= (TORCH_NAMES if framework == "torch" else KNOWN[framework]), names


@pytest.mark.parametrize(
    ("sample", "framework", "expected"),
    [
        ("megatron_1f1b", "megatron", "--pipeline-model-parallel-size 4"),
        ("megatron_interleaved", "megatron", "--pipeline-model-parallel-size 4"),
        ("deepspeed_1f1b", "deepspeed", '"gradient_accumulation_steps": 16'),
        ("1f1b", "torch", "n_microbatches=16"),
    ],
)
def test_whatif_prints_the_frameworks_lines(sample, framework, expected):
    console = _whatif(str(SAMPLES / sample))
    assert f"framework: {FRAMEWORKS[framework]} (capture.json" in console
    assert f"as {FRAMEWORKS[framework]} config:" in console
    doc = json.loads(_whatif(str(SAMPLES / sample), "--json"))
    jsonschema.validate(doc, SCHEMA)
    assert doc["framework"]["name"] == framework
    # every row a user could run has its lines
    assert [c["label"] for c in doc["framework"]["configs"]] == [p["label"] for p in doc["predictions"]]
    _check_names(doc)
    assert expected in console or any(
        expected in line["text"] for c in doc["framework"]["configs"] for line in c["lines"]
    )


def test_deepspeed_names_the_fastest_row_it_can_run():
    console = _whatif(str(SAMPLES / "deepspeed_1f1b"), "-s", "1F1B", "-s", "Interleaved1F1B", "-m", "8")
    assert "cannot: Interleaved1F1B v=2: DeepSpeed's pipeline engine runs one schedule" in console
    assert "fastest step DeepSpeed runs: 1F1B v=1 m=8" in console


def _layer_costs(tmp_path: Path) -> Path:
    """16 equal layers (a generated cost file): the split is the test's, not the layer finder's."""
    path = tmp_path / "generated_layer_costs.json"
    path.write_text(json.dumps({"layers": [{"forward_ns": 3_000_000, "backward_ns": 6_000_000}] * 16}))
    return path


@pytest.mark.parametrize(
    ("sample", "framework", "split", "expected"),
    [
        (
            "megatron_1f1b",
            None,
            "5,4,4,3",
            ["--decoder-first-pipeline-num-layers 5", "--decoder-last-pipeline-num-layers 3"],
        ),
        ("megatron_1f1b", None, "6,4,3,3", ["--pipeline-model-parallel-layout 'Et*6|t*4|t*3|t*3L'"]),
        ("deepspeed_1f1b", None, "6,4,3,3", ["cannot: split 6,4,3,3: no partition_method gives it"]),
        ("1f1b", "torchtitan", "6,4,3,3", ["parallelism.module_fqns_per_model_part = [['tok_embeddings', 'layers.0'"]),
    ],
)
def test_whatif_split_in_the_frameworks_lines(tmp_path, sample, framework, split, expected):
    args = [str(SAMPLES / sample), "--layer-costs", str(_layer_costs(tmp_path)), "--split", split, "--balanced"]
    args += ["--framework", framework] if framework else []
    console = _whatif(*args)
    for text in expected:
        assert text in console
    doc = json.loads(_whatif(*args, "--json"))
    jsonschema.validate(doc, SCHEMA)
    _check_names(doc)
    by_label = {c["label"]: c for c in doc["framework"]["configs"]}
    given = doc["split"]["given"][0]
    assert by_label[f"1F1B v=1 m=8 split {split}"]["split"] == given["split"]
    best = doc["split"]["searches"][0]["recommended"]
    assert by_label[f"1F1B v=1 m=8 best split {','.join(map(str, best['split']))}"]["split"] == best["split"]
