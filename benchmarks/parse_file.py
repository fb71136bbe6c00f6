"""The Kineto parser's CPU per file, by part, beside plain decoding of the same bytes.

For one trace file, best of ``--repeat`` runs of each part (CPU ms from ``process_time``;
wall ms beside it), in one process:

- ``orjson``      ``orjson.loads`` of the whole (decompressed) document: a plain decode, no rows
- ``msgspec``     ``msgspec.json.decode`` of the same bytes into plain objects
- ``stream``      ``ChromeTraceStream``: read, cut into runs, typed decode into structs
- ``rows``        ``_RowBuilder.add`` over those batches (typed arrays per batch)
- ``native``      what ``stream`` and ``rows`` do, by the native scanner (tracekit/ingest/
                  kineto_native.py): the stream offers each run to it, the builder keeps its
                  columns (runs it declines take the two parts above)
- ``columns``     ``_RowBuilder.columns``: absolute times, P2P fields, validation, depth
- ``nesting``     ``nesting_depth`` alone, on the file's rows (part of ``columns``)
- ``read_kineto`` the whole parse of the file, as a parser worker runs it, without the scanner
                  (``TRACEKIT_NATIVE=0``)
- ``read_native`` the same with the scanner (where it is built: else no figure)

Beneath them, ``stream`` + ``rows`` beside ``native``, and ``read_kineto`` beside ``read_native``.

With ``--before COMMIT`` the tracekit of that commit (``git archive`` into a temporary
folder) is measured the same way in a subprocess, in turns with this tree's so both see the
same load, and the figures are printed side by side. The machine's load average is printed
with them: on shared cores, compare figures taken together, never across runs.

Run: ``python benchmarks/parse_file.py /tmp/s256/rank5.json --before 1b5124f``
(or without ``--before``: this tree alone, its Python and native paths side by side)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("orjson", "msgspec", "stream", "rows", "native", "columns", "nesting", "read_kineto", "read_native")


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best CPU ms and best wall ms of ``repeat`` calls."""
    cpu = wall = float("inf")
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return cpu * 1000, wall * 1000


def measure(path: Path, repeat: int) -> dict:
    """Each part's best (CPU ms, wall ms) on ``path``, with the tracekit on ``sys.path``."""
    import msgspec
    import numpy as np
    import orjson

    from tracekit.ingest.kineto import read_kineto
    from tracekit.ingest.kineto_document import read_json_document
    from tracekit.ingest.kineto_rows import ASYNC_SPANS, _RowBuilder
    from tracekit.ingest.kineto_stream import ChromeTraceStream
    from tracekit.ingest.nesting import nesting_depth

    try:
        from tracekit.ingest import kineto_native
    except ImportError:  # a tree from before the scanner (--before)
        kineto_native = None
    native = kineto_native is not None and kineto_native.available()

    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    batches = list(ChromeTraceStream(path, whole_document=read_json_document))

    def rows() -> _RowBuilder:
        builder = _RowBuilder()
        for batch in batches:
            builder.add(batch)
        return builder

    def scanned() -> _RowBuilder:
        builder = _RowBuilder()
        for batch in ChromeTraceStream(path, whole_document=read_json_document, scanner=builder.native_scanner()):
            builder.add(batch)
        return builder

    def parse(scanner: str) -> Callable[[], object]:
        def run() -> object:
            os.environ["TRACEKIT_NATIVE"] = scanner
            try:
                return read_kineto(path, 0)
            finally:
                del os.environ["TRACEKIT_NATIVE"]

        return run

    built = [rows() for _ in range(repeat)]
    _, columns = parse("0")()
    n = columns.numbers
    names = np.array(columns.values["name"], dtype=object)[columns.codes["name"]]
    depth_args = (n["pid"], n["tid"], n["start_ns"], n["end_ns"], np.isin(names, list(ASYNC_SPANS)))
    out = {
        "orjson": _best(lambda: orjson.loads(data), repeat),
        "msgspec": _best(lambda: msgspec.json.decode(data), repeat),
        "stream": _best(lambda: list(ChromeTraceStream(path, whole_document=read_json_document)), repeat),
        "rows": _best(rows, repeat),
        # each run needs a fresh builder: columns() consumes its parts
        "columns": _best(lambda: built.pop().columns(0, {}, 0, 0), repeat),
        "nesting": _best(lambda: nesting_depth(*depth_args), repeat),
        "read_kineto": _best(parse("0"), repeat),
    }
    out["info"] = {"bytes": len(data), "elements": sum(map(len, batches)), "rows": len(columns)}
    if native:
        out["native"] = _best(scanned, repeat)
        out["read_native"] = _best(parse("1"), repeat)
        before = dict(kineto_native.RUNS)
        scanned()
        out["info"]["runs"] = {k: v - before.get(k, 0) for k, v in kineto_native.RUNS.items() if v != before.get(k, 0)}
    return out


def _archive(commit: str, into: Path) -> None:
    """The ``tracekit`` package of ``commit`` under ``into``."""
    blob = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "tracekit"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")


def _measure_in(tree: Path, path: Path, repeat: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), str(path), "--repeat", str(repeat), "--json"]
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def _merge(best: dict | None, new: dict) -> dict:
    if best is None:
        return new
    for part in PARTS:
        if part in best and part in new:
            best[part] = [min(a, b) for a, b in zip(best[part], new[part])]
    return best


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--repeat", type=int, default=10, help="runs of each part per turn (best kept)")
    parser.add_argument("--turns", type=int, default=3, help="turns of before and after, in alternation")
    parser.add_argument("--before", metavar="COMMIT", help="also measure the tracekit of this commit")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (one turn)")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.path, args.repeat)))
        return
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="tk-parse-") as tmp:
        if args.before:
            _archive(args.before, Path(tmp))
        before = after = None
        for _ in range(args.turns):
            if args.before:
                before = _merge(before, _measure_in(Path(tmp), args.path, args.repeat))
            after = _merge(after, _measure_in(ROOT, args.path, args.repeat))
    assert after is not None
    info = after["info"]
    print(
        f"{args.path}: {info['bytes'] / 1e6:.2f} MB, {info['elements']:,} events, {info['rows']:,} rows; "
        f"best of {args.turns} x {args.repeat}; load average {load_before} -> {_load()}"
    )
    head = f"{'part':12s} {'CPU ms':>9s} {'wall ms':>9s}"
    if before:
        head = f"{'part':12s} {'before CPU':>11s} {'after CPU':>10s} {'x':>6s} {'before wall':>12s} {'after wall':>11s}"
    print(head)
    for part in PARTS:
        if part not in after:
            print(f"{part:12s} {'(no native scanner)':>20s}")
            continue
        cpu, wall = after[part]
        if before:
            if part not in before:
                print(f"{part:12s} {'-':>11s} {cpu:10.2f} {'':>6s} {'-':>12s} {wall:11.2f}")
                continue
            b_cpu, b_wall = before[part]
            print(f"{part:12s} {b_cpu:11.2f} {cpu:10.2f} {b_cpu / cpu:6.2f} {b_wall:12.2f} {wall:11.2f}")
        else:
            print(f"{part:12s} {cpu:9.2f} {wall:9.2f}")
    if "native" in after:
        python_cpu = after["stream"][0] + after["rows"][0]
        print(
            f"decode + rows, CPU ms: Python {python_cpu:.2f} (stream + rows), native {after['native'][0]:.2f} "
            f"(x{python_cpu / after['native'][0]:.2f}); whole parse: {after['read_kineto'][0]:.2f} -> "
            f"{after['read_native'][0]:.2f} (x{after['read_kineto'][0] / after['read_native'][0]:.2f}); "
            f"runs: {info.get('runs')}"
        )


if __name__ == "__main__":
    main()
