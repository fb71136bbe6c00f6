"""tracekit export --tables / --tensorboard, and tracekit.analyze.tabular: the files and the
DataFrames carry the analysis's own figures (the JSON report's), typed and documented.

Runs: the captured sample run sample_traces/1f1b_slow_stage2 (CPU, gloo) and a GENERATED GPU
run (tests/gpu_tracegen.py, scenario slow_link: the 1->2 link takes 400 us per message, not a
real trace)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from gpu_tracegen import SCENARIOS, generate
from tracekit.analyze import analyze
from tracekit.analyze.attribution import CATEGORIES
from tracekit.analyze.tabular import TABLES, step_scalars, table_names, tables
from tracekit.cli import main
from tracekit.render.json import to_document

SLOW_STAGE2 = SAMPLES / "1f1b_slow_stage2"
CAUSE_COLUMNS = [f"{c}_ns" for c in CATEGORIES]
PANDAS_DTYPES = {"int64": "int64", "Int64": "Int64", "float64": "float64", "string": "string"}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cached(monkeypatch, loaded_runs):
    """The command loads the sample run from the session's copy (its loading is tested elsewhere)."""
    monkeypatch.setattr("tracekit.commands.export.load_with_progress", lambda path, *_: loaded_runs(Path(path))[0])


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """The generated slow_link GPU run: (folder, analysis)."""
    from tracekit import load

    folder, _ = generate(SCENARIOS["slow_link"], tmp_path_factory.mktemp("tables_gpu"))
    return folder, analyze(load(folder))


def _check_against_document(frames: dict[str, pd.DataFrame], doc: dict) -> None:
    """The tables' figures are the JSON report's: per rank and step, per rank, per cause."""
    bubbles, attribution = frames["bubbles"], frames["attribution"]
    per_step = {(step["step"], r["rank"]): r for step in doc["steps"] for r in step["ranks"]}
    assert len(bubbles) == len(per_step)
    for row in bubbles.itertuples(index=False):
        want = per_step[(row.step, row.rank)]
        assert (row.window_ns, row.busy_ns, row.idle_ns) == (want["window_ns"], want["busy_ns"], want["idle_ns"])
        assert row.bubble_ratio == pytest.approx(want["bubble_ratio"], abs=1e-6)
    idle_per_rank = bubbles.groupby("rank")["idle_ns"].sum()
    assert {r["rank"]: r["idle_ns"] for r in doc["ranks"]} == {int(r): int(v) for r, v in idle_per_rank.items()}
    # the causes sum to each rank's idle exactly, and are the report's
    assert (attribution[CAUSE_COLUMNS].sum(axis=1) == attribution["idle_ns"]).all()
    merged = attribution.merge(bubbles, on=["rank", "step"], suffixes=("", "_bubbles"))
    assert len(merged) == len(attribution) == len(bubbles)
    assert (merged["idle_ns"] == merged["idle_ns_bubbles"]).all()
    causes = attribution.groupby("rank")[CAUSE_COLUMNS].sum()
    assert {r["rank"]: r["causes"] for r in doc["ranks"]} == {
        int(rank): {c: int(v) for c, v in row.items()} for rank, row in causes.iterrows()
    }
    # blame rows split the rank's imbalance and comm shares exactly, and add up to the report's blame
    by_rank_step = attribution.set_index(["rank", "step"])
    for blame, column in ((frames["stage_blame"], "imbalance_ns"), (frames["link_blame"], "comm_ns")):
        sums = blame.groupby(["rank", "step"])[column].sum()
        for key, total in sums.items():
            assert total == by_rank_step.at[key, column]
    stage_totals = frames["stage_blame"].groupby("stage")["imbalance_ns"].sum()
    assert {s["stage"]: s["imbalance_ns"] for s in doc["blame"]["stages"]} == {
        int(k): int(v) for k, v in stage_totals.items()
    }


def _check_types(frames: dict[str, pd.DataFrame]) -> None:
    for name, frame in frames.items():
        spec = TABLES[name]
        assert list(frame.columns) == list(spec.columns), name
        for column, (dtype, doc) in spec.columns.items():
            assert str(frame[column].dtype) == PANDAS_DTYPES[dtype], f"{name}.{column}: {frame[column].dtype}"
            assert doc, f"{name}.{column} has no documentation"


def test_the_tables_carry_the_reports_figures(loaded_runs):
    run, analysis = loaded_runs(SLOW_STAGE2)
    frames = tables(analysis)
    assert list(frames) == table_names(on_device=False)
    assert "device_pairs" not in frames  # a CPU run has no device tables
    _check_types(frames)
    _check_against_document(frames, to_document(analysis))
    assert len(frames["actions"]) == len(run.actions) and len(frames["messages"]) == len(run.messages)
    actions = frames["actions"]
    assert (actions["compute_ns"] == actions["end_ns"] - actions["start_ns"]).all()
    assert (actions["host_start_ns"] == actions["start_ns"]).all()  # host timeline: the spans are the host's
    assert set(actions["kind"]) == {"F", "B"}
    # 1f1b_slow_stage2: stage 2 runs slow, so it is the stage most blamed for imbalance
    blamed = frames["stage_blame"].groupby("stage")["imbalance_ns"].sum()
    assert int(blamed.idxmax()) == 2


def test_export_writes_parquet_and_csv_that_pandas_reads_back(tmp_path, cached, loaded_runs):
    out = tmp_path / "tables"
    result = cli("export", SLOW_STAGE2, "--tables", out, "--csv")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 7 tables as Parquet and CSV" in result.output
    _, analysis = loaded_runs(SLOW_STAGE2)
    expected = tables(analysis)
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{ext}" for n in expected for ext in ("parquet", "csv"))
    for name, frame in expected.items():
        from_parquet = pd.read_parquet(out / f"{name}.parquet")
        pd.testing.assert_frame_equal(from_parquet, frame, check_dtype=True)
        dtypes = {column: PANDAS_DTYPES[dtype] for column, (dtype, _) in TABLES[name].columns.items()}
        # an empty field of a nullable integer column (a time since the step's start) is null
        nullable = [column for column, dtype in dtypes.items() if dtype == "Int64"]
        from_csv = pd.read_csv(
            out / f"{name}.csv", dtype=dtypes, keep_default_na=False, na_values={c: [""] for c in nullable}
        )
        pd.testing.assert_frame_equal(from_csv, frame, check_dtype=True)
        schema = pq.read_schema(out / f"{name}.parquet")
        assert schema.metadata[b"tracekit.table"] == name.encode()
        assert schema.metadata[b"tracekit.doc"].decode() == TABLES[name].doc
        assert schema.metadata[b"tracekit.timeline"] == b"host"
        for field in schema:
            assert field.metadata[b"doc"].decode() == TABLES[name].columns[field.name][1]
            assert (
                str(field.type)
                == {"int64": "int64", "Int64": "int64", "float64": "double", "string": "string"}[
                    TABLES[name].columns[field.name][0]
                ]
            )


def test_polars_and_duckdb_read_the_same_tables(tmp_path, cached, loaded_runs):
    out = tmp_path / "tables"
    assert cli("export", SLOW_STAGE2, "--tables", out).exit_code == 0
    bubbles = tables(loaded_runs(SLOW_STAGE2)[1])["bubbles"]
    readers = 0
    try:
        import polars
    except ImportError:
        polars = None
    if polars is not None:
        frame = polars.read_parquet(out / "bubbles.parquet")
        assert frame["idle_ns"].dtype == polars.Int64
        assert frame["idle_ns"].sum() == int(bubbles["idle_ns"].sum())
        readers += 1
    try:
        import duckdb
    except ImportError:
        duckdb = None
    if duckdb is not None:
        path = str(out / "attribution.parquet").replace("'", "''")
        idle, causes = duckdb.sql(f"select sum(idle_ns), sum({' + '.join(CAUSE_COLUMNS)}) from '{path}'").fetchall()[0]
        assert idle == causes == int(bubbles["idle_ns"].sum())
        readers += 1
    if not readers:
        pytest.skip("neither polars nor duckdb is installed (not tracekit dependencies); pandas is tested above")


def test_a_gpu_run_adds_the_device_tables(tmp_path, gpu_run):
    folder, analysis = gpu_run
    out = tmp_path / "tables"
    result = cli("export", folder, "--tables", out, "--no-progress")
    assert result.exit_code == 0, result.output
    frames = {name: pd.read_parquet(out / f"{name}.parquet") for name in table_names(on_device=True)}
    assert {p.stem for p in out.iterdir()} == set(frames)
    _check_types(frames)
    doc = to_document(analysis)
    _check_against_document(frames, doc)
    assert pq.read_schema(out / "actions.parquet").metadata[b"tracekit.timeline"] == b"device"
    actions = frames["actions"]
    assert (actions["compute_ns"] <= actions["end_ns"] - actions["start_ns"]).all()  # union of its kernels
    assert (actions["host_start_ns"] != actions["start_ns"]).any()
    pairs = frames["device_pairs"]
    assert _records(pairs) == doc["device"]["p2p_pairs"]
    # the generator's slow link (rank 1 -> 2) moves each message in 400 us; the others in 10 us
    slow = pairs[(pairs["src_rank"] == 1) & (pairs["dst_rank"] == 2)]
    assert len(slow) and (slow["transfer_ns"] - 400_000).abs().max() <= 1_000
    device_ranks = frames["device_ranks"].set_index("rank")
    for rank in doc["device"]["ranks"]:
        for column in ("launch_wait_ns", "step_end_ns", "p2p_wait_ns", "p2p_transfer_ns", "host_ahead_ns"):
            assert device_ranks.at[rank["rank"], column] == rank[column], (rank["rank"], column)
    steps = frames["device_steps"].groupby("rank")["p2p_wait_ns"].sum()
    assert steps.to_dict() == device_ranks["p2p_wait_ns"].to_dict()
    assert frames["collective_pairs"].empty  # a pipeline's SendRecv kernels are its messages


def _records(frame: pd.DataFrame) -> list[dict]:
    """The rows as the JSON report has them: without the columns every table adds (run_id, times in the step)."""
    frame = frame.drop(columns=[c for c in frame.columns if c == "run_id" or c.endswith("_in_step_ns")])
    return [{k: (v if isinstance(v, str) else int(v)) for k, v in row.items()} for row in frame.to_dict("records")]


def test_a_real_two_gpu_report_gives_its_collective_pairs_and_device_figures(tmp_path):
    """nsys-ai's real 2 x H100 report (read in place): no pipeline, 33 all_to_all SendRecv pairs."""
    report = shared_or_skip("nsys", "nsysai_mfu_2gpu_before.sqlite")
    out = tmp_path / "tables"
    result = cli("export", report, "--tables", out, "--no-progress")
    assert result.exit_code == 0, result.output
    frames = {name: pd.read_parquet(out / f"{name}.parquet") for name in table_names(on_device=True)}
    _check_types(frames)
    from tracekit import load

    doc = to_document(analyze(load(report)))
    assert _records(frames["collective_pairs"]) == doc["device"]["collective_pairs"]
    assert len(frames["collective_pairs"]) == 33
    assert frames["actions"].empty and frames["attribution"].empty
    ranks = frames["device_ranks"].set_index("rank")
    for rank in doc["device"]["ranks"]:
        assert ranks.at[rank["rank"], "launch_wait_ns"] == rank["launch_wait_ns"] > 0
        assert ranks.at[rank["rank"], "host_ahead_ns"] == rank["host_ahead_ns"]
    idle_per_rank = frames["bubbles"].groupby("rank")["idle_ns"].sum().to_dict()
    assert idle_per_rank == {r["rank"]: r["idle_ns"] for r in doc["ranks"]}


@pytest.mark.parametrize("where", ["run", "inside", "file"])
def test_a_tables_folder_in_the_run_or_on_a_file_is_refused_before_any_work(tmp_path, where):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for trace in SLOW_STAGE2.iterdir():
        (run_dir / trace.name).symlink_to(trace)  # the sample run read in place, through links
    target = {"run": run_dir, "inside": run_dir / "tables", "file": run_dir / "rank0.json.gz"}[where]
    before = sorted(os.listdir(run_dir))
    result = cli("export", run_dir, "--tables", target, "--no-progress")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: --tables "), result.output
    assert {"run": "is the run folder", "inside": "inside the run folder", "file": "is a file"}[where] in lines[0]
    assert sorted(os.listdir(run_dir)) == before


def test_a_table_file_linked_to_a_trace_is_refused(tmp_path, cached):
    out = tmp_path / "tables"
    out.mkdir()
    (out / "bubbles.parquet").symlink_to((SLOW_STAGE2 / "rank0.json.gz").resolve())
    result = cli("export", SLOW_STAGE2, "--tables", out)
    assert result.exit_code == 2
    assert "one of the run's input traces" in result.output
    assert not (out / "actions.parquet").exists()


def test_export_needs_an_output_and_csv_needs_tables(cached):
    nothing = cli("export", SLOW_STAGE2)
    assert nothing.exit_code == 2 and "give -o FILE, --tables DIR or --tensorboard LOGDIR" in nothing.output
    csv = cli("export", SLOW_STAGE2, "--csv", "-o", "/dev/null")
    assert csv.exit_code == 2 and "give --tables DIR" in csv.output


def test_without_tensorboard_the_error_says_what_to_install(tmp_path, cached, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    result = cli("export", SLOW_STAGE2, "--tensorboard", tmp_path / "logs")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "tracekit: error: --tensorboard needs the tensorboard package: pip install 'tracekit[tensorboard]'"
    )
    assert not (tmp_path / "logs").exists()


def close(want: float):
    """TensorBoard stores simple values as float32."""
    return pytest.approx(want, rel=1e-6, abs=1e-6)


def _read_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed (pip install 'tracekit[tensorboard]')",
    )
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: {e.step: e.value for e in accumulator.Scalars(tag)} for tag in accumulator.Tags()["scalars"]}


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_tensorboard_scalars_read_back_equal_the_analysis(tmp_path, cached, loaded_runs, gpu_run, which):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'tracekit[tensorboard]')")
    if which == "cpu":
        folder, analysis = SLOW_STAGE2, loaded_runs(SLOW_STAGE2)[1]
    else:
        folder, analysis = gpu_run
    logdir = tmp_path / "logs" / "pipeline"
    result = cli("export", folder, "--tensorboard", logdir, "--no-progress")
    assert result.exit_code == 0, result.output
    assert len(list(logdir.iterdir())) == 1
    scalars = _read_scalars(logdir)
    doc = to_document(analysis)
    steps = [s["step"] for s in doc["steps"]]
    for step in doc["steps"]:
        s = step["step"]
        assert scalars["pipeline/step_ms"][s] == close((step["window_end_ns"] - step["window_start_ns"]) / 1e6)
        idle = sum(r["idle_ns"] for r in step["ranks"])
        window = sum(r["window_ns"] for r in step["ranks"])
        assert scalars["pipeline/bubble_ratio"][s] == close(idle / window)
        for r in step["ranks"]:
            assert scalars[f"pipeline/rank_{r['rank']}/idle_ms"][s] == close(r["idle_ns"] / 1e6)
            for cause, ns in r["causes"].items():
                assert scalars[f"pipeline/rank_{r['rank']}/idle_{cause.removesuffix('_ns')}_ms"][s] == close(ns / 1e6)
    actions = analysis.run.actions
    actions = actions[actions["step"] >= 0]
    compute = actions["busy_ns"] if "busy_ns" in actions else actions["end_ns"] - actions["start_ns"]
    per_stage = compute.groupby([actions["step"], actions["stage"]]).sum()  # one pipeline: one rank a stage
    for (s, stage), ns in per_stage.items():
        assert scalars[f"pipeline/stage_{stage}/compute_ms"][s] == close(ns / 1e6)
    assert all(sorted(series) == steps for series in scalars.values())
    # exporting again replaces the run's event file: TensorBoard never shows its scalars twice
    assert cli("export", folder, "--tensorboard", logdir, "--no-progress").exit_code == 0
    assert len(list(logdir.iterdir())) == 1


def test_step_scalars_name_every_stage_and_cause(loaded_runs):
    _, analysis = loaded_runs(SLOW_STAGE2)
    scalars = step_scalars(analysis)
    tags = set(scalars["tag"])
    assert {f"pipeline/stage_{s}/compute_ms" for s in range(4)} <= tags
    assert {f"pipeline/rank_{r}/idle_{c}_ms" for r in range(4) for c in CATEGORIES} <= tags
    assert (scalars["wall_time_ns"] >= 0).all()  # the sample's traces are on the Unix clock
    per_step = scalars.groupby("step").size()
    assert per_step.nunique() == 1 and list(per_step.index) == sorted(analysis.bubbles["step"].unique())


def test_the_idle_intervals_table_is_the_merged_traces_intervals_with_their_blame(loaded_runs):
    """Each idle interval the merged trace shades, cut where its blame changes hands: per rank
    and step a cause's intervals add up to the attribution, a stage's (link's) to its blame."""
    from tracekit.analyze.intervals import idle_intervals

    _, analysis = loaded_runs(SLOW_STAGE2)
    frames = tables(analysis)
    intervals, attribution = frames["idle_intervals"], frames["attribution"]
    assert (intervals["duration_ns"] == intervals["end_ns"] - intervals["start_ns"]).all()
    assert (intervals["duration_ns"] > 0).all()
    per_cause = intervals.groupby(["rank", "step", "cause"])["duration_ns"].sum()
    for row in attribution.itertuples(index=False):
        for cause in CATEGORIES:
            assert per_cause.get((row.rank, row.step, cause), 0) == getattr(row, f"{cause}_ns")
    imbalance = intervals[intervals["cause"] == "imbalance"]
    assert (imbalance["blamed_stage"] >= 0).all() and (imbalance["blamed_src_rank"] == -1).all()
    by_stage = imbalance.groupby(["rank", "step", "blamed_stage"])["duration_ns"].sum()
    stage_blame = frames["stage_blame"].set_index(["rank", "step", "stage"])["imbalance_ns"]
    assert by_stage.to_dict() == stage_blame[stage_blame > 0].to_dict()
    comm = intervals[intervals["cause"] == "comm"]
    assert (comm["blamed_src_rank"] >= 0).all() and (comm["blamed_stage"] == -1).all()
    by_link = comm.groupby(["rank", "step", "blamed_src_rank", "blamed_dst_rank"])["duration_ns"].sum()
    link_blame = frames["link_blame"].set_index(["rank", "step", "src_rank", "dst_rank"])["comm_ns"]
    assert by_link.to_dict() == link_blame[link_blame > 0].to_dict()
    others = intervals[~intervals["cause"].isin(["imbalance", "comm"])]
    assert (others[["blamed_stage", "blamed_src_rank", "blamed_dst_rank"]] == -1).all().all()
    # the same time as the merged trace's slices: each of its intervals is covered end to end
    shaded = idle_intervals(analysis)
    assert int(shaded["end_ns"].sum() - shaded["start_ns"].sum()) == int(intervals["duration_ns"].sum())
    cuts = set(zip(intervals["rank"], intervals["start_ns"])) | set(zip(intervals["rank"], intervals["end_ns"]))
    assert set(zip(shaded["rank"], shaded["start_ns"])) <= cuts and set(zip(shaded["rank"], shaded["end_ns"])) <= cuts
    # stage 2 is the slow one: the imbalance idle is blamed on it
    assert int(imbalance.groupby("blamed_stage")["duration_ns"].sum().idxmax()) == 2


def test_every_table_names_its_run_and_gives_times_since_the_step_start(loaded_runs):
    _, analysis = loaded_runs(SLOW_STAGE2)
    frames = tables(analysis, run_id="slow")
    step_start = frames["bubbles"].groupby("step")["window_start_ns"].min()
    for name, frame in frames.items():
        assert (frame["run_id"] == "slow").all(), name
        for column in TABLES[name].step_times:
            since = frame[column] - frame["step"].map(step_start)
            assert (frame[column.removesuffix("_ns") + "_in_step_ns"] == since).all(), (name, column)
    assert (frames["bubbles"].groupby("step")["window_start_in_step_ns"].min() == 0).all()
    assert (tables(analysis)["actions"]["run_id"] == analysis.run.source).all()
    # the tables of two runs concatenate, and stay apart by their run_id
    both = pd.concat([frames["attribution"], tables(analysis, run_id="again")["attribution"]], ignore_index=True)
    assert both.groupby("run_id")["idle_ns"].sum().to_dict() == {
        "slow": int(analysis.bubbles["idle_ns"].sum()),
        "again": int(analysis.bubbles["idle_ns"].sum()),
    }


def test_a_time_outside_every_measured_step_has_no_time_in_its_step(loaded_runs):
    from dataclasses import replace

    run, analysis = loaded_runs(SLOW_STAGE2)
    actions = run.actions.copy()
    actions.loc[0, "step"] = -1  # as an action outside every ProfilerStep#N is recorded
    frames = tables(replace(analysis, run=replace(run, actions=actions)))
    in_step = frames["actions"]["start_in_step_ns"]
    assert in_step.isna().tolist() == [True] + [False] * (len(actions) - 1)
    assert frames["actions"]["start_ns"].notna().all()


def test_export_run_id_names_the_run_and_needs_tables(tmp_path, cached):
    out = tmp_path / "tables"
    assert cli("export", SLOW_STAGE2, "--tables", out, "--run-id", "before").exit_code == 0
    assert set(pd.read_parquet(out / "idle_intervals.parquet")["run_id"]) == {"before"}
    alone = cli("export", SLOW_STAGE2, "-o", tmp_path / "merged.json", "--run-id", "before")
    assert alone.exit_code == 2 and alone.output.strip().splitlines() == [
        "tracekit: error: --run-id: names the run in the --tables; give --tables DIR"
    ]
