"""Property-based fuzz test: mutated copies of the project's real captures (generated
fixtures, made by fuzz/mutate.py in a temporary folder) through the CLI, judged by
fuzz/oracle.py.

For every mutation category, a few cases drawn by hypothesis (derandomized, so CI draws the
same ones) must end in an answer or in tracekit's own one-line error that names the file or
the run folder: no traceback, no hang, no raw control character on the terminal or in the
Markdown file, a JUnit file that parses, inputs left as they were, and an unchanged answer
where the mutation must not change it. The long run is fuzz/run.py (10,000 cases).
"""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from fuzz.mutate import CATEGORIES, Case, kineto_files, make_case, unmutated_case
from fuzz.oracle import Oracle, _Invocation

# Per category: 16 categories x 5 cases take about 30 s on a shared 2-core machine.
CASES_PER_CATEGORY = 5


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Oracle:
    # In process only: deterministic, and fast enough for the suite (fuzz/run.py samples real processes).
    return Oracle(tmp_path_factory.mktemp("fuzz"), timeout_s=20, subprocess_every=0)


@pytest.mark.parametrize("category", CATEGORIES)
@settings(
    max_examples=CASES_PER_CATEGORY,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # an index is not made smaller by shrinking it
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# sampled_from, not integers: hypothesis mixes into integers() constants found in the modules
# loaded at the time, so the whole suite would draw other cases than this file alone.
@given(seed=st.sampled_from(range(2**31)), index=st.sampled_from(range(2**31)))
def test_mutated_run_answers_or_fails_in_one_line(oracle, category, seed, index):
    case = make_case(seed, index, category)
    outcome = oracle.run(case)
    assert not outcome.failed, (
        f"replay {case.replay_id} ({category}): {case.detail}: "
        f"{outcome.outcome} in {outcome.command}: {outcome.message}"
    )


@pytest.mark.parametrize("index, hostile", list(enumerate(["\x1b[31m", "\x07", "\x9b2J", "`x`|<b>"])))
def test_a_hostile_run_folder_name_reaches_no_output_raw(oracle, index, hostile):
    """The folder name is in the console header, the Markdown summary and the JUnit file."""
    case = Case(
        seed=0,
        index=index,
        category="kineto-strings",
        detail=f"run folder name ends {hostile!r}",
        base="kineto",
        files=dict(kineto_files()),
        expect="same",
        folder_suffix=hostile,
    )
    outcome = oracle.run(case)
    assert not outcome.failed, f"{outcome.outcome} in {outcome.command}: {outcome.message}"


@pytest.mark.parametrize("category", CATEGORIES)
def test_a_case_is_reproducible_from_seed_and_index(category):
    first, again = make_case(7, 11, category), make_case(7, 11, category)
    assert (first.files, first.detail, first.options) == (again.files, again.detail, again.options)


@pytest.mark.parametrize("index", range(8))
def test_harmless_mutations_really_change_the_input(index):
    """An answer compared to the unmutated run's proves nothing when the input is the same."""
    for category, base in (("kineto-same", "kineto"), ("nsys-same", "nsys"), ("folder-same", "kineto")):
        case = make_case(3, index, category)
        assert case.expect == "same"
        assert case.files != unmutated_case(base).files, case.detail


@pytest.mark.parametrize("index", range(4))
def test_a_retyped_event_field_reaches_the_document(index):
    case = make_case(5, index, "kineto-event")
    mutated = json.loads(gzip.decompress(case.files[case.target]))
    original = json.loads(gzip.decompress(unmutated_case("kineto").files[case.target]))
    assert mutated["traceEvents"] != original["traceEvents"], case.detail


def _verdict(oracle, case, exit_code, stderr, stdout=""):
    run_dir = oracle.workdir / f"fuzzrun-{case.seed}-{case.index}"
    return oracle._verdict(case, run_dir, _Invocation("analyze", exit_code, stdout, stderr), ok_codes=(0,)).outcome


def test_oracle_tells_an_error_line_from_a_traceback_and_a_multi_line_error(oracle):
    case = make_case(1, 2, "kineto-header")
    named = f"tracekit: error: /x/{case.target}: traceEvents is null; capture the trace again\n"
    assert _verdict(oracle, case, 2, named) == "error"
    assert _verdict(oracle, case, 2, "tracekit: error: something is wrong\n") == "unnamed error"
    assert _verdict(oracle, case, 2, named + "and another line\n") == "multi-line error"
    assert _verdict(oracle, case, 3, "tracekit: internal error: TypeError: x\n") == "traceback"
    assert _verdict(oracle, case, 0, "", "Traceback (most recent call last):\n") == "traceback"
    assert _verdict(oracle, case, 1, "") == "traceback"
    assert _verdict(oracle, case, 0, "", "rank \x1b[31m0\n") == "raw control chars"
    assert _verdict(oracle, case, 0, "", "rank \x9b0\n") == "raw control chars"
    assert _verdict(oracle, case, 0, "", "rank\t0\n") == "ok"
    assert _verdict(oracle, case, None, "no answer after 20 s") == "hang"


def test_a_cut_at_event_boundaries_reads_as_truncated_and_check_refuses_it(tmp_path):
    """A real rank file cut right after its k-th event (as a profiler stopped mid-write leaves
    it), at every 61st boundary plus the first and last few: the parser reads exactly the k
    events and says the file is truncated (nothing salvageable: one line); at a few of them
    the whole run is announced as incomplete first and ``check`` refuses it. The long run,
    every boundary of every rank, is ``python fuzz/truncate.py``."""
    from fuzz.truncate import command_checks, event_boundaries
    from tracekit.errors import TraceFormatError
    from tracekit.ingest.kineto import read_kineto

    run = ROOT / "sample_traces" / "1f1b"
    text = gzip.decompress((run / "rank2.json.gz").read_bytes())
    cuts = event_boundaries(text)
    assert len(cuts) == len(json.loads(text)["traceEvents"]) + 1
    path = tmp_path / "rank2.json"
    picked = sorted(set(range(0, len(cuts), 61)) | {0, 1, 2, len(cuts) - 2, len(cuts) - 1})
    for k in picked:
        path.write_bytes(text[: cuts[k]])
        if k == 0:
            with pytest.raises(TraceFormatError):
                read_kineto(path, 0)
            continue
        trace, _ = read_kineto(path, 0)
        assert trace.truncated and trace.n_events_raw == k, k
    n, failures = command_checks(run, "rank2.json.gz", text, len(cuts) // 3, tmp_path)
    assert n >= 3 and not failures, failures
