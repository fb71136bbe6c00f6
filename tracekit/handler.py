"""``tracekit.trace_handler``: a ``torch.profiler`` ``on_trace_ready`` that writes a run folder
``tracekit analyze`` reads without options, the way ``torch.profiler.tensorboard_trace_handler``
writes one for TensorBoard.

Each profiling cycle of each rank becomes ``RUN_DIR/iteration_<N>/rank<R>.json.gz``: N is the
profiler's step count when the trace is ready (the step after the cycle's last active one), R
the rank in ``torch.distributed`` (0 when it is not initialised, or the ``rank`` given). That is
torchtitan's layout: tracekit analyses the highest iteration and ``--iteration N`` chooses
another. Every file is written to a hidden temporary name beside its place and then linked
there, so a reader never sees half a trace, and a file already there (another process with
the same rank, or an earlier run in the same folder) is never written over: the handler
refuses at once, when it is made, if this rank's trace is already in the folder.

Rank 0 also writes ``RUN_DIR/capture.json``, the run's manifest: the world size (so a rank
that left no trace is reported missing), versions, and, with ``schedule=``, what the schedule
declares: its name, p, v, m and which rank runs each stage. ``tracekit analyze`` warns when
the order it reads in the traces says otherwise (:mod:`tracekit.reconstruct.declared`).

With ``analyze=True``, rank 0's handler also has each window analysed in the background
once every rank's trace of it is there: TensorBoard scalars, a sink of one's own, and
:class:`tracekit.Monitor` for the training loop (:mod:`tracekit.monitor`).

torch is not imported by ``import tracekit``; the handler uses the torch that calls it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracekit.version import __version__
from tracekit.errors import TracekitError
from tracekit.monitor import Monitor
from tracekit.monitor.background import Sink, WindowAnalyses

LOG = logging.getLogger("tracekit.monitor")
TENSORBOARD_HINT = "pip install 'tracekit[tensorboard]'"
MANIFEST_NAME = "capture.json"
WRITTEN_BY = "tracekit.trace_handler"
_PLACEMENTS = ("loop", "v")
# What a schedule given as a dict may declare (the keys of tracekit capture's capture.json).
_FACT_KEYS = ("schedule", "schedule_class", "p", "v", "m", "n_stages", "placement", "stage_to_rank")


def trace_handler(
    run_dir: str | os.PathLike[str],
    schedule: Any = None,
    *,
    rank: int | None = None,
    analyze: bool = False,
    tensorboard: str | os.PathLike[str] | bool = True,
    sink: Sink | None = None,
    microbatches: Sequence[int] = (),
    analysis_cpus: Sequence[int] = (),
) -> TraceHandler:
    """``on_trace_ready`` for ``torch.profiler.profile``: each rank's trace into ``run_dir``.

    ``schedule``: the ``torch.distributed.pipelining`` schedule object the ranks step (e.g.
    ``Schedule1F1B(stage, n_microbatches=8, loss_fn=...)``), or a dict of the same facts
    (``schedule``, ``p``, ``v``, ``m``, ``stage_to_rank``, ``placement``) for a framework of
    one's own. ``rank``: this process's rank when ``torch.distributed`` is not initialised.

    ``analyze=True``: while the training goes on, each profiled window is analysed once every
    rank's trace of it is written, by one analysis worker (a process of its own, started by
    rank 0's handler when it is made if ``torch.distributed`` is initialised then, else at
    the first window, and ending with the training; one window at a time; see
    :mod:`tracekit.monitor.background`), and

    - ``tensorboard``: its per-step scalars (per-stage compute, idle by cause, bubble ratio,
      step time, the suggested m) go to an event file in this folder (True, the default:
      ``run_dir/tensorboard``; False: none);
    - ``sink``: ``sink(scalars, step)`` is called for each profiled step, from a thread of
      rank 0's process (``wandb.log`` fits);
    - :class:`tracekit.Monitor` (``handler.monitor``, on any rank) reads the newest window's
      summary: findings, figures, and the microbatch count its replay runs fastest among
      ``microbatches`` (default: half, once, twice and four times the measured m);
    - ``analysis_cpus``: the CPU cores the worker may run on (Linux; default: those the
      training's process may), e.g. a core the training leaves free. The worker takes only
      CPU time the training leaves (``SCHED_IDLE``), but where the training keeps every core
      busy it still costs the step a few percent (``benchmarks/monitor_overhead.py``); on a
      core of its own it costs nothing measurable.

    The training step only hands rank 0's thread the window's number; a failed analysis is
    a warning on the ``tracekit.monitor`` logger. ``handler.wait()`` waits for the analyses
    at the end of a script; ``handler.close()`` lets the worker go before the process ends.

    Raises :class:`~tracekit.errors.TracekitError` at once when ``run_dir`` already holds
    this rank's trace or manifest, when a dict of facts is malformed, when ``tensorboard``
    names a folder but the tensorboard package is not installed, or for analysis options
    without ``analyze=True``.

    >>> import tempfile
    >>> import tracekit
    >>> run_dir = tempfile.mkdtemp() + "/run"
    >>> handler = tracekit.trace_handler(run_dir, {"schedule": "1F1B", "p": 4, "m": 8}, rank=0, analyze=True)
    >>> handler.monitor.latest() is None     # nothing profiled yet
    True

    In a training script (every rank the same): ``torch.profiler.profile(schedule=
    torch.profiler.schedule(wait=8, warmup=1, active=2), on_trace_ready=handler)``, and in the
    loop ``handler.monitor.suggest_microbatches()``.
    """
    folder = Path(run_dir)
    facts = schedule_facts(schedule) if schedule is not None else {}
    my_rank = _this_rank() if rank is None else _checked_rank(rank)
    if not analyze and (sink is not None or microbatches or analysis_cpus or not isinstance(tensorboard, bool)):
        raise TracekitError(
            "trace_handler: sink=, tensorboard=, microbatches= and analysis_cpus= are for analyze=True; add it"
        )
    checked_ms = _checked_microbatches(microbatches)
    cpus = _checked_cpus(analysis_cpus)
    logdir = _tensorboard_folder(folder, tensorboard) if analyze else None
    _refuse_earlier_files(folder, my_rank)
    return TraceHandler(folder, facts, my_rank, analyze, logdir, sink, checked_ms, cpus)


class TraceHandler:
    """What :func:`trace_handler` returns: called by the profiler with each finished cycle."""

    def __init__(
        self,
        folder: Path,
        facts: dict[str, Any],
        rank: int,
        analyze: bool,
        tensorboard: Path | None,
        sink: Sink | None,
        microbatches: tuple[int, ...],
        cpus: tuple[int, ...] = (),
    ) -> None:
        self.run_dir = folder
        self.rank = rank
        self._facts = facts
        self._manifest_written = False
        self._analyze = analyze
        self.tensorboard = tensorboard
        self._sink = sink
        self._microbatches = microbatches
        self._cpus = cpus
        self._analyses: WindowAnalyses | None = None
        self.monitor = Monitor(folder)
        world_size = _initialised_world_size() if analyze and rank == 0 else None
        if world_size is not None:
            # the worker imports while the first steps run, not when the first window is there
            self._start_analyses(world_size).start()

    def __call__(self, prof: Any) -> None:
        step = int(getattr(prof, "step_num", 0))
        target = self.run_dir / f"iteration_{step}" / f"rank{self.rank}.json.gz"
        _write_trace(prof, target)
        if self.rank == 0 and not self._manifest_written:
            _write_new(self.run_dir / MANIFEST_NAME, (json.dumps(_manifest(self._facts), indent=2) + "\n").encode())
            self._manifest_written = True
        if self._analyze and self.rank == 0:
            self._submit(step)

    def _submit(self, window: int) -> None:
        try:
            analyses = self._analyses or self._start_analyses(_world_size())
            analyses.submit(window)
        except Exception as err:  # noqa: BLE001 - the training goes on without the analysis
            LOG.warning("tracekit: window %d: the analysis while training could not start: %s", window, err)

    def _start_analyses(self, world_size: int | None) -> WindowAnalyses:
        self._analyses = WindowAnalyses(
            self.run_dir,
            world_size,
            tensorboard=self.tensorboard,
            sink=self._sink,
            microbatches=self._microbatches,
            cpus=self._cpus,
        )
        return self._analyses

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every window handed to the analysis is analysed or skipped (rank 0;
        at once elsewhere); False when ``timeout`` seconds pass first. For the end of a
        script: a training step never waits.

        >>> import tempfile
        >>> import tracekit
        >>> tracekit.trace_handler(tempfile.mkdtemp(), rank=0, analyze=True).wait(timeout=1)
        True
        """
        return True if self._analyses is None else self._analyses.wait(timeout)

    def close(self, timeout: float = 1.0) -> bool:
        """Hand no more windows to the analysis and let its worker go (it finishes the window
        in flight first); wait up to ``timeout`` seconds for it to exit, True if it did. The
        end of the training process does the same.

        >>> import tempfile
        >>> import tracekit
        >>> tracekit.trace_handler(tempfile.mkdtemp(), rank=0, analyze=True).close()
        True
        """
        return True if self._analyses is None else self._analyses.close(timeout)

    @property
    def analysed(self) -> list[int]:
        """The windows analysed so far by this handler (rank 0), in order."""
        return [] if self._analyses is None else list(self._analyses.analysed)

    @property
    def skipped(self) -> list[int]:
        """The windows left out because a newer one came while another was analysed."""
        return [] if self._analyses is None else list(self._analyses.skipped)


def _checked_microbatches(microbatches: Sequence[int]) -> tuple[int, ...]:
    values = tuple(microbatches)
    if not _integers(values, least=1):
        raise TracekitError(f"trace_handler(microbatches=...): positive integers, not {list(values)!r}")
    return values


def _integers(values: tuple[object, ...], least: int) -> bool:
    """Every value an int (a bool is not one) of at least ``least``."""
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values)


def _checked_cpus(cpus: Sequence[int]) -> tuple[int, ...]:
    """The worker's cores: CPU numbers this machine has (none: wherever the training may run)."""
    values = tuple(cpus)
    if not _integers(values, least=0):
        raise TracekitError(f"trace_handler(analysis_cpus=...): CPU numbers (integers from 0), not {list(values)!r}")
    if values and not hasattr(os, "sched_setaffinity"):
        raise TracekitError("trace_handler(analysis_cpus=...): this system cannot pin a process to cores (Linux can)")
    count = os.cpu_count() or 0
    if count and any(c >= count for c in values):
        raise TracekitError(f"trace_handler(analysis_cpus={list(values)!r}): this machine has CPUs 0-{count - 1}")
    return values


def _tensorboard_folder(folder: Path, tensorboard: str | os.PathLike[str] | bool) -> Path | None:
    """Where the event files go: None without tensorboard (installed or wanted)."""
    import importlib.util

    if tensorboard is False:
        return None
    installed = importlib.util.find_spec("tensorboard") is not None
    if tensorboard is True:
        if not installed:
            LOG.warning("tracekit: no TensorBoard scalars while training: %s", TENSORBOARD_HINT)
            return None
        return folder / "tensorboard"
    if not installed:
        raise TracekitError(f"trace_handler(tensorboard=...): needs the tensorboard package: {TENSORBOARD_HINT}")
    return Path(tensorboard)


def schedule_facts(schedule: Any) -> dict[str, Any]:
    """What a pipelining schedule object (or a dict of facts) says ran: name, class, p, v, m,
    stage count, placement and the rank of each stage, as capture.json keys."""
    if isinstance(schedule, Mapping):
        return _checked_facts(dict(schedule))
    cls = type(schedule)
    m = getattr(schedule, "_n_microbatches", None)
    n_stages = getattr(schedule, "_num_stages", None)
    if not isinstance(m, int) or not isinstance(n_stages, int):
        raise TracekitError(
            f"trace_handler(schedule=...): a {cls.__name__} is not a torch.distributed.pipelining "
            "schedule (no microbatch or stage count); pass the schedule object, or a dict "
            "such as {'schedule': '1F1B', 'p': 4, 'v': 1, 'm': 8}"
        )
    facts: dict[str, Any] = {
        "schedule": re.sub(r"^_?Schedule", "", cls.__name__),
        # as tracekit capture names it: the package that exports the class
        "schedule_class": f"{cls.__module__.removesuffix('.schedules')}.{cls.__name__}",
        "m": m,
        "n_stages": n_stages,
    }
    # Multi-stage schedules know every stage's group rank; a single-stage one has one stage per rank.
    stage_to_group_rank = getattr(schedule, "stage_index_to_group_rank", None)
    stage = getattr(schedule, "_stage", None)
    if stage is None:
        stages = getattr(schedule, "_stages", None) or [None]
        stage = stages[0]
    p = getattr(schedule, "pp_group_size", None) or getattr(stage, "group_size", None)
    if not isinstance(stage_to_group_rank, dict) or len(stage_to_group_rank) != n_stages:
        stage_to_group_rank = {s: s for s in range(n_stages)} if p == n_stages else None
    if isinstance(p, int) and p > 0:
        facts["p"] = p
        facts["v"] = max(1, n_stages // p)
    if stage_to_group_rank is not None:
        group_ranks = [int(stage_to_group_rank[s]) for s in range(n_stages)]
        to_global = _global_ranks(getattr(stage, "group", None), max(group_ranks) + 1)
        facts["stage_to_rank"] = [to_global[r] for r in group_ranks]
        facts["placement"] = placement_of(group_ranks)
    return {key: facts[key] for key in _FACT_KEYS if key in facts}


def placement_of(stage_to_rank: list[int]) -> str:
    """``v`` when the stages run down the ranks and back up (stage s and 2p-1-s on one rank),
    else ``loop`` (stage s on rank s mod p, or an order of one's own)."""
    p = len(set(stage_to_rank))
    n = len(stage_to_rank)
    if n == 2 * p and all(stage_to_rank[s] == stage_to_rank[n - 1 - s] for s in range(p)) and p > 1:
        return "v"
    return "loop"


def _checked_facts(facts: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(facts) - set(_FACT_KEYS))
    if unknown:
        raise TracekitError(
            f"trace_handler(schedule={{...}}): unknown key {unknown[0]!r}; the keys are {', '.join(_FACT_KEYS)}"
        )
    for key in ("p", "v", "m", "n_stages"):
        value = facts.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise TracekitError(f"trace_handler(schedule={{...}}): {key} must be a positive integer, not {value!r}")
    for key in ("schedule", "schedule_class"):
        if key in facts and not isinstance(facts[key], str):
            raise TracekitError(f"trace_handler(schedule={{...}}): {key} must be a string, not {facts[key]!r}")
    if "placement" in facts and facts["placement"] not in _PLACEMENTS:
        raise TracekitError(
            f"trace_handler(schedule={{...}}): placement must be 'loop' or 'v', not {facts['placement']!r}"
        )
    if "stage_to_rank" in facts:
        listed = facts["stage_to_rank"]
        if isinstance(listed, Mapping):
            try:
                listed = [listed[s] if s in listed else listed[str(s)] for s in range(len(listed))]
            except KeyError:
                raise TracekitError(
                    "trace_handler(schedule={...}): stage_to_rank must name the rank of every stage 0..n-1"
                ) from None
        if not (
            isinstance(listed, list | tuple)
            and listed
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in listed)
        ):
            raise TracekitError(
                "trace_handler(schedule={...}): stage_to_rank must be a list of ranks, one per "
                "stage (e.g. [0, 1, 2, 3])"
            )
        facts["stage_to_rank"] = [int(r) for r in listed]
        facts.setdefault("n_stages", len(listed))
        facts.setdefault("placement", placement_of(facts["stage_to_rank"]))
    return {key: facts[key] for key in _FACT_KEYS if key in facts}


def _global_ranks(group: Any, size: int) -> list[int]:
    """Group rank -> global rank, for the process group of a stage (the identity without one)."""
    try:
        import torch.distributed as dist

        if group is not None and dist.is_available() and dist.is_initialized():
            return [int(dist.get_global_rank(group, r)) for r in range(size)]
    except (ImportError, ValueError, RuntimeError):  # not a group this process belongs to
        pass
    return list(range(size))


def _this_rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def _initialised_world_size() -> int | None:
    """The world size where the training has already imported and initialised
    ``torch.distributed`` (this module never imports torch for it), else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_world_size())


def _world_size() -> int | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else None


def _checked_rank(rank: Any) -> int:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise TracekitError(f"trace_handler(rank=...): a rank is a non-negative integer, not {rank!r}")
    return rank


def _refuse_earlier_files(folder: Path, rank: int) -> None:
    """A trace of this rank (or, for rank 0, a manifest) already in the folder is another
    run's: mixing them would analyse neither."""
    if folder.exists() and not folder.is_dir():
        raise TracekitError(f"trace_handler: {folder} is a file; give a folder for the run's traces")
    earlier = sorted(folder.glob(f"rank{rank}.json*")) + sorted(folder.glob(f"*/rank{rank}.json*"))
    if rank == 0 and (folder / MANIFEST_NAME).exists():
        earlier.append(folder / MANIFEST_NAME)
    if earlier:
        raise TracekitError(
            f"trace_handler: {earlier[0]} is already there, from an earlier run; give each "
            "run its own folder (tracekit never writes over a trace)"
        )


def _write_trace(prof: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Hidden (discovery skips dot files) and ending in .gz, so torch writes it compressed.
    temporary = target.with_name(f".{target.name[: -len('.json.gz')]}.{os.getpid()}.tmp.json.gz")
    try:
        prof.export_chrome_trace(str(temporary))
        _publish(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _write_new(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        _publish(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _publish(temporary: Path, target: Path) -> None:
    """Give the finished file its name, unless that name is taken: a hard link is made whole
    and fails on an existing name, where a rename would replace it."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        raise TracekitError(
            f"trace_handler: {target} appeared while this rank wrote its own: another "
            "process has the same rank; initialise torch.distributed before profiling, or "
            "pass rank="
        ) from None


def _manifest(facts: dict[str, Any]) -> dict[str, Any]:
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = None
    manifest: dict[str, Any] = {
        "written_by": WRITTEN_BY,
        "tracekit_version": __version__,
        "torch_version": torch_version,
        "python_version": platform.python_version(),
        "created": datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
    }
    world_size = _world_size()
    if world_size is not None:
        manifest["world_size"] = world_size
    manifest.update(facts)
    return manifest
