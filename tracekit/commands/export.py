"""``tracekit export RUN_DIR``: the run for other tools: one merged Chrome trace for Perfetto
(``-o``), the analysis as Parquet/CSV tables (``--tables``), per-step TensorBoard scalars
(``--tensorboard``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracekit.commands.common import TracekitCommand, load_with_progress, rank_options
from tracekit.errors import TracekitError
from tracekit.output import OutputTarget
from tracekit.text import for_terminal

if TYPE_CHECKING:
    import pandas as pd

    from tracekit.analyze import Analysis


@click.command("export", cls=TracekitCommand)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="The merged Chrome trace to write; gzip-compressed when the name ends in .gz.",
)
@click.option(
    "--with-ops",
    is_flag=True,
    help="With -o: nest each action's own ops (two top levels; GPU runs: its kernels) under it.",
)
@click.option(
    "--tables",
    "tables_dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Write the analysis as Parquet tables into DIR (made if absent; never the run folder).",
)
@click.option("--csv", "with_csv", is_flag=True, help="With --tables: write each table as CSV too.")
@click.option(
    "--run-id",
    metavar="ID",
    help="With --tables: the run_id column's value in every table (default: RUN_DIR as given), "
    "to tell runs apart once their tables are concatenated.",
)
@click.option(
    "--tensorboard",
    "logdir",
    type=click.Path(path_type=Path),
    metavar="LOGDIR",
    help="Write per-step pipeline scalars as a TensorBoard event file into LOGDIR "
    "(pip install 'tracekit[tensorboard]').",
)
@rank_options
def command(
    run_dir: Path,
    output: Path | None,
    with_ops: bool,
    tables_dir: Path | None,
    with_csv: bool,
    run_id: str | None,
    logdir: Path | None,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
) -> None:
    """Export a run for the tools people already use: Perfetto, pandas/polars/DuckDB, TensorBoard.

    -o FILE merges the run's ranks into one Chrome trace, with the idle time drawn by cause.
    Open it in https://ui.perfetto.dev or chrome://tracing. Each rank is a process with four
    threads: compute (the pipeline actions, named like "F s2 mb3"; click one for its stage,
    microbatch, duration and source event), bubbles (the idle time of each step window, as
    slices named by cause: {causes}), p2p
    (send and receive ops) and steps. Arrows run from the action that produced each message
    to the action that consumed it. All ranks share one clock, in time since the run's first
    event. --with-ops nests under each action the ops its rank's trace recorded inside it:
    the two top levels (e.g. aten::linear and the aten::addmm in it; deeper ones stay in the
    rank traces), or on a GPU run the kernels it launched.

    --tables DIR writes actions, messages, bubbles (per rank and step), attribution,
    stage_blame, link_blame and idle_intervals (each idle interval with its cause and the
    stage or link blamed), and on GPU runs device_pairs, collective_pairs, device_steps and
    device_ranks, as DIR/<table>.parquet (and .csv with --csv): integers in ns, ratios 0..1,
    each column documented in the Parquet schema. Every table ends with run_id (--run-id)
    and each absolute time again since its step's start (start_ns -> start_in_step_ns). In
    Python, tracekit.analyze.tabular.tables(analysis) returns the same DataFrames.

    --tensorboard LOGDIR writes, per profiler step, pipeline/step_ms, pipeline/bubble_ratio,
    pipeline/stage_<s>/compute_ms and pipeline/rank_<r>/idle_<cause>_ms. TensorBoard reads
    every subfolder of its --logdir: give the training's log dir a sibling, e.g.
    logs/pipeline beside logs/train, to see both on one dashboard.

    Every file is written whole or not at all, and never over one of the run's own files;
    the tables and the event file never go into the run folder.

    \b
    Examples:
      tracekit export run/ -o merged.json.gz
      tracekit export run/ -o /tmp/run.json       # uncompressed
      tracekit export run/ -o ops.json.gz --with-ops
      tracekit export run/ --tables tables/ --csv
      tracekit export run/ --tensorboard logs/pipeline
    """
    from tracekit.analyze import analyze
    from tracekit.commands.outputs import distinct, run_output

    if output is None and tables_dir is None and logdir is None:
        raise TracekitError("export: nothing to write; give -o FILE, --tables DIR or --tensorboard LOGDIR")
    if with_ops and output is None:
        raise TracekitError("--with-ops: nests the ops in the merged trace; give -o FILE")
    if with_csv and tables_dir is None:
        raise TracekitError("--csv: writes the --tables as CSV too; give --tables DIR")
    if run_id is not None and tables_dir is None:
        raise TracekitError("--run-id: names the run in the --tables; give --tables DIR")
    if logdir is not None:
        from tracekit.render.tensorboard import require_tensorboard

        require_tensorboard()
    target = run_output(output, "-o", run_dir) if output is not None else None
    tables_to_write = table_targets(tables_dir, run_dir, with_csv) if tables_dir is not None else {}
    if logdir is not None:
        _check_folder(logdir, "--tensorboard", run_dir)
    distinct(target, *tables_to_write.values())
    # the ops nested under actions lie deeper than the analysis reads
    run = load_with_progress(run_dir, rank_from, rank_map, progress, "all" if with_ops else "analysis")
    analysis = analyze(run)
    if target is not None:
        assert output is not None  # the target is output's
        _write_chrome_trace(analysis, target, output, with_ops)
    elif run.completeness is not None and not run.completeness.complete:
        click.echo(f"tracekit: warning: {for_terminal(run.completeness.message())}", err=True)
    if tables_dir is not None:
        write_tables(analysis, tables_dir, tables_to_write, with_csv, run_id)
    if logdir is not None:
        _write_tensorboard(analysis, logdir, run_dir)


def _write_chrome_trace(analysis: Analysis, target: OutputTarget, output: Path, with_ops: bool) -> None:
    from tracekit.render.chrome_trace import encode_chrome_trace, to_chrome_trace

    document = to_chrome_trace(analysis, with_ops=with_ops)
    target.write(encode_chrome_trace(document, compressed=output.name.endswith(".gz")))
    info = document["otherData"]
    for warning in info["warnings"]:
        click.echo(f"tracekit: warning: {for_terminal(warning)}", err=True)
    counts = info["counts"]
    ops = f"{counts['ops']} ops in them, " if with_ops else ""
    click.echo(
        target.wrote(
            f"{counts['ranks']} ranks, {counts['actions']} actions, {ops}{counts['flows']} message "
            f"arrows, {counts['idle_intervals']} idle slices; open it in https://ui.perfetto.dev"
        ),
        err=True,
    )


def table_targets(folder: Path, run_dir: Path, with_csv: bool) -> dict[str, OutputTarget]:
    """Every file --tables may write (the device tables too: a GPU run is known only once
    loaded), checked now, before the run is read. Keyed by file name."""
    from tracekit.analyze.tabular import TABLES
    from tracekit.commands.outputs import run_output

    _check_folder(folder, "--tables", run_dir)
    suffixes = (".parquet", ".csv") if with_csv else (".parquet",)
    return {
        name + suffix: run_output(folder / (name + suffix), "--tables", run_dir)
        for name in TABLES
        for suffix in suffixes
    }


def write_tables(
    analysis: Analysis,
    folder: Path,
    targets: dict[str, OutputTarget],
    with_csv: bool,
    run_id: str | None,
    frames: dict[str, pd.DataFrame] | None = None,
) -> list[str]:
    """Write the run's tables (``frames``, where the caller has them already) into the
    ``targets`` of :func:`table_targets`; returns the names of the files written."""
    from tracekit.analyze.tabular import tables
    from tracekit.render.protocol import RENDERERS, NamedTable, bytes_of

    run = analysis.run
    run_meta = {"source": run.source, "timeline": run.timeline}
    frames = tables(analysis, run_id) if frames is None else frames
    renderers = [RENDERERS[kind]() for kind in (("parquet", "csv") if with_csv else ("parquet",))]
    written = []
    for name, frame in frames.items():
        for renderer in renderers:
            file_name = f"{name}.{renderer.name}"
            targets[file_name].write(bytes_of(renderer.render(NamedTable(name, frame, run_meta))))
            written.append(file_name)
    formats = "Parquet and CSV" if with_csv else "Parquet"
    rows = ", ".join(f"{name} {len(frame)}" for name, frame in frames.items())
    click.echo(for_terminal(f"wrote {folder}: {len(frames)} tables as {formats} (rows: {rows})"), err=True)
    return written


def _write_tensorboard(analysis: Analysis, logdir: Path, run_dir: Path) -> None:
    import time

    from tracekit.analyze.tabular import step_scalars
    from tracekit.commands.outputs import run_output
    from tracekit.render.protocol import RENDERERS, bytes_of
    from tracekit.render.tensorboard import event_file_name

    scalars = step_scalars(analysis)
    now_s = time.time()
    target = run_output(logdir / event_file_name(scalars, now_s), "--tensorboard", run_dir)
    target.write(bytes_of(RENDERERS["tensorboard"](now_s=now_s).render(scalars)))
    click.echo(
        target.wrote(f"{len(scalars)} scalars over {scalars['step'].nunique()} steps; tensorboard --logdir {logdir}"),
        err=True,
    )


def _check_folder(folder: Path, option: str, run_dir: Path) -> None:
    """An output folder must be (or become) a folder, and lie outside the run: a folder of
    outputs inside the run would mix tracekit's files with the run's, and the run's own
    folder is for its traces only."""
    from tracekit.ingest.discovery import every_trace

    text = os.fspath(folder)
    if not text:
        raise TracekitError(f"{option}: an empty folder name; give the folder to write into")
    resolved = Path(os.path.realpath(text))
    if resolved.exists() and not resolved.is_dir():
        raise TracekitError(f"{option} {folder}: is a file; give a folder")
    existing = resolved
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise TracekitError(f"{option} {folder}: {existing} is a file, not a folder; choose another folder")
    run_dir = Path(run_dir)
    run_folder = Path(os.path.realpath(run_dir if run_dir.is_dir() else run_dir.parent))
    trace_folders = {Path(os.path.realpath(trace)).parent for trace in every_trace(run_dir)}
    for inside in sorted({run_folder} | trace_folders):
        if resolved == inside:
            raise TracekitError(
                f"{option} {folder}: is the run folder (or holds its traces); write into a folder outside the run"
            )
        if run_dir.is_dir() and inside in resolved.parents:
            raise TracekitError(
                f"{option} {folder}: lies inside the run folder {inside}; write into a folder outside the run"
            )
