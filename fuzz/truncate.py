"""A run's trace cut at every event boundary: each cut must make an incomplete run.

    python fuzz/truncate.py                         # sample_traces/1f1b, every boundary of every rank
    python fuzz/truncate.py --run sample_traces/gpipe --cli-every 25

For each rank file of the run (a real capture), the JSON text is cut right after each
``traceEvents`` element (and right before the first: nothing salvageable), as a profiler
stopped mid-write leaves it. Two checks:

- parse, at every boundary: the file reads as ``truncated`` with exactly the events before
  the cut, or (no complete event) fails in one line (``TraceFormatError``);
- command, at every ``--cli-every``-th boundary of each rank (and its first and last): the
  run with that rank cut is announced first as ``INCOMPLETE RUN: rank R's trace is cut
  short``, and ``tracekit check`` refuses it (exit 2, one line).

Prints the counts per rank and every failure; exit status 1 when any case failed.
``event_boundaries`` is also used by ``tests/test_fuzz.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def event_boundaries(text: bytes) -> list[int]:
    """Byte offsets in a Chrome-trace JSON text: just before the first ``traceEvents``
    element, then just after each element (a cut there leaves whole elements only)."""
    key = text.find(b'"traceEvents"')
    if key < 0:
        raise ValueError("no traceEvents array")
    i = text.index(b"[", key) + 1
    out = [i]
    depth, in_string, escaped = 0, False, False
    n = len(text)
    while i < n:
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):  # { [
            depth += 1
        elif c in (0x7D, 0x5D):  # } ]
            if depth == 0:  # the array's own "]"
                break
            depth -= 1
            if depth == 0:
                out.append(i + 1)
        i += 1
    return out


def parse_checks(path_text: bytes, name: str, workdir: Path) -> tuple[int, list[str]]:
    """Every boundary of one file through the parser; (cases, failures)."""
    from tracekit.errors import TraceFormatError
    from tracekit.ingest.kineto import read_kineto

    failures = []
    cuts = event_boundaries(path_text)
    path = workdir / name
    for k, cut in enumerate(cuts):
        path.write_bytes(path_text[:cut])
        try:
            trace, _ = read_kineto(path, 0)
        except TraceFormatError as err:
            if k:  # only a cut before the first element leaves nothing to read
                failures.append(f"{name} cut after {k} events: refused: {err}")
            continue
        if not trace.truncated or trace.n_events_raw != k:
            failures.append(f"{name} cut after {k} events: truncated={trace.truncated}, read {trace.n_events_raw}")
    return len(cuts), failures


def command_checks(run: Path, name: str, text: bytes, every: int, workdir: Path) -> tuple[int, list[str]]:
    """Every ``every``-th boundary of one rank, its run through analyze and check."""
    import shutil

    from click.testing import CliRunner

    from tracekit.cli import main

    cuts = event_boundaries(text)
    chosen = sorted(set(cuts[1::every]) | {cuts[1], cuts[-1]}) if len(cuts) > 1 else []
    folder = workdir / "run"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(run, folder)
    (folder / name).unlink()
    plain = name.removesuffix(".gz")
    rank = int("".join(ch for ch in plain.split(".")[0] if ch.isdigit()))
    failures = []
    runner = CliRunner()
    for cut in chosen:
        (folder / plain).write_bytes(text[:cut])
        analyzed = runner.invoke(main, ["analyze", str(folder), "--json", "--no-cache", "--no-progress"])
        if analyzed.exit_code != 0:
            failures.append(f"{name} cut at byte {cut}: analyze exit {analyzed.exit_code}: {analyzed.output[-200:]}")
            continue
        doc = json.loads(analyzed.stdout)
        first = doc["warnings"][0] if doc["warnings"] else ""
        if not first.startswith(f"INCOMPLETE RUN: rank {rank}'s trace is cut short"):
            failures.append(f"{name} cut at byte {cut}: first warning {first[:120]!r}")
        checked = runner.invoke(main, ["check", str(folder), "--max-bubble", "1", "--no-config", "--no-cache"])
        lines = [line for line in checked.output.splitlines() if line.strip()]
        if checked.exit_code != 2 or len(lines) != 1 or "incomplete run" not in lines[0]:
            failures.append(f"{name} cut at byte {cut}: check exit {checked.exit_code}: {checked.output[-200:]}")
    return len(chosen), failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", type=Path, default=ROOT / "sample_traces" / "1f1b", help="a run folder of .json.gz ranks"
    )
    parser.add_argument("--cli-every", type=int, default=50, help="run the commands at every N-th boundary")
    args = parser.parse_args(argv)
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tracekit-truncate-") as tmp:
        workdir = Path(tmp)
        for path in sorted(args.run.glob("rank*.json.gz")):
            text = gzip.decompress(path.read_bytes())
            started = time.monotonic()
            n_parse, parse_failures = parse_checks(text, path.name.removesuffix(".gz"), workdir)
            n_cli, cli_failures = command_checks(args.run, path.name, text, args.cli_every, workdir)
            failed += parse_failures + cli_failures
            print(
                f"{path.name}: {n_parse} cuts parsed ({len(parse_failures)} failed), {n_cli} runs through "
                f"analyze and check ({len(cli_failures)} failed), {time.monotonic() - started:.0f} s",
                flush=True,
            )
    for line in failed:
        print(f"FAILED {line}")
    print(f"{len(failed)} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
