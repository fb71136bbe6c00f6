"""Roll-ups across data-parallel replicas: per stage over replicas, the worst ranks, and the
patterns across replicas named as findings.

Inputs: the real samples laid out as replicas by ``benchmarks/make_input.py`` (identical
replicas), and ``generated_mixed_replicas`` (tests/generated_replicas.py: GENERATED runs whose
replicas are different real captures of the same configuration, built in the test's tmp dir).
"""

from __future__ import annotations

import html
import json
import re
import statistics
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from conftest import ROOT, SAMPLES, shared_or_skip
from generated_replicas import generated_mixed_replicas
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.analyze.replicas import others_median
from tracekit.cli import main
from tracekit.render import console
from tracekit.render.json import to_document

sys.path.insert(0, str(ROOT / "benchmarks"))
import make_input  # noqa: E402

SCHEMA = json.loads((ROOT / "tracekit" / "schemas" / "analysis.schema.json").read_text())
# replica 2 is the capture whose stage 2 computes 2x: rank 10 of the generated run
MIXED = ["1f1b", "1f1b", "1f1b_slow_stage2", "1f1b"]


@pytest.fixture(scope="module")
def mixed_analysis(tmp_path_factory):
    folder = generated_mixed_replicas(tmp_path_factory.mktemp("mixed") / "generated_mixed", MIXED)
    return folder, analyze(load(folder, LoadOptions(jobs=1, rows="analysis")))


@pytest.fixture(scope="module")
def mixed(mixed_analysis):
    folder, analysis = mixed_analysis
    return folder, to_document(analysis)


def _doc(folder):
    return to_document(analyze(load(folder, LoadOptions(jobs=1, rows="analysis"))))


def _spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _check_against_ranks(doc):
    """Every roll-up figure recomputed from the document's own per-rank figures."""
    rollup = doc["rollup"]
    ranks = {r["rank"]: r for r in doc["ranks"]}
    n_steps = rollup["n_steps"]
    assert n_steps == doc["summary"]["n_steps"]
    assert sorted(r for g in rollup["replicas"] for r in g) == sorted(ranks)
    assert rollup["bubble_ratio"] == pytest.approx(_spread([r["bubble_ratio"] for r in ranks.values()]), abs=1e-6)
    assert len(rollup["places"]) == (len(rollup["replicas"][0]) if doc["pipeline"] else 0)
    for place in rollup["places"]:
        assert place["ranks"] == [g[place["place"]] for g in rollup["replicas"]]
        rows = [ranks[r] for r in place["ranks"]]
        assert place["bubble_ratio"] == pytest.approx(_spread([r["bubble_ratio"] for r in rows]), abs=1e-6)
        assert place["idle_per_step_ns"] == pytest.approx(_spread([r["idle_ns"] / n_steps for r in rows]), abs=1)
        assert place["busy_per_step_ns"] == pytest.approx(_spread([r["busy_ns"] / n_steps for r in rows]), abs=1)
        worst = rows[place["worst_replica"]]
        assert worst["rank"] == place["worst_rank"]
        assert worst["bubble_ratio"] == pytest.approx(place["bubble_ratio"]["max"], abs=1e-6)
        assert rows[place["slowest_replica"]]["busy_ns"] / n_steps == pytest.approx(
            place["busy_per_step_ns"]["max"], abs=1
        )
        for cause, ns in place["causes_ns"].items():
            assert ns == sum(r["causes"][f"{cause}_ns"] for r in rows)
        if place["causes_ns"]:
            assert place["top_cause"] == max(place["causes_ns"], key=place["causes_ns"].get)
    by_bubble = [ranks[r]["bubble_ratio"] for r in rollup["ranks_by_bubble"]]
    assert sorted(rollup["ranks_by_bubble"]) == sorted(ranks) and by_bubble == sorted(by_bubble, reverse=True)


def test_rollup_figures_are_the_per_rank_figures_they_summarise(mixed):
    _, doc = mixed
    jsonschema.validate(doc, SCHEMA)
    assert doc["rollup"]["n_replicas"] == 4 and len(doc["ranks"]) == 16  # JSON keeps every rank
    _check_against_ranks(doc)


def test_identical_replicas_roll_up_and_show_no_pattern(tmp_path):
    folder = tmp_path / "pp16"
    make_input.build_pp(folder, ranks=16, copies=1, sample="1f1b")
    doc = _doc(folder)
    jsonschema.validate(doc, SCHEMA)
    _check_against_ranks(doc)
    assert doc["rollup"]["patterns"] == {"slow_replicas": [], "slowest_everywhere": None}
    assert not [f for f in doc["findings"] if f["cause"] in ("slow_replica", "slow_rank", "slowest_everywhere")]
    text = console.render(doc)
    assert "across replicas: no pattern" in text
    # every stage is equal over identical replicas: no replica is named the worst
    for place in doc["rollup"]["places"]:
        assert place["bubble_ratio"]["min"] == place["bubble_ratio"]["max"]


def test_the_slow_rank_of_one_replica_is_named_not_its_stage_everywhere(mixed):
    _, doc = mixed
    slow = doc["rollup"]["patterns"]["slow_replicas"]
    assert [s["replica"] for s in slow] == [2] and not slow[0]["every_place"]
    assert [r["rank"] for r in slow[0]["ranks"]] == [10]
    assert slow[0]["ranks"][0]["slowdown"] > 1.5  # the capture's stage 2 sleeps twice as long
    assert doc["rollup"]["patterns"]["slowest_everywhere"] is None  # only one replica has it
    finding = next(f for f in doc["findings"] if f["cause"] == "slow_rank")
    assert "Rank 10 (stage 2 of replica 2)" in finding["headline"] and "slow GPU or host" in finding["headline"]
    assert finding["severity"] == "high" and finding["figures"]["replica"] == 2
    # ranked with the others by cost: it costs more than the fill/drain of the schedule
    causes = [f["cause"] for f in doc["findings"]]
    assert causes.index("slow_rank") < causes.index("fill_drain")


def test_a_replica_slower_on_every_stage_is_a_slow_host(tmp_path):
    """Replica 1 is the real capture with every layer's sleep 12% longer (1f1b_slow_host)."""
    folder = generated_mixed_replicas(tmp_path / "generated_slow_host", ["1f1b", "1f1b_slow_host", "1f1b"])
    doc = _doc(folder)
    _check_against_ranks(doc)
    slow = doc["rollup"]["patterns"]["slow_replicas"]
    assert [s["replica"] for s in slow] == [1] and slow[0]["every_place"]
    assert 1.05 <= slow[0]["min_slowdown"] <= slow[0]["median_slowdown"] < 1.3
    finding = next(f for f in doc["findings"] if f["cause"] == "slow_replica")
    assert finding["headline"].startswith("Replica 1 (ranks 4-7) is ")
    assert "slower on every stage" in finding["headline"] and finding["headline"].endswith("a slow host?")
    assert not [f for f in doc["findings"] if f["cause"] == "slow_rank"]
    assert doc["rollup"]["timeline_replicas"][0]["replica"] == 1  # the slow replica's timeline comes first


def test_a_stage_slow_in_every_replica_is_the_split(tmp_path):
    folder = tmp_path / "slow_x3"
    make_input.build_pp(folder, ranks=12, copies=1, sample="1f1b_slow_stage2")
    doc = _doc(folder)
    everywhere = doc["rollup"]["patterns"]["slowest_everywhere"]
    assert everywhere["stages"] == [2] and everywhere["ranks"] == [2, 6, 10]
    finding = next(f for f in doc["findings"] if f["cause"] == "slowest_everywhere")
    assert finding["headline"].startswith("Stage 2 is the slowest in every replica")
    assert "across replicas: Stage 2 is the slowest in every replica" in console.render(doc)
    assert not doc["rollup"]["patterns"]["slow_replicas"]


def test_console_rolls_up_replicas_and_lists_the_worst_ranks(mixed):
    folder, doc = mixed
    text = console.render(doc)
    assert "per stage over 4 data-parallel replicas" in text
    assert "the 8 worst of 16 ranks" in text
    listed = _rank_rows(text)
    assert listed == doc["rollup"]["ranks_by_bubble"][:8]
    result = CliRunner().invoke(main, ["analyze", str(folder), "--ranks", "all", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert _rank_rows(result.output) == list(range(16))  # every rank, in rank order
    assert "per stage over" not in result.output
    three = CliRunner().invoke(main, ["analyze", str(folder), "--ranks", "3", "--no-cache"])
    assert _rank_rows(three.output) == doc["rollup"]["ranks_by_bubble"][:3]


def test_ranks_option_rejects_other_values_in_one_line(mixed):
    folder, _ = mixed
    result = CliRunner().invoke(main, ["analyze", str(folder), "--ranks", "some", "--no-cache"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "--ranks" in result.output


def test_single_pipeline_console_is_unchanged_by_the_rollup():
    doc = _doc(SAMPLES / "1f1b_slow_stage2")
    assert doc["rollup"]["n_replicas"] == 1
    _check_against_ranks(doc)
    without = {k: v for k, v in doc.items() if k != "rollup"}
    assert console.render(doc) == console.render(without)
    assert _rank_rows(console.render(doc)) == [0, 1, 2, 3]


def _rank_rows(text: str) -> list[int]:
    """The ranks of the console's per-rank table, in the order printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    rows = []
    for line in lines[start + 2 :]:
        first = line.split(" ", 1)[0]
        if not first.isdigit():
            break
        rows.append(int(first))
    return rows


# ---------------------------------------------------------------------------- HTML


def _report_bytes(folder) -> int:
    from tracekit.render.html import render_report

    return len(render_report(analyze(load(folder, LoadOptions(rows="analysis")))).encode())


def test_report_of_replicas_draws_one_replica_and_every_rank_in_the_heat_map(mixed_analysis, tmp_path):
    pytest.importorskip("bokeh")
    from tracekit.render.html import render_report
    from tracekit.render.html.views import step_views

    _, analysis = mixed_analysis
    rollup = analysis.replicas
    assert rollup.timeline_replicas[0][0] == 2  # the slowest replica is drawn first
    page = render_report(analysis)
    assert '"name":"replica-selector"' in page.replace(" ", "") and "replica 2 (ranks 8-11; slowest" in page
    assert '"name":"heatmap"' in page.replace(" ", "") and '"name":"spread"' in page.replace(" ", "")
    assert 'id="replica-stages"' in page and "Across replicas" in page
    assert f"{len(rollup.timeline_replicas)} of 4 data-parallel replicas kept" in page
    # the timeline holds the kept replicas' lanes, the slowest first and in view at the start
    groups = [(f"replica {r}", rollup.replicas[r]) for r, _ in rollup.timeline_replicas]
    views, _ = step_views(analysis, groups)
    assert views[0].lanes[:4] == ["rank 8", "rank 9", "rank 10", "rank 11"]
    assert views[0].groups[0] == ("replica 2", 0, 3)
    drawn = {int(r) for r in views[0].bars["rank"]}
    assert drawn == {r for _, ranks in groups for r in ranks}


def test_report_size_grows_per_rank_not_per_event(tmp_path):
    """128 ranks (32 replicas) against 32, and 32 ranks with three times the steps: the heat
    map and the distributions grow per rank, the timelines are of a few replicas only.
    (256 ranks measured 2.07 MB, 0.6 KB per extra rank; 128 keeps the test under a minute.)"""
    pytest.importorskip("bokeh")
    sizes = {}
    for ranks, copies in ((32, 1), (32, 3), (128, 1)):
        folder = tmp_path / f"pp{ranks}x{copies}"
        make_input.build_pp(folder, ranks=ranks, copies=copies, sample="1f1b")
        sizes[(ranks, copies)] = _report_bytes(folder)
    assert sizes[(128, 1)] < 4e6
    assert (sizes[(128, 1)] - sizes[(32, 1)]) / 96 < 2000  # bytes per extra rank
    assert abs(sizes[(32, 3)] - sizes[(32, 1)]) < 0.05 * sizes[(32, 1)]  # three times the events


def test_a_run_without_pipeline_of_many_ranks_lists_the_worst(tmp_path):
    """The real GPU trace written once per rank (make_input's ``gpu`` input, 20 ranks): no
    pipeline, so no stages, but still the worst ranks instead of 20 rows."""
    source = shared_or_skip("kineto-gpu", make_input.GPU_TRACE.name)
    folder = tmp_path / "gpu20"
    make_input.build_gpu(folder, ranks=20, target_mb=0.3, source=source)
    doc = _doc(folder)
    assert not doc["pipeline"] and doc["rollup"]["places"] == [] and len(doc["ranks"]) == 20
    _check_against_ranks(doc)
    text = console.render(doc)
    assert "the 8 of 20 ranks with the highest idle share" in text
    assert _rank_rows(text) == doc["rollup"]["ranks_by_bubble"][:8]
    assert _rank_rows(console.render(doc, ranks="all")) == list(range(20))


@pytest.mark.parametrize(
    "values", [[3.0], [1.0, 2.0], [5.0, 1.0, 3.0], [2.0, 2.0, 7.0, 1.0], [4.0, 9.0, 1.0, 1.0, 6.0, 3.0, 8.0]]
)
def test_others_median_is_the_median_of_the_others(values):
    expected = [
        statistics.median(values[:i] + values[i + 1 :]) if len(values) > 1 else values[0] for i in range(len(values))
    ]
    assert others_median(values) == pytest.approx(expected)


# Run in the page once bokeh has drawn it: pick the menu's second replica, then write the
# timeline figures' y ranges before and after into <pre id="probe"> for --dump-dom.
_PROBE = """<script>
function probe(tries) {
  const roots = ((window.Bokeh && Bokeh.documents) || []).flatMap(d => d.roots());
  const root = roots.find(r => r.children && r.children.length && r.children[0].options);
  if (!root && tries < 80) { setTimeout(() => probe(tries + 1), 250); return; }
  const out = {};
  const write = () => {
    const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
    document.body.prepend(pre);
  };
  if (!root) { out.error = "no menu"; write(); return; }
  const menu = root.children[0];
  const args = menu.js_property_callbacks["change:value"][0].args;
  const figures = args instanceof Map ? args.get("figures") : args.figures;
  const ranges = () => figures.map(f => [f.y_range.start, f.y_range.end]);
  out.options = menu.options; out.before = ranges();
  menu.value = menu.options[1];
  setTimeout(() => { out.after = ranges(); write(); }, 1000);
}
window.addEventListener("load", () => probe(0));
</script>
"""


def test_the_replica_menu_moves_the_timeline_in_a_browser(mixed_analysis, tmp_path):
    pytest.importorskip("bokeh")
    from test_html import CHROMIUM, chromium

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    from tracekit.render.html import render_report

    _, analysis = mixed_analysis
    page = render_report(analysis)
    end = page.rindex("</body>")  # the last one: bokeh's inlined script holds the string too
    path = tmp_path / "probe.html"
    path.write_text(page[:end] + _PROBE + page[end:], encoding="utf-8")
    result = chromium("--dump-dom", "--virtual-time-budget=30000", path.as_uri())
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout)
    assert match, result.stderr[-2000:]
    probe = json.loads(html.unescape(match.group(1)))
    kept = [r for r, _ in analysis.replicas.timeline_replicas]
    assert [o.split(" (")[0] for o in probe["options"]] == [f"replica {r}" for r in kept]
    # lanes: the first replica's 4 ranks, then the second's: the menu moves the view there
    assert probe["before"] == [[3.5, -0.5]] * len(probe["before"])
    assert probe["after"] == [[7.5, 3.5]] * len(probe["before"])
