"""The per-rank reduce (``rows="reduce"``) on one file, as a parser worker runs it.

    python benchmarks/reduce_rank.py /tmp/s256/rank5.json [--repeat 30] [--against /work/main]

Parses the file once (its working set, what a worker hands the reduce), then times
:func:`tracekit.loading.reduce_file` on it, best of ``--repeat``, beside the parse itself,
and says whether the reduce imported pandas. ``--against DIR``: the same, in a process that
imports tracekit from the checkout DIR (another version), printed side by side. Prints the
load average: on a shared machine figures are only comparable at a similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def measure(path: Path, repeat: int) -> dict:
    from tracekit.ingest.file_task import parse_file
    from tracekit.ingest.working_set import working_set
    from tracekit.loading import reduce_file

    def parse():
        return [(t, working_set(c)) for t, c in parse_file(path, 0, None, None)]

    parsed = parse()
    before = "pandas" in sys.modules
    reduce_ms = _best_ms(lambda: reduce_file(parsed, None), repeat)
    return {
        "rows": sum(len(c) for _, c in parsed),
        "parse_ms": _best_ms(parse, max(3, repeat // 3)),
        "reduce_ms": reduce_ms,
        "pandas": "pandas" in sys.modules and not before,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--against", type=Path, help="another tracekit checkout to measure beside this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # what --against reads
    args = parser.parse_args()
    path = args.path.resolve()
    here = measure(path, args.repeat)
    if args.json:
        print(json.dumps(here))
        return
    columns = {"this checkout": here}
    if args.against is not None:
        other = args.against.resolve()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(path), "--repeat", str(args.repeat), "--json"],
            capture_output=True,
            text=True,
            cwd=other,
            env={**os.environ, "PYTHONPATH": str(other)},
            check=True,
        )
        columns = {str(other): json.loads(done.stdout), **columns}
    print(f"{path}: {here['rows']} rows (working set)")
    print(f"{'':40}" + "".join(f"{name[-24:]:>26}" for name in columns))
    rows = [
        (f"parse + working set, ms (best of {max(3, args.repeat // 3)})", "parse_ms", "{:.2f}"),
        (f"reduce_file, ms (best of {args.repeat})", "reduce_ms", "{:.2f}"),
        ("the reduce imported pandas", "pandas", "{}"),
        ("load average (1 min)", "load", "{:.2f}"),
    ]
    for label, key, form in rows:
        print(f"{label:40}" + "".join(f"{form.format(c[key]):>26}" for c in columns.values()))


if __name__ == "__main__":
    main()
