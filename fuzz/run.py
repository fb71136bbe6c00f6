"""The long fuzz run: thousands of mutated real runs through the tracekit CLI, a summary
table by mutation category and outcome, and a JSON report of every failing case.

    python fuzz/run.py --cases 10000 --seed 1 --jobs 2 --out fuzz-report.json
    python fuzz/run.py --replay 1:4711            # one case again, its input kept in a folder
    python fuzz/run.py --replay 27:143324:kineto-events   # a case of tests/test_fuzz.py

Each case is made by fuzz/mutate.py from (seed, index) and judged by fuzz/oracle.py. Cases
run in ``--jobs`` worker processes; a worker that gives no answer well past the case's own
deadline is killed (the case counts as a hang) and replaced. Exit status 1 when any case
failed (a traceback, hang, modified input, multi-line or unnamed error, raw control
character, bad output file, changed answer or silent change), else 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import shlex
import sys
import tempfile
import time
from collections import Counter, defaultdict
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuzz.mutate import CATEGORIES, make_case, write_case  # noqa: E402
from fuzz.oracle import FAILURES, OUTCOMES, Oracle, Outcome  # noqa: E402

# Beyond the case's own deadline, how long a worker may stay silent before it is killed
# (a case runs up to two commands, and a subprocess gets twice the deadline).
WATCHDOG_SLACK_S = 30.0


def _worker(conn, workdir: str, seed: int, timeout_s: float, subprocess_every: int) -> None:
    oracle = Oracle(Path(workdir), timeout_s=timeout_s, subprocess_every=subprocess_every)
    while True:
        index = conn.recv()
        if index is None:
            return
        case = make_case(seed, index)
        outcome = oracle.run(case)
        conn.send(
            {
                "index": index,
                "category": case.category,
                "detail": case.detail,
                "outcome": outcome.outcome,
                "message": outcome.message,
                "command": outcome.command,
            }
        )


class _Pool:
    """Worker processes fed one case index at a time, with a watchdog per worker."""

    def __init__(self, jobs: int, workdir: Path, seed: int, timeout_s: float, subprocess_every: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._args = (seed, timeout_s, subprocess_every)
        self._workdir = workdir
        self._deadline_s = timeout_s * 4 + WATCHDOG_SLACK_S
        self._workers: dict = {}  # connection -> [process, case index or None, when it was sent]
        self._serial = 0
        for _ in range(jobs):
            self._start()

    def _start(self) -> None:
        self._serial += 1
        parent, child = self._context.Pipe()
        workdir = self._workdir / f"worker-{self._serial}"
        process = self._context.Process(target=_worker, args=(child, str(workdir), *self._args), daemon=True)
        process.start()
        child.close()
        self._workers[parent] = [process, None, 0.0]

    def run(self, indices, on_result) -> None:
        self._on_result = on_result
        pending = iter(indices)
        exhausted = False
        while True:
            for conn, state in self._workers.items():
                if state[1] is None and not exhausted:
                    index = next(pending, None)
                    if index is None:
                        exhausted = True
                        break
                    conn.send(index)
                    state[1], state[2] = index, time.monotonic()
            busy = [conn for conn, state in self._workers.items() if state[1] is not None]
            if not busy:
                return
            for conn in wait(busy, timeout=1.0):
                try:
                    result = conn.recv()
                except EOFError:  # the worker died (a crash in C code, the OOM killer)
                    self._replace(conn, "traceback", "the worker process died")
                    continue
                self._workers[conn][1] = None
                on_result(result)
            now = time.monotonic()
            for conn, state in list(self._workers.items()):
                if state[1] is not None and now - state[2] > self._deadline_s:
                    self._replace(conn, "hang", f"no answer after {self._deadline_s:g} s (worker killed)")

    def _replace(self, conn, outcome: str, message: str) -> None:
        process, index, _ = self._workers.pop(conn)
        process.kill()
        process.join()
        case = make_case(self._args[0], index)
        self._on_result(
            {
                "index": index,
                "category": case.category,
                "detail": case.detail,
                "outcome": outcome,
                "message": message,
                "command": "worker",
            }
        )
        self._start()

    def close(self) -> None:
        for conn, (process, _, _) in self._workers.items():
            conn.send(None)
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def summary_table(table: dict[str, Counter]) -> str:
    """Cases by category x outcome, failures last; a total row."""
    columns = ["cases", "ok", "error", *FAILURES]
    heads = ["category", *columns]
    rows = []
    total = Counter()
    for category in sorted(table):
        counts = table[category]
        total.update(counts)
        rows.append([category, sum(counts.values()), *(counts.get(c, 0) for c in columns[1:])])
    rows.append(["all", sum(total.values()), *(total.get(c, 0) for c in columns[1:])])
    widths = [max(len(str(r[i])) for r in [heads, *rows]) for i in range(len(heads))]
    lines = ["  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
        )
    return "\n".join(lines)


def distinct_failures(failures: list[dict]) -> list[dict]:
    """One entry per kind of failure: outcome and message with paths and numbers taken out."""
    groups: dict[tuple[str, str], dict] = {}
    for failure in failures:
        shape = re.sub(r"/\S+", "PATH", failure["message"])
        shape = re.sub(r"\d+(\.\d+)?", "N", shape)
        key = (failure["outcome"], shape)
        if key not in groups:
            groups[key] = {
                "outcome": failure["outcome"],
                "message": failure["message"],
                "replay": failure["replay"],
                "category": failure["category"],
                "detail": failure["detail"],
                "cases": 0,
            }
        groups[key]["cases"] += 1
    return sorted(groups.values(), key=lambda g: (OUTCOMES.index(g["outcome"]), -g["cases"]))


def fuzz(
    cases: int, seed: int, jobs: int, out: Path | None, timeout_s: float, subprocess_every: int, start: int
) -> int:
    table: dict[str, Counter] = defaultdict(Counter)
    failures: list[dict] = []
    started = time.monotonic()
    done = 0

    def on_result(result: dict) -> None:
        nonlocal done
        done += 1
        table[result["category"]][result["outcome"]] += 1
        if result["outcome"] in FAILURES:
            failures.append(dict(result, replay=f"{seed}:{result['index']}"))
        if done % 100 == 0 or done == cases:
            rate = done / (time.monotonic() - started)
            print(f"  {done}/{cases} cases  {rate:.2f} cases/s  {len(failures)} failing", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="tracekit-fuzz-") as workdir:
        pool = _Pool(jobs, Path(workdir), seed, timeout_s, subprocess_every)
        try:
            pool.run(range(start, start + cases), on_result)
        finally:
            pool.close()
    elapsed = time.monotonic() - started
    distinct = distinct_failures(failures)
    print(f"\n{cases} cases, seed {seed}, {jobs} job(s), {elapsed:.0f} s ({cases / elapsed:.2f} cases/s)\n")
    print(summary_table(table))
    if distinct:
        print(f"\n{len(distinct)} distinct failure(s) (replay with: python fuzz/run.py --replay SEED:INDEX):")
        for group in distinct:
            print(
                f"  [{group['outcome']}] x{group['cases']}  {group['replay']}  {group['category']}: "
                f"{group['detail'][:70]}\n      {group['message'][:240]}"
            )
    if out:
        report = {
            "seed": seed,
            "cases": cases,
            "start": start,
            "jobs": jobs,
            "elapsed_s": round(elapsed, 1),
            "cases_per_s": round(cases / elapsed, 3),
            "categories": list(CATEGORIES),
            "outcomes": list(OUTCOMES),
            "table": {c: dict(counts) for c, counts in sorted(table.items())},
            "distinct_failures": distinct,
            "failures": sorted(failures, key=lambda f: f["index"]),
        }
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {out}")
    return 1 if failures else 0


def replay(replay_id: str, into: Path | None, timeout_s: float) -> int:
    """Make one case again, write its run folder to ``into`` and judge it."""
    parts = replay_id.split(":")
    try:
        seed, index = int(parts[0]), int(parts[1])
        category = parts[2] if len(parts) == 3 else None
        if len(parts) > 3 or (category is not None and category not in CATEGORIES):
            raise ValueError(replay_id)
    except (ValueError, IndexError):
        raise SystemExit(f"--replay {replay_id!r}: give SEED:INDEX or SEED:INDEX:CATEGORY, e.g. 1:4711") from None
    case = make_case(seed, index, category)
    folder = into or Path(f"fuzz-replay-{seed}-{index}{case.folder_suffix}")
    if folder.exists():
        raise SystemExit(f"{folder} exists; give another folder with --into")
    write_case(case, folder)
    print(f"case {case.replay_id}: {case.category}: {case.detail} (expect: {case.expect})")
    print(f"  input: {folder}/  (files: {', '.join(sorted(ascii(n)[1:-1] for n in case.files))})")
    options = [o.replace("{run}", str(folder)).replace("{out}", str(folder.parent)) for o in case.options]
    cache = [] if "--cache-dir" in options else ["--no-cache"]
    print(f"  try:   {shlex.join(['tracekit', 'analyze', str(folder), *cache, *options])}")
    with tempfile.TemporaryDirectory(prefix="tracekit-fuzz-") as workdir:
        outcome: Outcome = Oracle(Path(workdir), timeout_s=timeout_s, subprocess_every=0).run(case)
    print(f"  outcome: {outcome.outcome} ({outcome.command}) {outcome.message}")
    return 1 if outcome.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=10_000, help="how many cases (default 10000)")
    parser.add_argument("--seed", type=int, default=1, help="the seed; a case is reproducible from seed and index")
    parser.add_argument("--start", type=int, default=0, help="the first case index (to split a run)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--out", type=Path, help="write the failing cases and the table here (JSON)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    parser.add_argument(
        "--subprocess-every",
        type=int,
        default=20,
        help="run every Nth case's analysis as a real tracekit process with -j 2 (0: never)",
    )
    parser.add_argument(
        "--replay",
        metavar="SEED:INDEX[:CATEGORY]",
        help="make and judge one case, keeping its input (the test names its cases with a category)",
    )
    parser.add_argument("--into", type=Path, help="with --replay: the folder to write the case's run to")
    args = parser.parse_args(argv)
    if args.replay:
        return replay(args.replay, args.into, args.timeout)
    if args.cases < 1 or args.jobs < 1:
        parser.error("--cases and --jobs take 1 or more")
    return fuzz(args.cases, args.seed, args.jobs, args.out, args.timeout, args.subprocess_every, args.start)


if __name__ == "__main__":
    sys.exit(main())
