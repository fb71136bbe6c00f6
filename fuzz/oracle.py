"""Run a fuzz case through the tracekit CLI and say what happened.

Most cases run in this process (click's CliRunner, ``--jobs 1``, a SIGALRM deadline for
hangs, one parse cache for all cases so the unmutated sibling files of a run are parsed
once); every ``subprocess_every``-th case runs its analysis as a real ``tracekit`` process
with ``--jobs 2`` (worker pools, real exit codes, a killed process group on a hang).

Outcomes, worst first (a case gets the worst one any of its commands earned):
``hang``, ``traceback`` (exit 3, any other unexpected exit status, or Traceback text),
``input modified``, ``multi-line error``, ``unnamed error`` (exit 2 with one line that names
neither the mutated file nor the run folder), ``raw control chars`` (a C0/C1 control other
than newline and tab in stdout, stderr or the Markdown file), ``bad output`` (a JUnit or
JSON file that does not parse), ``changed answer`` (a mutation that must not change the
answer changed it, or made the run unreadable), ``silent change`` (a mutation of bad input
changed the answer without a new warning), then ``error`` and ``ok``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from fuzz.mutate import Case, unmutated_case, write_case

OUTCOMES = (
    "hang",
    "traceback",
    "input modified",
    "multi-line error",
    "unnamed error",
    "raw control chars",
    "bad output",
    "changed answer",
    "silent change",
    "error",
    "ok",
)
FAILURES = OUTCOMES[:-2]
# C0 controls but newline and tab, DEL, C1 controls: what a terminal or a Markdown viewer
# may act on (ESC starts a terminal escape; \x9b is the one-byte CSI).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The parts of the analysis document that are the answer (not paths, evidence or prose).
ANSWER_KEYS = ("pipeline", "summary", "theory", "ranks", "steps", "blame")
# Categories whose hostile strings can reach the CI outputs, so every case of them also runs check.
CHECKED_CATEGORIES = ("kineto-strings", "capture", "nsys-cells", "options")


class CaseTimeout(BaseException):
    """Raised by SIGALRM in a case that ran past its deadline (a BaseException, so neither
    tracekit's own ``except Exception`` nor click's runner swallows it)."""


@dataclass(frozen=True)
class Outcome:
    outcome: str
    message: str  # the first line of the evidence
    command: str  # which invocation earned the outcome

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


@dataclass
class _Invocation:
    command: str
    exit_code: int | None  # None: it hung
    stdout: str
    stderr: str
    exception: BaseException | None = None


def answer(doc: dict) -> dict:
    """The figures of an analysis document that a harmless mutation must leave alone."""
    figures = {key: doc.get(key) for key in ANSWER_KEYS}
    schedule = doc.get("schedule")
    figures["schedule"] = (
        {k: v for k, v in schedule.items() if k != "evidence"} if isinstance(schedule, dict) else schedule
    )
    return figures


def warnings_of(doc: dict, run_dir: Path) -> set[str]:
    """Every warning of the document, with the run folder's path taken out."""
    found = list(doc.get("warnings") or [])
    for trace in doc.get("files") or []:
        found.extend(trace.get("warnings") or [])
    return {str(w).replace(str(run_dir), "RUN") for w in found}


def _strict_json(text: str):
    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


class Oracle:
    """Runs cases in ``workdir`` (each case's folder is removed after it ran)."""

    def __init__(
        self, workdir: Path, timeout_s: float = 20.0, subprocess_every: int = 20, cache_every: int = 200
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cache_dir = self.workdir / "parse-cache"
        self.timeout_s = timeout_s
        self.subprocess_every = subprocess_every
        self.cache_every = cache_every  # cases between wipes of the parse cache (it grows by one entry a case)
        self._answers: dict[str, tuple[dict, set[str]]] = {}
        self._cases_run = 0

    # -- one case ------------------------------------------------------------------------

    def run(self, case: Case) -> Outcome:
        self._cases_run += 1
        if self._cases_run % self.cache_every == 0:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
        base_answer, base_warnings = self._base(case.base)
        run_dir = self.workdir / f"{_folder_stem(case)}{case.folder_suffix}"
        out_dir = self.workdir / f"out-{case.seed}-{case.index}"
        for stale in (run_dir, out_dir):
            shutil.rmtree(stale, ignore_errors=True)
        write_case(case, run_dir)
        out_dir.mkdir()
        try:
            return self._judge(case, run_dir, out_dir, base_answer, base_warnings)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(out_dir, ignore_errors=True)

    def _judge(self, case: Case, run_dir: Path, out_dir: Path, base_answer: dict, base_warnings: set[str]) -> Outcome:
        doc_path = out_dir / "analysis.json"
        options = [o.replace("{run}", str(run_dir)).replace("{out}", str(out_dir)) for o in case.options]
        common = ["--no-progress", "--cache-dir", str(self.cache_dir), *options]
        analyze_args = ["analyze", str(run_dir), "-o", str(doc_path), *common]
        in_subprocess = self.subprocess_every and case.index % self.subprocess_every == 0
        results = []
        analyzed = (
            self._subprocess(analyze_args + ["--jobs", "2"])
            if in_subprocess
            else self._in_process(analyze_args + ["--jobs", "1"])
        )
        results.append(self._verdict(case, run_dir, analyzed, ok_codes=(0,)))
        junit_path, markdown_path = out_dir / "check.xml", out_dir / "check.md"
        if analyzed.exit_code is not None and (case.category in CHECKED_CATEGORIES or case.index % 4 == 0):
            checked = self._in_process(
                [
                    "check",
                    str(run_dir),
                    "--max-bubble",
                    "0.5",
                    "--no-config",
                    "--junit",
                    str(junit_path),
                    "--markdown",
                    str(markdown_path),
                    *common,
                    "--jobs",
                    "1",
                ]
            )
            results.append(self._verdict(case, run_dir, checked, ok_codes=(0, 1)))
            results.extend(self._ci_files(junit_path, markdown_path))
        results.append(self._inputs_intact(case, run_dir))
        if analyzed.exit_code == 0:
            results.append(self._compare(case, run_dir, doc_path, base_answer, base_warnings))
        elif analyzed.exit_code == 2 and case.expect == "same":
            results.append(
                Outcome("changed answer", f"a harmless mutation was refused: {_first(analyzed.stderr)}", "analyze")
            )
        found = [r for r in results if r is not None]
        return min(found, key=lambda r: OUTCOMES.index(r.outcome))

    # -- running the CLI -----------------------------------------------------------------

    def _in_process(self, args: list[str]) -> _Invocation:
        from click.testing import CliRunner

        from tracekit.cli import main

        def expire(signum, frame):
            raise CaseTimeout()

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        try:
            # The default cache (an empty --cache-dir) is this oracle's too, never the user's.
            result = CliRunner(env={"TRACEKIT_CACHE_DIR": str(self.cache_dir)}).invoke(main, args)
        except CaseTimeout:
            return _Invocation(args[0], None, "", f"no answer after {self.timeout_s:g} s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        exception = result.exception if not isinstance(result.exception, SystemExit) else None
        return _Invocation(args[0], result.exit_code, result.stdout, result.stderr, exception)

    def _subprocess(self, args: list[str]) -> _Invocation:
        env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_DEBUG"}
        env["TRACEKIT_CACHE_DIR"] = str(self.cache_dir)
        proc = subprocess.Popen(
            [*tracekit_command(), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s * 2)  # process start-up and a pool
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the run and its pool workers
            proc.communicate()
            return _Invocation(args[0] + " (subprocess)", None, "", f"no answer after {self.timeout_s * 2:g} s")
        return _Invocation(
            args[0] + " (subprocess)",
            proc.returncode,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
        )

    # -- judging -------------------------------------------------------------------------

    def _verdict(self, case: Case, run_dir: Path, run: _Invocation, ok_codes: tuple[int, ...]) -> Outcome:
        if run.exit_code is None:
            return Outcome("hang", run.stderr, run.command)
        if run.exception is not None:
            return Outcome("traceback", f"{type(run.exception).__name__}: {_first(str(run.exception))}", run.command)
        if "Traceback (most recent call last)" in run.stdout + run.stderr or run.exit_code not in (*ok_codes, 2):
            return Outcome(
                "traceback", f"exit {run.exit_code}: {_first(run.stderr) or _first(run.stdout)}", run.command
            )
        raw = RAW_CONTROL.search(run.stdout + run.stderr)
        if run.exit_code == 2:
            lines = [line for line in run.stderr.splitlines() if line.strip()]
            if len(lines) != 1 or not lines[0].startswith("tracekit: error: "):
                return Outcome("multi-line error", " | ".join(lines)[:300] or "(no message)", run.command)
            culprits = [_folder_stem(case), *case.names] + ([case.target] if case.target else [])
            if not any(name in lines[0] for name in culprits):
                return Outcome("unnamed error", lines[0], run.command)
            if raw:
                return Outcome("raw control chars", f"{raw.group()!r} in: {lines[0][:200]}", run.command)
            return Outcome("error", lines[0], run.command)
        if raw:
            at = raw.start()
            text = run.stdout + run.stderr
            return Outcome("raw control chars", f"{raw.group()!r} in: {text[max(0, at - 60) : at + 20]!r}", run.command)
        return Outcome("ok", "", run.command)

    @staticmethod
    def _ci_files(junit_path: Path, markdown_path: Path) -> list[Outcome]:
        found = []
        if junit_path.exists():
            try:
                ET.parse(junit_path)
            except ET.ParseError as err:
                found.append(Outcome("bad output", f"JUnit file does not parse: {err}", "check"))
        if markdown_path.exists():
            try:
                text = markdown_path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as err:
                return found + [Outcome("bad output", f"Markdown file is not UTF-8: {err}", "check")]
            raw = RAW_CONTROL.search(text)
            if raw:
                found.append(
                    Outcome(
                        "raw control chars",
                        f"{raw.group()!r} in the Markdown file: {text[max(0, raw.start() - 60) : raw.start() + 20]!r}",
                        "check",
                    )
                )
        return found

    @staticmethod
    def _inputs_intact(case: Case, run_dir: Path) -> Outcome | None:
        for name, content in case.files.items():
            path = run_dir / name
            if content is None:
                if not path.is_dir():
                    return Outcome("input modified", f"{name}: the folder is gone", "analyze")
            elif not path.is_file() or path.read_bytes() != content:
                return Outcome("input modified", f"{name} was changed or removed", "analyze")
        extra = sorted(set(os.listdir(run_dir)) - set(case.files))
        if extra:
            return Outcome("input modified", f"written into the run folder: {extra[:3]}", "analyze")
        return None

    def _compare(
        self, case: Case, run_dir: Path, doc_path: Path, base_answer: dict, base_warnings: set[str]
    ) -> Outcome | None:
        try:
            doc = _strict_json(doc_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            return Outcome("bad output", f"the -o JSON document does not parse: {_first(str(err))}", "analyze")
        mutated = answer(doc)
        if mutated == base_answer or case.expect == "any":
            return None
        where = _first_difference(base_answer, mutated)
        if case.expect == "same":
            return Outcome("changed answer", where, "analyze")
        if not warnings_of(doc, run_dir) - base_warnings:
            return Outcome("silent change", where, "analyze")
        return None

    def _base(self, base: str) -> tuple[dict, set[str]]:
        """The unmutated run's answer and warnings (computed once per oracle)."""
        if base not in self._answers:
            case = unmutated_case(base)
            run_dir = self.workdir / f"unmutated-{base}"
            shutil.rmtree(run_dir, ignore_errors=True)
            write_case(case, run_dir)
            doc_path = self.workdir / f"unmutated-{base}.json"
            run = self._in_process(
                [
                    "analyze",
                    str(run_dir),
                    "-o",
                    str(doc_path),
                    "--no-progress",
                    "--jobs",
                    "1",
                    "--cache-dir",
                    str(self.cache_dir),
                ]
            )
            if run.exit_code != 0:
                raise RuntimeError(f"the unmutated {base} run does not analyse: {run.stderr or run.exception}")
            doc = json.loads(doc_path.read_text())
            self._answers[base] = (answer(doc), warnings_of(doc, run_dir))
        return self._answers[base]


def tracekit_command() -> list[str]:
    """The tracekit executable beside this interpreter (a venv's), else the module through it."""
    script = Path(sys.executable).parent / "tracekit"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from tracekit.cli import run; run()"]


def _folder_stem(case: Case) -> str:
    """The start of a case's run folder name (unique in the work folder, and safe to print)."""
    return f"fuzzrun-{case.seed}-{case.index}"


def _first(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _first_difference(expected, got, path: str = "") -> str:
    """Where two answers first differ, as ``path: expected -> got``."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in list(expected) + [k for k in got if k not in expected]:
            if expected.get(key) != got.get(key):
                return _first_difference(expected.get(key), got.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (a, b) in enumerate(zip(expected, got)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected) and math.isnan(got):
        return f"{path}: NaN"
    shown = [json.dumps(v, default=str)[:80] for v in (expected, got)]
    return f"{path}: {shown[0]} -> {shown[1]}"
