"""One profiled window analysed in a process of its own, while the training goes on:
``python -m tracekit.monitor.window RUN_DIR --iteration N --world-size W ...``, started by
:mod:`tracekit.monitor.background` (never by hand; its options are that module's).

It waits until every rank's ``iteration_<N>/rank<R>.json.gz`` is there (the handler writes
each whole or not at all), takes only CPU time the training leaves (:func:`run_when_idle`), reads the window as ``tracekit analyze
RUN_DIR --iteration N`` does (in this process: one core), and writes:

- ``RUN_DIR/monitor/window_<N>.json``, the summary :class:`tracekit.Monitor` reads:
  ``window``, ``steps`` (the profiled steps), ``schedule`` (name, p, v, m), ``bubble_ratio``
  (idle over the step windows, every rank), ``step_ms`` (mean step window),
  ``idle_ms_by_cause`` (every rank and step), ``stage_compute_ms`` (per stage, mean per step),
  ``ranks`` (per rank: busy, idle, bubble ratio and idle by cause), ``findings`` (cause,
  severity, headline, advice, as ``tracekit analyze`` words them), ``suggested_microbatches``
  and ``microbatch_replays`` (each candidate m's replayed step and bubble: the answer of
  ``whatif_command``), ``suggestion_note`` (why there is no suggestion, else null),
  ``scalars`` (per step, the scalars below) and ``analysis_s``;
- with ``--tensorboard LOGDIR``, one event file of the window's scalars: per step those of
  ``tracekit export --tensorboard`` (:func:`tracekit.analyze.tabular.step_scalars`:
  ``pipeline/step_ms``, ``pipeline/bubble_ratio``, ``pipeline/stage_<s>/compute_ms``,
  ``pipeline/rank_<r>/idle_ms``, ``pipeline/rank_<r>/idle_<cause>_ms``), plus
  ``pipeline/idle_<cause>_ms`` (all ranks) and, at the window's last step,
  ``pipeline/suggested_microbatches``.

Any failure is one line on standard error and exit status 1: the training process logs it
as a warning (:mod:`tracekit.monitor.background`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import TracekitError
from tracekit.monitor import summary_path
from tracekit.output import OutputTarget
from tracekit.version import __version__

if TYPE_CHECKING:
    import pandas as pd

    from tracekit.analyze import Analysis
    from tracekit.model.run import Run

WRITTEN_BY = "tracekit.monitor"
# Candidate microbatch counts, as multiples of the measured m (m/2 rounded down, kept at 1 or more).
M_FACTORS = (0.5, 1, 2, 4)
POLL_S = 0.2  # how often the folder is listed while ranks' traces are still being written
_NS_PER_MS = 1_000_000
SUGGESTED_TAG = "pipeline/suggested_microbatches"


def candidate_microbatches(measured_m: int, given: Sequence[int] = ()) -> list[int]:
    """The m values replayed for the suggestion: ``given``, else :data:`M_FACTORS` times the
    measured m.

    >>> candidate_microbatches(8)
    [4, 8, 16, 32]
    >>> candidate_microbatches(8, (6, 12))
    [6, 12]
    """
    if given:
        return sorted(set(given))
    return sorted({max(1, int(measured_m * factor)) for factor in M_FACTORS})


def whatif_command(run_dir: Path, window: int, schedule: str, ms: Sequence[int]) -> str:
    """The ``tracekit whatif`` command line that gives the same answer as the suggestion.

    >>> whatif_command(Path("run"), 8, "1F1B", [4, 8])
    'tracekit whatif run --iteration 8 -s 1F1B -m 4 -m 8'
    """
    return f"tracekit whatif {run_dir} --iteration {window} -s {schedule} " + " ".join(f"-m {m}" for m in ms)


def wait_for_ranks(run_dir: Path, window: int, world_size: int | None, wait_s: float) -> list[Path]:
    """Every rank's trace of the window, once all ``world_size`` are there (None: those there
    now); a TracekitError after ``wait_s`` seconds without them."""
    folder = run_dir / f"iteration_{window}"
    deadline = time.monotonic() + wait_s
    while True:
        found = sorted(folder.glob("rank*.json.gz"))
        if world_size is None and found or world_size is not None and len(found) >= world_size:
            return found
        if time.monotonic() >= deadline:
            raise TracekitError(
                f"window {window}: {len(found)} of {world_size or 'the'} ranks' traces in {folder} "
                f"after {wait_s:.0f} s; not analysed"
            )
        time.sleep(POLL_S)


def suggestion(run: Run, window: int, run_dir: Path, ms: Sequence[int]) -> dict[str, Any]:
    """The m the measured schedule's replay runs fastest, with each candidate's replay: what
    ``tracekit whatif RUN_DIR --iteration N -s SCHEDULE -m ...`` prints as its fastest step."""
    from tracekit.analyze.costs import cost_model
    from tracekit.analyze.whatif import ALL_TARGETS, fastest, requested_targets, what_if

    sched = run.schedule
    none: dict[str, Any] = {"suggested_microbatches": None, "microbatch_replays": [], "whatif_command": None}
    if sched is None or not run.is_pipeline:
        return {**none, "suggestion_note": "no pipeline in this window: nothing to replay"}
    if sched.name not in ALL_TARGETS:
        return {**none, "suggestion_note": f"tracekit whatif does not generate {sched.name} orders"}
    candidates = candidate_microbatches(sched.m, ms)
    model = cost_model(run)
    targets = requested_targets(model, (sched.name,), (), candidates)
    result = what_if(run, targets, model=model)
    best = fastest(result.predictions, result.keep)
    replays = [
        {"m": p.m, "v": p.v, "step_ms": p.step_ns / _NS_PER_MS, "bubble_ratio": p.bubble_ratio}
        for p in result.predictions
    ]
    return {
        "suggested_microbatches": None if best is None else best.m,
        "microbatch_replays": replays,
        "suggestion_note": None if best is not None else "; ".join(result.skipped) or "no candidate replayed",
        "whatif_command": whatif_command(run_dir, window, sched.name, candidates),
    }


def window_scalars(analysis: Analysis, suggested: int | None) -> pd.DataFrame:
    """Per step, ``export --tensorboard``'s scalars, each cause's idle over all ranks, and the
    suggestion at the last step (columns step, tag, value, wall_time_ns)."""
    import pandas as pd

    from tracekit.analyze.tabular import step_scalars
    from tracekit.vocab import CATEGORIES

    scalars = step_scalars(analysis)
    extra: list[tuple[int, str, float, int]] = []
    walls = scalars.groupby("step")["wall_time_ns"].first()
    if analysis.attribution is not None and len(analysis.attribution.table):
        columns = [f"{c}_ns" for c in CATEGORIES]
        per_step = analysis.attribution.table.groupby("step")[columns].sum()
        for step, row in zip(per_step.index.tolist(), per_step.to_numpy().tolist()):
            wall = int(walls.get(step, -1))
            extra += [(int(step), f"pipeline/idle_{c}_ms", ns / _NS_PER_MS, wall) for c, ns in zip(CATEGORIES, row)]
    if suggested is not None and len(walls):
        extra.append((int(walls.index.max()), SUGGESTED_TAG, float(suggested), int(walls.iloc[-1])))
    if not extra:
        return scalars
    more = pd.DataFrame(extra, columns=list(scalars.columns)).astype(scalars.dtypes.to_dict())
    return pd.concat([scalars, more], ignore_index=True)


def summarise_window(analysis: Analysis, window: int, scalars: pd.DataFrame) -> dict[str, Any]:
    """The window's summary, as ``window_<N>.json`` holds it (without the suggestion)."""
    from tracekit.vocab import CATEGORIES

    summary = analysis.summary
    bubbles = analysis.bubbles
    steps = sorted(int(s) for s in bubbles["step"].unique())
    step_windows = bubbles.groupby("step")["window_ns"].first()
    by_cause: dict[str, float] = {}
    per_rank_cause: dict[int, dict[str, float]] = {}
    if analysis.attribution is not None and len(analysis.attribution.table):
        table = analysis.attribution.table
        by_cause = {c: float(table[f"{c}_ns"].sum()) / _NS_PER_MS for c in CATEGORIES}
        per_rank = table.groupby("rank")[[f"{c}_ns" for c in CATEGORIES]].sum()
        for rank, row in zip(per_rank.index.tolist(), per_rank.to_numpy().tolist()):
            per_rank_cause[int(rank)] = {c: ns / _NS_PER_MS for c, ns in zip(CATEGORIES, row)}
    stage_rows = scalars[scalars["tag"].str.fullmatch(r"pipeline/stage_\d+/compute_ms")]
    stage_means = stage_rows.groupby("tag")["value"].mean()
    stage_compute = {str(tag).split("/")[1].removeprefix("stage_"): float(ms) for tag, ms in stage_means.items()}
    sched = analysis.run.schedule
    per_step: dict[str, dict[str, float]] = {}
    for step, tag, value in zip(scalars["step"].tolist(), scalars["tag"].tolist(), scalars["value"].tolist()):
        per_step.setdefault(str(step), {})[str(tag)] = float(value)
    return {
        "written_by": WRITTEN_BY,
        "tracekit_version": __version__,
        "window": window,
        "steps": steps,
        "schedule": None if sched is None else {"name": sched.name, "p": sched.p, "v": sched.v, "m": sched.m},
        "bubble_ratio": summary.bubble_ratio,
        "step_ms": float(step_windows.mean()) / _NS_PER_MS if len(step_windows) else 0.0,
        "idle_ms_by_cause": by_cause,
        "stage_compute_ms": dict(sorted(stage_compute.items(), key=lambda item: int(item[0]))),
        "ranks": {
            str(rank): {
                "busy_ms": r.busy_ns / _NS_PER_MS,
                "idle_ms": r.idle_ns / _NS_PER_MS,
                "bubble_ratio": r.bubble_ratio,
                "idle_ms_by_cause": per_rank_cause.get(rank, {}),
            }
            for rank, r in summary.per_rank.items()
        },
        "findings": [
            {"cause": f.cause, "severity": f.severity, "headline": f.headline, "advice": f.advice}
            for f in analysis.findings
        ],
        "scalars": per_step,
    }


def analyse_window(
    run_dir: Path,
    window: int,
    world_size: int | None,
    wait_s: float,
    tensorboard: Path | None,
    ms: Sequence[int] = (),
) -> dict[str, Any]:
    """Wait for the window's traces, analyse them, write the summary (and the event file);
    the summary."""
    from tracekit.analyze import analyze
    from tracekit.loading import LoadOptions, load

    wait_for_ranks(run_dir, window, world_size, wait_s)
    started = time.monotonic()
    # as tracekit whatif reads a run (rows="analysis": the ops inside the actions, whose fixed
    # part the cost model measures), in this one process
    options = LoadOptions(rows="analysis", iteration=window, jobs=1)
    run = load(run_dir, options)
    try:
        found = suggestion(run, window, run_dir, ms)
    except TracekitError as err:
        found = {
            "suggested_microbatches": None,
            "microbatch_replays": [],
            "suggestion_note": str(err),
            "whatif_command": None,
        }
    # after the suggestion: what_if reads the run as loaded, as tracekit whatif does
    analysis = analyze(run)
    scalars = window_scalars(analysis, found["suggested_microbatches"])
    summary = summarise_window(analysis, window, scalars)
    summary.update(found)
    summary["analysis_s"] = round(time.monotonic() - started, 3)
    if tensorboard is not None:
        write_event_file(tensorboard, window, scalars)
    target = OutputTarget(summary_path(run_dir, window), "the window's summary")
    target.path.parent.mkdir(parents=True, exist_ok=True)
    target.write((json.dumps({k: summary[k] for k in sorted(summary)}, indent=1) + "\n").encode())
    return summary


def write_event_file(logdir: Path, window: int, scalars: pd.DataFrame) -> Path:
    """The window's scalars as one event file in ``logdir``, named so that windows sort in
    the order they ran."""
    from tracekit.render.tensorboard import TensorBoardRenderer, event_file_name

    now_s = time.time()
    name = f"{event_file_name(scalars, now_s)}.window{window:09d}"
    logdir.mkdir(parents=True, exist_ok=True)
    target = OutputTarget(logdir / name, "the window's TensorBoard events")
    target.write(TensorBoardRenderer(now_s=now_s).render(scalars))
    return target.path


def run_when_idle() -> None:
    """This process gets only the CPU time nothing else wants: Linux's ``SCHED_IDLE`` (a weight
    of 3 against a normal process's 1024, so the training's processes always come first),
    else the lowest nice value."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed
        os.nice(19)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracekit.monitor.window", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--wait-s", type=float, default=600.0)
    parser.add_argument("--tensorboard", type=Path)
    parser.add_argument("--microbatches", default="", help="candidate m values, comma-separated")
    parser.add_argument("--no-idle", dest="idle", action="store_false", help="run at the caller's priority")
    args = parser.parse_args(argv)
    if args.idle:
        run_when_idle()
    try:
        ms = [int(m) for m in args.microbatches.split(",") if m]
        analyse_window(args.run_dir, args.iteration, args.world_size, args.wait_s, args.tensorboard, ms)
    except Exception as err:  # noqa: BLE001 - one line for the training's log, whatever went wrong
        print(f"{type(err).__name__}: {err}" if not isinstance(err, TracekitError) else str(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
