"""Options and helpers shared by the subcommands that read a run."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from tracekit.errors import TracekitError
from tracekit.vocab import CATEGORIES

if TYPE_CHECKING:
    from tracekit.ingest.cache import ParseCache
    from tracekit.loading import LoadOptions
    from tracekit.model.run import Run
    from tracekit.reconstruct.labels import LabelSet
    from tracekit.schemas.analysis import AnalysisDocument

# Where rank_options leaves the loading options for load_with_progress (click's ctx.meta).
_LOAD_META = "tracekit.load"
_LOAD_OPTIONS = ("executor", "scheduler", "jobs", "cache_dir", "no_cache", "iteration", "timeline", "label_rule")
# Every option rank_options adds: --help lists them apart, after the command's own.
LOADING_PARAMS = frozenset({"rank_from", "rank_map", "progress", *_LOAD_OPTIONS})


class TracekitCommand(click.Command):
    """A subcommand whose --help lists its own options first and the options shared by
    every command that reads a run (:func:`rank_options`) after them, under "Loading
    options"; and which still takes an option's old spelling (``renamed``: old spelling ->
    the option's new long one), with one line on stderr. ``{causes}`` in its help is the
    idle causes, as tracekit.vocab registers them."""

    def __init__(self, *args: Any, renamed: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = renamed or {}
        if self.help:
            self.help = self.help.replace("{causes}", ", ".join(CATEGORIES))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        loading: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):  # arguments are in the usage line
                (loading if param.name in LOADING_PARAMS else own).append(record)
        for heading, records in (("Options", own), ("Loading options", loading)):
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, [*self._new_spellings(ctx, args)])

    def _new_spellings(self, ctx: click.Context, args: list[str]) -> Iterator[str]:
        """``args`` with each old spelling (``--ranks 4``, ``--ranks=4``) in its new one."""
        for i, arg in enumerate(args):
            if arg == "--":  # what follows is arguments, not options
                yield from args[i:]
                return
            old, equals, value = arg.partition("=")
            new = self.renamed.get(old)
            if new is None:
                yield arg
                continue
            if not ctx.resilient_parsing:  # not while the shell completes a word
                spelled = "/".join(next(p.opts for p in self.params if new in p.opts))
                click.echo(f"tracekit: {self.name} {old} is deprecated: write {spelled} (it means the same)", err=True)
            yield new + equals + value


def rank_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--rank-from, --rank-map, --progress/--no-progress, --iteration, --timeline, --label-rule,
    and how to load: --jobs, --executor, --scheduler, --cache-dir, --no-cache.

    The loading options do not reach the command function: they are kept in the click
    context for :func:`load_with_progress`. All are checked before any file is read.
    """

    @click.option(
        "--rank-from",
        metavar="REGEX",
        help="Take each file's rank from its name with this regex (one group), e.g. 'worker(\\d+)'. "
        "Default: distributedInfo, else a rank number in the file name.",
    )
    @click.option(
        "--rank-map", metavar="PID=RANK,...", help="Nsight Systems: which process is which rank, e.g. '4242=0,4243=1'."
    )
    @click.option(
        "--progress/--no-progress",
        default=None,
        help="Show progress on stderr: a bar while loading, then a line per long step (replays, "
        "what-if, the report). Default: when stderr is a terminal.",
    )
    @click.option(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="Parse files in N processes (default: one per core, at most one per file).",
    )
    @click.option(
        "--executor",
        type=click.Choice(["local", "dask"]),
        default="local",
        show_default=True,
        help="Where files are parsed: local processes, or a Dask cluster (pip install 'tracekit[dask]').",
    )
    @click.option(
        "--scheduler",
        metavar="ADDRESS",
        help="With --executor dask: the scheduler, e.g. tcp://10.0.0.5:8786 "
        "(default: a local cluster). Its workers must see the trace files.",
    )
    @click.option(
        "--cache-dir",
        metavar="DIR",
        help="Keep parsed files here (a path or an fsspec URL such as s3://bucket/tracekit; "
        "default: $TRACEKIT_CACHE_DIR or ~/.cache/tracekit). Never beside the traces.",
    )
    @click.option("--no-cache", is_flag=True, help="Parse every file again; read and write no cache.")
    @click.option(
        "--iteration",
        type=click.IntRange(min=0),
        metavar="N",
        help="With traces in iteration_N folders (profiling/traces/iteration_N/...): read "
        "iteration N. Default: the highest.",
    )
    @click.option(
        "--timeline",
        type=click.Choice(["auto", "device", "host"]),
        default="auto",
        show_default=True,
        help="Which clock to measure on. auto: the GPU's own timeline wherever the traces record "
        "kernels (each action spans the kernels it launched; NCCL P2P by its SendRecv kernels), "
        "else the host's. host: CPU op spans even on a GPU run (the host runs ahead of the GPU, so "
        "those are the host's figures). device: insist on kernels.",
    )
    @click.option(
        "--label-rule",
        multiple=True,
        metavar="REGEX=KIND",
        help="Read annotations named by REGEX as pipeline actions (repeatable; tried before the "
        "built-in tables, and added to [tool.tracekit.labels] in pyproject.toml). KIND: F, B, "
        "I, W, kind (the kind is the group (?P<kind>F|B|I|W)), FB, comm or marker. Groups "
        "(?P<stage>N) and (?P<mb>N) give stage and microbatch; without (?P<mb>..) consecutive "
        "ranges of one kind are one action (per-layer labels). "
        "E.g. --label-rule '^fwd_mb(?P<mb>\\d+)$=F' --label-rule '^bwd_mb(?P<mb>\\d+)$=B'",
    )
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from tracekit.ingest.discovery import compile_rank_pattern

        ctx = click.get_current_context()
        ctx.meta[_LOAD_META] = {name: kwargs.pop(name) for name in _LOAD_OPTIONS}
        compile_rank_pattern(kwargs.get("rank_from"))
        load_options()  # a bad --cache-dir, --scheduler or --label-rule fails here, before any file is read
        try:
            return func(*args, **kwargs)
        finally:
            from tracekit.ingest.cache_writes import write_deferred_entries

            write_deferred_entries()  # cache entries of files parsed by workers, after the output

    return wrapper


def parse_rank_map(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    mapping = {}
    for item in text.split(","):
        try:
            pid, rank = item.split("=")
            mapping[int(pid)] = int(rank)
        except ValueError:
            raise TracekitError(f"--rank-map: {item!r} is not PID=RANK; write e.g. '4242=0,4243=1'") from None
    return mapping


# Imported while the parser workers parse (ingest.pool), not after the last file: what
# every loading command runs next (~0.03 s of module set-up on top of pandas' ~0.17 s).
ANALYSIS_WARM_UP = ("pandas", "tracekit.reconstruct.whole_run", "tracekit.analyze")


def load_options(rank_from: str | None = None, rank_map: str | None = None) -> LoadOptions:
    """The loading options of the running command (defaults outside a command), with its
    --rank-from and --rank-map."""
    from tracekit.loading import LoadOptions

    ctx = click.get_current_context(silent=True)
    settings = dict(ctx.meta.get(_LOAD_META, {})) if ctx is not None else {}
    cache_dir = None if settings.get("no_cache") else _cache_dir(settings.get("cache_dir"))
    if settings.get("scheduler") and settings.get("executor", "local") != "dask":
        raise TracekitError("--scheduler is for --executor dask; add --executor dask or drop --scheduler")
    # Commands read only the working set of each file (tracekit.ingest.working_set), and
    # of a pipeline rank only its steps, actions and message rows (tracekit.reconstruct.per_rank).
    return LoadOptions(
        rank_from=rank_from,
        rank_map=parse_rank_map(rank_map),
        executor=settings.get("executor") or "local",
        jobs=settings.get("jobs"),
        scheduler=settings.get("scheduler"),
        cache_dir=cache_dir,
        rows="reduce",
        defer_cache_writes=True,
        iteration=settings.get("iteration"),
        timeline=settings.get("timeline") or "auto",
        labels=label_rules(settings.get("label_rule") or ()),
        warm_up=ANALYSIS_WARM_UP,
    )


def label_rules(flags: Iterable[str]) -> LabelSet | None:
    """The user's label rules: ``[tool.tracekit.labels]`` of the closest pyproject.toml, then
    each ``--label-rule`` (a bad one is one line, before any file is read)."""
    from tracekit.pyproject import find_table, tracekit_table

    found = find_table(Path.cwd(), "labels")
    if found is None and not flags:
        return None  # without importing reconstruct (and pandas): a cached analysis needs neither
    from tracekit.reconstruct.labels import custom_set, parse_rule, rule_of

    rules = []
    if found is not None:
        table = tracekit_table(found, "labels")
        if not isinstance(table, dict):
            raise TracekitError(f'{found}: [tool.tracekit.labels] must be a table of "REGEX" = "KIND" lines')
        for pattern, role in table.items():
            if not isinstance(role, str):
                raise TracekitError(
                    f'{found} [tool.tracekit.labels] {pattern!r}: the kind must be a string such as "F"'
                )
            rules.append(rule_of(pattern, role.strip(), f"{found} [tool.tracekit.labels]"))
    rules += [parse_rule(text, "--label-rule") for text in flags]
    return custom_set(rules)


def _cache_dir(option: str | None) -> str:
    """--cache-dir, else the default; a URL must be one this installation can open."""
    from tracekit.ingest.cache import ParseCache, default_cache_dir

    cache_dir = option or default_cache_dir()
    if "://" in cache_dir:
        try:
            ParseCache(cache_dir)
        except TracekitError as err:
            given = "--cache-dir" if option else "$TRACEKIT_CACHE_DIR"
            raise TracekitError(f"{given} {err}") from None
    return cache_dir


def _refuse_cache_in_run(cache_dir: str | None, run_dir: Path) -> None:
    """The cache writes folders of its own: never inside the run it reads (inputs are never
    modified, and the next load would search them for traces)."""
    if not cache_dir or "://" in cache_dir:
        return
    folder = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
    cache, run = Path(cache_dir).resolve(), folder.resolve()
    if cache == run or run in cache.parents:
        raise TracekitError(
            f"--cache-dir {cache_dir}: is inside the run folder {run_dir}; tracekit never "
            "writes into a run it reads: give a cache folder elsewhere (or --no-cache)"
        )


def load_with_progress(
    path: Path,
    rank_from: str | None,
    rank_map: str | None,
    progress: bool | None,
    rows: str = "reduce",
    draw_ops: bool = False,
) -> Run:
    """Load and reconstruct a run, with a progress bar (bytes read) on long loads.

    ``rows="all"``: every event, not only the analysis's working set (an output that shows
    the trace's own ops); ``"analysis"``: the working set's events (outputs that draw them).
    ``draw_ops``: with ``rows="reduce"``, the ranks reduced keep the ops an output draws."""
    from dataclasses import replace

    from tracekit.ingest import discover
    from tracekit.loading import load

    options = replace(load_options(rank_from, rank_map), rows=rows, draw_ops=draw_ops)
    _refuse_cache_in_run(options.cache_dir, path)
    show = sys.stderr.isatty() if progress is None else progress
    if not show:
        return load(path, options)
    from tqdm import tqdm

    total = sum(os.path.getsize(f) for f in discover(path, options.iteration, rank_from))
    # No monitor thread: a process pool forks only while this process has no other thread.
    tqdm.monitor_interval = 0
    with tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="reading traces", file=sys.stderr, leave=False
    ) as bar:
        return load(path, options, bytes_read=bar.update)


# Runs of at most this many files keep every rank's working set for the HTML report; larger
# ones are reduced where parsed, each rank keeping the ops the page draws as well.
ONE_PASS_FILES = 32


def load_to_draw(path: Path, rank_from: str | None, rank_map: str | None, progress: bool | None) -> Run:
    """Load a run for an output that draws its ops (the HTML report): a GPU rank's kernels
    and the host ops of a run without a pipeline, each file read once. A run of at most
    :data:`ONE_PASS_FILES` files keeps every rank's working set (the ops inside a
    pipeline's actions give the report's best split of the layers, as ``whatif --balanced``
    reads them); a larger one is reduced like any analysis, each rank keeping the ops drawn
    (``LoadOptions.draw_ops``: which ranks the page draws is known only after the analysis)."""
    from tracekit.ingest import discover

    options = load_options(rank_from, rank_map)
    if len(discover(path, options.iteration, rank_from)) <= ONE_PASS_FILES:
        return load_with_progress(path, rank_from, rank_map, progress, rows="analysis")
    return load_with_progress(path, rank_from, rank_map, progress, draw_ops=True)


def work_progress(progress: bool | None) -> Callable[[str], None] | None:
    """Where the long parts after loading (replays, what-if, the report) say what they are
    doing: a line on stderr each, with the seconds since the first (on a terminal, or with
    --progress; never on stdout, where --json goes). None when not shown."""
    if not (sys.stderr.isatty() if progress is None else progress):
        return None
    started = time.perf_counter()

    def say(what: str) -> None:
        click.echo(f"tracekit: {what} ({time.perf_counter() - started:.1f} s)", err=True)

    return say


def _document_cache(run_dir: Path, options: dict[str, Any]) -> tuple[ParseCache | None, str | None, list[Path] | None]:
    """The parse cache, this analysis's key in it and the run's trace files, or Nones
    without a cache (or before every file's digest is known)."""
    settings = load_options()
    if not settings.cache_dir:  # before importing the cache (hashlib, ~7 ms): --no-cache needs none
        return None, None, None
    from tracekit.commands.document_cache import analysis_key
    from tracekit.ingest.cache import ParseCache
    from tracekit.ingest.discovery import find_traces

    _refuse_cache_in_run(settings.cache_dir, run_dir)
    cache = ParseCache(settings.cache_dir)
    found = find_traces(run_dir, settings.iteration, options.get("rank_from"))
    folder = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
    # What discovery decided (which files are traces, which iteration) is part of the answer.
    labels = cast("LabelSet | None", settings.labels)  # load_options reads them into a LabelSet
    decided = {
        **options,
        "iteration": settings.iteration,
        "timeline": settings.timeline,
        "skipped": found.skipped,
        "labels": [(r.pattern, r.role) for r in labels.rules] if labels is not None else [],
    }
    key = analysis_key(cache, Path(run_dir), found.files, decided, [folder / "capture.json"])
    return cache, key, found.files


def cached_document(run_dir: Path, options: dict[str, Any]) -> AnalysisDocument | None:
    """The stored analysis of this unchanged run with these options, if any, naming this
    run's own folder and files (a copy of a run elsewhere is the same analysis)."""
    cache, key, files = _document_cache(run_dir, options)
    if key is None:
        return None
    assert cache is not None and files is not None  # a key comes with both
    from tracekit.commands.document_cache import load_document

    return load_document(cache, key, str(Path(run_dir)), files)


def remember_document(run_dir: Path, options: dict[str, Any], document: AnalysisDocument) -> None:
    """Store an analysis for the next run (its files' digests are known by now)."""
    cache, key, files = _document_cache(run_dir, options)
    if key is not None:
        assert cache is not None and files is not None  # a key comes with both
        from tracekit.commands.document_cache import store_document

        store_document(cache, key, document, str(Path(run_dir)), files)
