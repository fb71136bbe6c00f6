"""The map step's reduce (``rows="reduce"``): each pipeline rank comes back as its steps,
actions and message rows, the client holds those instead of events, and the analysis is
the one all events give (tests/test_working_set.py checks that on every sample run); the
parse cache keys the reduced entries by the reduce's options and code."""

from __future__ import annotations

from pathlib import Path

from conftest import SAMPLES
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.ingest.cache import ParseCache
from tracekit.loading import reduce_file
from tracekit.ingest.file_task import parse_file
from tracekit.ingest.working_set import working_set
from tracekit.reconstruct.per_rank import gather
from tracekit.render.json import to_document

RUN = SAMPLES / "interleaved1f1b"


def _document(run) -> dict:
    doc = to_document(analyze(run))
    doc.pop("generated_at", None)
    return doc


def _entries(cache_dir: Path) -> int:
    return len(list(cache_dir.rglob("*.parquet")))


def test_the_client_holds_actions_and_message_rows_not_events():
    kept = load(RUN, LoadOptions(jobs=1, rows="analysis"))
    reduced = load(RUN, LoadOptions(jobs=1, rows="reduce"))
    assert _document(reduced) == _document(kept)
    # every action and step is there, of the events only the few that messages need
    assert len(reduced.actions) == len(kept.actions) and len(reduced.steps) == len(kept.steps)
    assert len(reduced.events) < 0.25 * len(kept.events)
    # per message: its two calls and a wait; with torch pipelining's labels the two P2P
    # ranges that name the action each side serves (PP:4SEND_F4, PP:5RECV_F4)
    assert len(reduced.events) <= 5 * len(reduced.messages) + 2 * len(reduced.ranks) + 64
    assert all(trace.reduced is None for trace in reduced.files)  # read into the run's tables


def test_the_reduce_runs_in_pool_workers_and_through_the_cache(tmp_path):
    expected = _document(load(RUN, LoadOptions(jobs=1, rows="all")))
    cache = tmp_path / "cache"
    first = load(RUN, LoadOptions(jobs=2, rows="reduce", cache_dir=str(cache)))
    assert _document(first) == expected
    n_files = len(list(RUN.glob("rank*.json.gz")))
    assert _entries(cache) == n_files
    again = load(RUN, LoadOptions(jobs=2, rows="reduce", cache_dir=str(cache)))
    assert _document(again) == expected
    assert _entries(cache) == n_files  # every file answered from its entry
    assert len(again.events) == len(first.events)


def test_the_reduced_entries_are_keyed_by_the_label_rules(tmp_path):
    cache = tmp_path / "cache"
    load(RUN, LoadOptions(jobs=1, rows="reduce", cache_dir=str(cache)))
    n = _entries(cache)
    # a rule that matches nothing leaves the analysis as it was, yet it could have changed
    # every rank's actions: the entries made without it are not used
    ruled = load(RUN, LoadOptions(jobs=1, rows="reduce", cache_dir=str(cache), labels=["^never-seen$=F"]))
    assert _entries(cache) == 2 * n
    assert len(ruled.actions) == len(load(RUN, LoadOptions(jobs=1, rows="analysis")).actions)
    # and working-set entries are others again
    load(RUN, LoadOptions(jobs=1, rows="analysis", cache_dir=str(cache)))
    assert _entries(cache) == 3 * n
    assert ParseCache(cache).root == str(cache)


def _reduced_ranks(run_dir: Path) -> list[dict]:
    out = []
    for file_id, path in enumerate(sorted(run_dir.glob("rank*.json.gz"))):
        parsed = [(t, working_set(c)) for t, c in parse_file(path, file_id, None, None)]
        out.extend(trace.reduced for trace, _ in reduce_file(parsed, None))
    return out


def test_ranks_that_chose_another_label_table_are_not_gathered():
    ranks = _reduced_ranks(RUN)
    gathered = gather(ranks, None)
    assert gathered is not None and gathered.choice.used is not None
    assert int(gathered.steps["n_actions"].sum()) == 0  # counted by reconstruct, after
    # a rank whose annotations alone would pick another table (here: segmentation) holds
    # the actions of that table, not of the run's: the client must read its events
    ranks[1] = {**ranks[1], "table": None}
    assert gather(ranks, None) is None
    # and a rank that sent its events instead (no action of its own, or device work)
    assert gather([ranks[0], None], None) is None


def test_a_single_file_is_read_as_its_working_set():
    one = sorted(RUN.glob("rank*.json.gz"))[0]
    run = load(one, LoadOptions(jobs=1, rows="reduce"))
    assert len(run.events) == len(load(one, LoadOptions(jobs=1, rows="analysis")).events)


def test_entries_written_after_the_analysis_keep_the_ranks_reductions(tmp_path):
    """The command line writes pool workers' entries in the background while the run is
    reconstructed, which reads each rank's reduction and lets go of it: the entry must hold
    the reduction as the worker sent it."""
    from tracekit.ingest.cache_writes import PendingEntry, write_deferred_entries

    path = sorted(RUN.glob("rank*.json.gz"))[1]
    parsed = reduce_file([(t, working_set(c)) for t, c in parse_file(path, 1, None, None)], None)
    sent = parsed[0][0].reduced
    cache = ParseCache(tmp_path / "cache")
    found = cache.lookup(path, {"rows": "reduce"}, 1)
    assert found.parsed is None and found.key is not None
    PendingEntry(str(tmp_path / "cache"), found.key, str(path), found.stamp).defer(parsed)
    parsed[0][0].reduced = None  # what reconstruct does once it has read it
    write_deferred_entries()
    stored = cache.lookup(path, {"rows": "reduce"}, 1).parsed
    assert stored is not None and stored[0][0].reduced == sent


def test_a_run_whose_ranks_choose_different_tables_is_read_from_its_events():
    # the user's rule names actions of rank 0 only: rank 0 alone would choose it, the others
    # the built-in table; the run chooses the rule, so the others' actions are not the run's
    rule = ["^PP:0(?P<kind>[FB])(?P<mb>\\d+)$=kind"]
    kept = load(RUN, LoadOptions(jobs=1, rows="analysis", labels=rule))
    reduced = load(RUN, LoadOptions(jobs=1, rows="reduce", labels=rule))
    assert reduced.labels == kept.labels and set(reduced.actions["rank"]) == {0}
    assert len(reduced.events) == len(kept.events)  # read again as working sets
    assert _document(reduced) == _document(kept)
