"""tracekit diff: what changed between two runs, the change that matters most first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import SAMPLES, shared_or_skip
from tracekit.analyze.compare import Measures, compare, measure
from tracekit.cli import main


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cached(monkeypatch, loaded_runs):
    """The command reads runs from the session's cache: loading is most of its time."""
    monkeypatch.setattr("tracekit.commands.diff.load_with_progress", lambda path, *_: loaded_runs(Path(path))[0])


def test_a_slow_stage_is_what_matters_most():
    # the real command end to end, no cache
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b_slow_stage2", "--no-progress")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("matters most: stage imbalance +") and "stage 2 (rank 2)" in first
    assert "by cause (share of the step window)" in result.output and "by rank (bubble ratio)" in result.output


def test_the_slow_stage_leads_and_the_ranks_that_wait_on_it_follow(cached):
    """Issue #28: the per-rank part began with rank 1 (+34 points of imbalance), which waits,
    before rank 2, whose compute doubled."""
    a, b = SAMPLES / "1f1b", SAMPLES / "1f1b_slow_stage2"
    result = cli("diff", a, b)
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    # the cause, then where its idle shows most
    assert "; stage 2 (rank 2) computes 292.4 ms/step more: +755.2 ms idle/step on the ranks that wait" in first
    assert first.index("stage 2 (rank 2)") < first.index("most on rank 1 (+34.1 points)")
    lines = result.output.splitlines()
    heading = lines.index(
        "by rank (bubble ratio), rank 2 first (its own compute grew), then the others, largest change first:"
    )
    assert lines[heading + 1].split()[:6] == ["rank", "A", "B", "change", "compute/step", "largest"]
    rows = [line.split() for line in lines[heading + 3 : heading + 7]]
    assert [int(row[0]) for row in rows] == [2, 1, 3, 0]
    assert rows[0][5:7] == ["+292.4", "ms"]
    doc = json.loads(cli("diff", a, b, "--json").stdout)
    assert doc["compute_grew"] == [2] and [c["rank"] for c in doc["ranks"]] == [2, 1, 3, 0]
    assert {c["rank"]: round(c["delta"] / 1e6, 1) for c in doc["compute"]} == {0: 5.8, 1: 2.3, 2: 292.4, 3: 4.6}


def _compute(before: dict[int, float], after: dict[int, float]):
    """Two runs that differ only in each rank's compute per step (ms)."""
    a = _measures({r: 0.3 for r in before})
    b = _measures({r: 0.3 for r in after})
    a.rank_compute_ns = {r: ms * 1e6 for r, ms in before.items()}
    b.rank_compute_ns = {r: ms * 1e6 for r, ms in after.items()}
    return compare(a, b)  # a step of 100 ms: 5 ms is OWN_COMPUTE_GROWTH of it


def test_a_rank_leads_only_where_its_own_compute_grew():
    assert _compute({0: 50, 1: 50, 2: 50, 3: 50}, {0: 50, 1: 51, 2: 80, 3: 50}).compute_grew == [2]
    # a growth every rank shares (a slower host) is no rank's
    assert _compute({0: 50, 1: 50, 2: 50, 3: 50}, {0: 60, 1: 61, 2: 62, 3: 60}).compute_grew == []
    # a rank left slower because the others shrank did not grow (an uneven split's middle stage)
    uneven = _compute({0: 50, 1: 50, 2: 50, 3: 50}, {0: 75, 1: 51, 2: 38, 3: 38})
    assert uneven.compute_grew == [0]
    assert [c.rank for c in uneven.ranks][0] == 0


def test_a_late_send_is_comm_latency(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("matters most: comm latency +") and "link " in first


def test_json_ranks_the_deltas_and_they_add_up(cached, loaded_runs):
    a, b = SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms"
    result = cli("diff", a, b, "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    causes = doc["causes"]
    assert [abs(c["delta"]) for c in causes] == sorted((abs(c["delta"]) for c in causes), reverse=True)
    assert doc["matters_most"]["key"] == causes[0]["key"] == "comm"
    # cause shares add up to the bubble ratio, so their changes add up to its change
    assert sum(c["delta"] for c in causes) == pytest.approx(doc["bubble_ratio"]["delta"], abs=1e-5)
    expected = measure(loaded_runs(b)[1]).bubble_ratio - measure(loaded_runs(a)[1]).bubble_ratio
    assert doc["bubble_ratio"]["delta"] == pytest.approx(expected, abs=1e-6)
    assert len(doc["ranks"]) == 4 and doc["same_schedule"] and doc["headline"].startswith("matters most: comm")


def test_different_schedules_compare_by_share_of_the_window(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "interleaved1f1b", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["same_schedule"] is False
    assert any(n.startswith("schedules differ (1F1B p=4 v=1 m=8 vs Interleaved1F1B p=4 v=2 m=8)") for n in doc["notes"])
    assert len(doc["causes"]) == 6 and doc["stages"] == []  # stage numbers mean other things
    console = cli("diff", SAMPLES / "1f1b", SAMPLES / "interleaved1f1b")
    assert "note: schedules differ" in console.output


def test_a_run_against_itself_changes_nothing(cached):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b", "--json")
    doc = json.loads(result.stdout)
    assert doc["matters_most"] is None and doc["headline"].startswith("matters most: nothing")
    assert all(c["delta"] == 0 for c in doc["causes"] + doc["ranks"] + doc["links"])


def test_across_formats_kineto_against_nsys(cached):
    nsys = shared_or_skip("nsys", "nsysai_mfu_2gpu_before.sqlite")
    result = cli("diff", SAMPLES / "1f1b", nsys)
    assert result.exit_code == 0, result.output
    assert "trace formats differ (kineto vs nsys-sqlite)" in result.output
    assert "no per-rank comparison" in result.output and "no per-cause comparison" in result.output
    assert result.output.startswith("matters most: bubble ratio")


def _measures(ranks: dict[int, float], causes: dict[str, float] | None = None, name="1F1B", p=2) -> Measures:
    return Measures(
        source=f"{name}-{len(ranks)}",
        formats=["kineto"],
        schedule={"name": name, "p": p, "v": 1, "m": 4},
        n_steps=1,
        step_ns=1e8,
        bubble_ratio=sum(ranks.values()) / len(ranks),
        rank_bubble=ranks,
        cause_share=causes or {},
    )


def test_different_pipeline_sizes_have_no_per_rank_rows():
    shares = {"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.0, "overhead": 0.0}
    more_comm = {**shares, "comm": 0.08}
    c = compare(_measures({0: 0.2, 1: 0.2}, shares), _measures({0: 0.3, 1: 0.3, 2: 0.25, 3: 0.25}, more_comm, p=4))
    assert c.ranks == [] and c.rank_causes == {}
    assert any("ranks differ (2 vs 4)" in n for n in c.notes) and any("schedules differ" in n for n in c.notes)
    assert c.headline().startswith("matters most: comm latency +8.0 points")


def test_small_changes_are_noise():
    shares = {"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.05, "overhead": 0.0}
    nudged = {**shares, "comm": 0.053}
    c = compare(_measures({0: 0.25, 1: 0.25}, shares), _measures({0: 0.253, 1: 0.253}, nudged))
    assert c.matters_most() is None
    moved = compare(_measures({0: 0.25, 1: 0.25}, shares), _measures({0: 0.26, 1: 0.26}, {**shares, "comm": 0.06}))
    assert moved.matters_most().key == "comm"


def test_the_comparison_computes_what_its_renderers_show():
    """The step's change, each rank's largest cause change and the blame that moved are the
    comparison's figures (the console and Markdown only format them)."""
    shares = {"warmup": 0.1, "drain": 0.1, "schedule_gaps": 0.0, "imbalance": 0.0, "comm": 0.05, "overhead": 0.0}
    a = _measures({0: 0.25, 1: 0.25}, shares)
    b = _measures({0: 0.3, 1: 0.26}, {**shares, "comm": 0.08})
    a.rank_cause_share = {0: dict(shares), 1: dict(shares)}
    b.rank_cause_share = {0: {**shares, "comm": 0.1, "drain": 0.08}, 1: {**shares, "warmup": 0.09}}
    a.stage_imbalance_ns, b.stage_imbalance_ns = {0: 1e6, 1: 2e6}, {0: 1e6, 1: 5e6}
    a.link_comm_ns, b.link_comm_ns = {(0, 1): 3e6}, {(0, 1): 1e6}
    b.step_ns = 1.25e8
    c = compare(a, b)
    assert c.step_delta_ns == 2.5e7 and c.step_change_pct == pytest.approx(25.0)
    assert c.top_cause_change(0) == ("comm", pytest.approx(0.05))
    assert c.top_cause_change(1) == ("warmup", pytest.approx(-0.01))
    assert c.top_cause_change(7) is None
    # stage 0 did not move; stage 1 grew by 3 ms, the link shrank by 2 ms
    assert [(ch.key, ch.delta) for ch in c.blame()] == [(c.stages[0].key, 3e6), (c.links[0].key, -2e6)]
    a.step_ns = 0
    assert compare(a, b).step_change_pct is None


# --- diff --markdown: the comparison for a pull-request comment ------------------------------


def _markdown_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_markdown_to_stdout_has_the_headline_and_the_figures_of_json(cached):
    a, b = SAMPLES / "1f1b", SAMPLES / "1f1b_slow_stage2"
    result = cli("diff", a, b, "--markdown", "-")
    assert result.exit_code == 0, result.output
    text = result.stdout
    doc = json.loads(cli("diff", a, b, "--json").stdout)
    # readable as text too: nothing escaped that could not start markup where it stands
    assert text.startswith("### tracekit diff: matters most: stage imbalance +25.0 points of the step window (1.0% -> ")
    figures = {row[0]: row[1:] for row in _markdown_rows(text, "| | A | B | change |")}
    assert figures["bubble ratio"] == ["30.4%", "44.8%", "+14.4 points"]
    assert figures["step time"] == [
        f"{doc['step_ns']['a'] / 1e6:.1f} ms",
        f"{doc['step_ns']['b'] / 1e6:.1f} ms",
        "+261.9 ms (+55.2%)",
    ]
    causes = _markdown_rows(text, "| cause |")
    # every cause, in the order (and with the changes) of --json
    assert [row[3] for row in causes] == [f"{100 * c['delta']:+.1f} points" for c in doc["causes"]]
    assert causes[0][0] == "stage imbalance"
    ranks = _markdown_rows(text, "| rank |")
    assert [int(row[0]) for row in ranks] == [c["rank"] for c in doc["ranks"]]
    assert _markdown_rows(text, "| stage / link |")[0][0] == "stage 2 (rank 2)"
    assert "\\" not in text  # no name from outside in this run's Markdown needs a backslash
    assert "matters most:" not in result.stderr  # no console text besides


def test_markdown_to_a_file_keeps_the_console_text(cached, tmp_path):
    a, b = SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms"
    path = tmp_path / "pr" / "comment.md"
    result = cli("diff", a, b, "--markdown", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("matters most: comm latency +")
    assert f"wrote {path}" in result.stderr
    assert path.read_text() == cli("diff", a, b, "--markdown", "-").stdout


def test_markdown_without_attribution_or_same_ranks_says_so():
    c = compare(_measures({0: 0.2, 1: 0.2}), _measures({0: 0.3, 1: 0.3, 2: 0.25, 3: 0.25}, p=4))
    from tracekit.render.diff_markdown import render

    text = render(c)
    assert "| cause |" not in text and "| rank |" not in text
    assert "> ranks differ (2 vs 4): no per-rank comparison" in text
    assert "no per-cause comparison" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--markdown", "-", "--json"], "both print to stdout"),
        (["--markdown", SAMPLES / "1f1b_p2p_delay5ms" / "rank0.json.gz"], "one of the run's input traces"),
    ],
)
def test_markdown_output_problems_are_one_line_before_loading(args, message):
    result = cli("diff", SAMPLES / "1f1b", SAMPLES / "1f1b_p2p_delay5ms", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
