"""Names from a trace that try to drive a terminal, break XML or smuggle Markdown and HTML.

The run under test is a copy of the real sample capture sample_traces/1f1b in a folder whose
name holds ESC, BEL, a C1 CSI, a right-to-left override, backticks, a Markdown link and an
``<img>`` tag; in the copy, rank 0's host_name and one of its events are renamed to the same
and more (NUL and ``</script>``, which a file name cannot hold), and rank 3's file is renamed
too and cut short by two bytes, so that a warning and the line that says the run is
incomplete quote its name (the gates are run with ``--allow-incomplete``). Every command runs as a
subprocess, and what it prints is checked byte by byte.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from markdown_it import MarkdownIt

from conftest import SAMPLES
from tracekit.text import for_markdown_code, for_markdown_text, for_terminal, for_xml

# No "/" (a path separator) and no NUL (no file name can hold one).
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b\u202e`x``](http:x)<img src=x>|y"
HOSTILE_EVENT = HOSTILE + "\x00</script><script>alert(1)</script>](http://x) \u2066\n- item"
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _hostile_copy(folder: Path) -> Path:
    run = folder / f"run{HOSTILE}"
    run.mkdir(parents=True)
    source = SAMPLES / "1f1b"
    for name in ("rank1.json.gz", "rank2.json.gz", "capture.json"):
        shutil.copy(source / name, run / name)
    rank0 = json.loads(gzip.decompress((source / "rank0.json.gz").read_bytes()))
    rank0["host_name"] = "host" + HOSTILE_EVENT
    next(e for e in rank0["traceEvents"] if e.get("cat") == "cpu_op")["name"] = HOSTILE_EVENT
    step = next(e for e in rank0["traceEvents"] if e.get("name", "").startswith("ProfilerStep"))
    # a kernel: the report's timeline shows kernels by name
    rank0["traceEvents"].append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": HOSTILE_EVENT,
            "pid": 0,
            "tid": 7,
            "ts": step["ts"] + step["dur"] / 2,
            "dur": 5,
            "args": {"stream": 7},
        }
    )
    (run / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(rank0).encode()))
    rank3 = gzip.decompress((source / "rank3.json.gz").read_bytes())
    (run / f"rank3{HOSTILE}.json").write_bytes(rank3.rstrip()[:-2])  # ends early: a warning names it
    return run


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    return _hostile_copy(tmp_path_factory.mktemp("hostile"))


def tracekit(*args: str | os.PathLike | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command line, as a user's shell runs it: bytes out, strict UTF-8."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args, "--no-progress"],
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def assert_inert(printed: bytes) -> str:
    """What a command printed holds no character that a terminal acts on (newlines aside)."""
    text = printed.decode("utf-8")  # strict: a raw 0x9b byte, or a lone surrogate's, fails here
    leaked = sorted(
        {c for c in text if c != "\n" and (unicodedata.category(c) in ("Cc", "Cs") or c in BIDI or c in "\u2028\u2029")}
    )
    assert not leaked, f"raw {[hex(ord(c)) for c in leaked]} reached the terminal"
    return text


def test_analyze_prints_the_folder_and_file_names_escaped(hostile_run):
    done = tracekit("analyze", hostile_run)
    assert done.returncode == 0, done.stderr
    out = assert_inert(done.stdout)
    assert_inert(done.stderr)
    first, second = out.splitlines()[:2]
    assert first.startswith(
        f"INCOMPLETE RUN: rank 3's trace is cut short (rank3{for_terminal(HOSTILE)}.json ends early"
    )
    assert f"tracekit 0.1.0: {for_terminal(hostile_run)}" in second
    assert f"  - rank3{for_terminal(HOSTILE)}.json: the file ends early" in out
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b\\u202e" in out


def test_a_cached_analysis_prints_escaped_too(hostile_run, tmp_path):
    cache = tmp_path / "cache"
    first, second = (tracekit("analyze", hostile_run, "--cache-dir", cache) for _ in range(2))
    assert first.returncode == second.returncode == 0
    assert assert_inert(second.stdout) == assert_inert(first.stdout)


def test_html_report_shows_names_as_text_and_controls_as_escapes(hostile_run, tmp_path):
    report = tmp_path / f"report{HOSTILE}.html"
    done = tracekit("report", hostile_run, "-o", report)
    assert done.returncode == 0, done.stderr
    assert f"wrote {for_terminal(report)}" in assert_inert(done.stderr)
    page = report.read_text(encoding="utf-8")
    assert "<img src=x>" not in page and "</script><script>alert" not in page
    leaked = {c for c in page if unicodedata.category(c) in ("Cc", "Cs") and c not in "\n\t\r"} | (set(page) & BIDI)
    assert not leaked
    # shown, escaped: the title, the host in the files table, the kernel's name in the timeline data
    assert f"<title>tracekit report: {for_xml(hostile_run)}".replace("<img src=x>", "&lt;img src=x&gt;") in page
    assert "host\\x1b]0;pwned\\x07\\x1b[2J\\x9b\\u202e`x``](http:x)&lt;img src=x&gt;|y\\x00&lt;/script&gt;" in page
    assert page.count("\\\\x1b]0;pwned\\\\x07") >= 1  # the label, inside bokeh's JSON


def _gate(hostile_run, tmp_path, *outputs) -> subprocess.CompletedProcess:
    """``check`` with a bubble limit the run fails (30% > 10%), its cut rank 3 allowed."""
    return tracekit(
        "check", hostile_run, "--max-bubble", "0.1", "--allow-incomplete", *outputs, "--no-config", cwd=tmp_path
    )


def test_check_junit_parses_and_shows_the_names(hostile_run, tmp_path):
    junit, markdown = tmp_path / "check.xml", tmp_path / f"check{HOSTILE}.md"
    done = _gate(hostile_run, tmp_path, "--junit", junit, "--markdown", markdown)
    assert done.returncode == 1, done.stderr  # 30% > 10%: a failed check, printed
    out = assert_inert(done.stdout)
    err = assert_inert(done.stderr)
    assert f"tracekit check {for_terminal(hostile_run)} (1F1B p=4 v=1 m=8): FAILED" in out
    assert f"wrote {for_terminal(markdown)}" in err
    suite = ET.parse(junit).getroot().find("testsuite")  # expat: a strict XML 1.0 parser
    assert suite.get("name") == f"tracekit check {for_xml(hostile_run)}"
    assert for_xml(str(hostile_run)) in suite.find("system-out").text


def test_check_json_mode_prints_failure_lines_escaped(hostile_run, tmp_path):
    done = _gate(hostile_run, tmp_path, "--json")
    assert done.returncode == 1
    assert json.loads(assert_inert(done.stdout))["source"] == str(hostile_run)
    assert "FAIL bubble ratio" in assert_inert(done.stderr)


def test_check_markdown_is_inert(hostile_run, tmp_path):
    markdown = tmp_path / "check.md"
    done = _gate(hostile_run, tmp_path, "--markdown", markdown)
    assert done.returncode == 1
    first_lines = markdown.read_text(encoding="utf-8").splitlines()
    context = first_lines[2]
    assert context.startswith(for_markdown_code(str(hostile_run)) + " · 1F1B")
    html = _github_html(markdown.read_text(encoding="utf-8"))
    assert f"<p><code>{_html_text(for_terminal(hostile_run))}</code> · 1F1B" in html
    _assert_no_live_markup(html.replace("<details><summary>all checks</summary>", ""))


@pytest.mark.parametrize(
    "command, options, exit_code",
    [
        ("diff", [SAMPLES / "1f1b"], 0),
        ("whatif", ["-s", "1F1B", "-m", "8", "--replays", "4"], 2),  # refused: rank 3's trace is cut
        ("export", ["-o", f"merged{HOSTILE}.json.gz"], 0),
        ("baseline", ["-o", f"base{HOSTILE}.json", "--allow-incomplete"], 0),
    ],
)
def test_diff_whatif_export_and_baseline_print_escaped(hostile_run, tmp_path, command, options, exit_code):
    done = tracekit(command, hostile_run, *options, cwd=tmp_path)
    assert done.returncode == exit_code, done.stderr
    printed = assert_inert(done.stdout) + assert_inert(done.stderr)
    assert for_terminal(HOSTILE) in printed


def test_errors_quote_hostile_file_names_escaped(tmp_path):
    run = tmp_path / f"bad{HOSTILE}"
    run.mkdir()
    (run / f"rank0{HOSTILE}.json").write_text("this is not a trace")
    for target in (run, tmp_path / f"missing{HOSTILE}"):
        done = tracekit("analyze", target)
        assert done.returncode == 2, done.stderr
        err = assert_inert(done.stderr)
        assert err.startswith("tracekit: error: ") and for_terminal(HOSTILE) in err
        assert len(err.splitlines()) == 1


def test_undecodable_bytes_in_the_folder_name_print_as_escapes(tmp_path):
    """A name that is not UTF-8 reaches Python as lone surrogates: printed as they are, they
    would be the raw byte 0x9b (CSI) or a crash in the encoder."""
    base = os.fsencode(tmp_path)
    run = base + b"/run\x9b\xff"
    shutil.copytree(SAMPLES / "1f1b", os.fsdecode(run))
    junit, markdown = base + b"/check\x9b.xml", base + b"/check\x9b.md"
    done = tracekit(
        "check", run, "--max-bubble", "0.1", "--junit", junit, "--markdown", markdown, "--no-config", cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert "run\\udc9b\\udcff (1F1B" in assert_inert(done.stdout)
    assert "check\\udc9b.xml" in assert_inert(done.stderr)
    assert ET.parse(os.fsdecode(junit)).getroot().find("testsuite").get("name").endswith("run\\udc9b\\udcff")
    assert "run\\udc9b\\udcff" in Path(os.fsdecode(markdown)).read_text(encoding="utf-8")
    done = tracekit("analyze", run, "--html", base + b"/report\x9b.html")
    assert done.returncode == 0, done.stderr
    assert "run\\udc9b\\udcff" in assert_inert(done.stdout)


# ------------------------------------------------------------------ the escapes themselves

UNSAFE_FOR_TERMINALS = (
    [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))] + sorted(BIDI) + ["\u2028", "\u2029", "\udc9b"]
)


@pytest.mark.parametrize("char", UNSAFE_FOR_TERMINALS, ids=lambda c: f"U+{ord(c):04X}")
def test_for_terminal_writes_every_control_as_a_visible_escape(char):
    shown = for_terminal(f"a{char}b")
    assert shown.isprintable() and shown.startswith("a\\") and shown.endswith("b")
    assert for_terminal(shown) == shown  # escaping twice changes nothing


def test_for_terminal_keeps_printable_text():
    text = "rank 3 · stage→2 ✓ é 中文 \\x1b C:\\runs"
    assert for_terminal(text) == text


@pytest.mark.parametrize(
    "char",
    [chr(c) for c in range(0x20)] + ["\x7f", "\x9b", "\ud800", "\ufffe", "\uffff", "\u202e"],
    ids=lambda c: f"U+{ord(c):04X}",
)
def test_for_xml_output_parses_and_round_trips_visibly(char):
    text = f"a{char}b<&\"'>"
    element = ET.Element("case", name=for_xml(text))
    element.text = for_xml(text)
    parsed = ET.fromstring(ET.tostring(element, encoding="utf-8"))
    assert parsed.get("name") == parsed.text == for_xml(text)
    assert char in "\t\n" or char not in parsed.text


HOSTILE_MARKDOWN = [
    "run`](http://x)",
    "a``b",
    "```",
    "`",
    " x ",
    "",
    "<img src=x>",
    "</details><script>alert(1)</script>",
    "x](http://evil)",
    "[link](http://evil)",
    "![i](http://x/i.png)",
    "www.evil.com",
    "http://evil.com",
    "mail@evil.com",
    "a|b",
    "line\n# heading\n- item\n\n<img src=x>",
    "*em* _em_ **b** ~~s~~",
    "&lt;img&gt;",
    "\\`",
    HOSTILE,
    HOSTILE_EVENT,
    # what opens a block where the text starts a line
    "1. item",
    "2) item",
    "   3. item",
    "> quote",
    "- item",
    "+ item",
    "# heading",
    "===",
    "---",
    # and what is live anywhere in it
    "heading ##",
    "_em_ a_b_c __init__",
    "a~b~ $x$",
    "&copy; &#42; & x",
    "evil.com WWW.evil.com www.1.com",
    "mailto:x@evil.com xmpp:x@evil.com ftp://evil.com",
    "a\\",
]


@pytest.mark.parametrize("text", HOSTILE_MARKDOWN)
def test_markdown_code_span_shows_the_text_and_nothing_else(text):
    shown = for_terminal(text) or " "  # a code span cannot be empty
    for render in (_github_html, _commonmark_html):
        html = render(f"before {for_markdown_code(text)} after\n")
        assert html.strip() == f"<p>before <code>{_html_text(shown)}</code> after</p>", render
    # at the start of a line, a fence of three or more backticks is still a code span
    assert _github_html(for_markdown_code(text) + " after\n").startswith("<p><code>")


@pytest.mark.parametrize("text", HOSTILE_MARKDOWN)
def test_markdown_text_renders_as_itself_in_a_table_cell_and_a_quote(text):
    # as itself but for the invisible word joiner after "@" and the spaces at either end
    shown = _html_text(for_terminal(text)).replace("@", "@\u2060").strip()
    table = f"| check | rule |\n|---|---|\n| {for_markdown_text(text)} | x |\n"
    for render in (_github_html, _commonmark_html):
        html = render(table)
        assert f"<td>{shown}</td>" in html, render
        assert html.count("<td>") == 2  # the "|" in the text split no cell
    quote = _github_html(f"> {for_markdown_text(text)}\n")
    assert quote.strip() == (f"<blockquote>\n<p>{shown}</p>\n</blockquote>" if shown else "<blockquote>\n</blockquote>")


@pytest.mark.parametrize("text", HOSTILE_MARKDOWN)
def test_markdown_text_renders_as_itself_after_other_text_and_in_a_cell(text):
    shown = _html_text(for_terminal(text)).replace("@", "@\u2060")
    mid_line = for_markdown_text(text, line_start=False)  # after other text: no block can open
    for render in (_github_html, _commonmark_html):
        heading = render(f"### tracekit diff: {mid_line}\n")
        assert _words(heading) == _words(f"<h3>tracekit diff: {shown}</h3>"), render
        item = render(f"- **A**: {mid_line} · kineto\n")
        assert _words(item) == _words(f"<ul>\n<li><strong>A</strong>: {shown} · kineto</li>\n</ul>"), render
        table = render(f"| check | rule |\n|---|---|\n| {mid_line} | x |\n")
        assert f"<td>{shown.strip()}</td>" in table and table.count("<td>") == 2, render


def _words(html: str) -> list[str]:
    """HTML split at white space (a heading drops the spaces at its ends, a paragraph keeps them)."""
    return html.replace("<", " <").replace(">", "> ").split()


def test_markdown_text_escapes_only_what_could_start_markup():
    """Issue #28: `diff --markdown -` read "\\+25\\.0 points \\(1\\.0\\% \\-\\> ..." in a terminal."""
    figures = "matters most: stage imbalance +25.0 points of the step window (1.0% -> 26.0%); stage 2 (rank 2)"
    assert for_markdown_text(figures) == figures
    assert for_markdown_text("pipeline warm-up, overhead/other, schedule_gaps, link 3->2, p=4 v=1") == (
        "pipeline warm-up, overhead/other, schedule_gaps, link 3->2, p=4 v=1"
    )
    # where a character could start markup, it is escaped, and there only
    assert (
        for_markdown_text("- 1. a_b _c_ *d* x.com 1.5 http://y") == "\\- 1. a_b \\_c\\_ \\*d\\* x\\.com 1.5 http\\://y"
    )
    assert for_markdown_text("1. first") == "1\\. first"
    # after other text on its line, a list marker or quote opens nothing
    assert for_markdown_text("+12.2 points, > 1. - x", line_start=False) == "+12.2 points, > 1. - x"


def _github_html(markdown: str) -> str:
    """GitHub's own renderer (cmark-gfm, with autolinks and tables), raw HTML let through so
    that a test sees any that the Markdown holds."""
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)


def _commonmark_html(markdown: str) -> str:
    return MarkdownIt("gfm-like", {"html": True}).render(markdown)


def _html_text(text: str) -> str:
    """``text`` as both renderers write it in HTML."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _assert_no_live_markup(html: str) -> None:
    for tag in ("<a ", "<img", "<script", "<h1", "<h2"):
        assert tag not in html, tag


def test_diff_markdown_is_inert(hostile_run, tmp_path):
    done = tracekit("diff", SAMPLES / "1f1b", hostile_run, "--markdown", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = assert_inert(done.stdout)
    assert f"- **B**: {for_markdown_code(str(hostile_run))} · kineto" in text
    html = _github_html(text)
    assert f"<code>{_html_text(for_terminal(hostile_run))}</code>" in html
    _assert_no_live_markup(html)
