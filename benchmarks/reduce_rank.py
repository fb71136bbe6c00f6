"""The per-rank reduce (``rows="reduce"``) on one file, as a parser worker runs it.

    python benchmarks/reduce_rank.py /tmp/s256/rank5.json [--repeat 30]
    (cd OTHER_CHECKOUT && PYTHONPATH=$PWD python /path/to/benchmarks/reduce_rank.py FILE)  # another version's

Parses the file once (its working set, what a worker hands the reduce), then times
:func:`tracekit.loading.reduce_file` on it, best of ``--repeat``, beside the parse itself,
and says whether the reduce imported pandas. Prints the load average: on a shared machine
the figures are only comparable at a similar load.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    from tracekit.ingest import _parse_file
    from tracekit.ingest.working_set import working_set
    from tracekit.loading import reduce_file

    def parse():
        return [(t, working_set(c)) for t, c in _parse_file(args.path, 0, None, None)]

    parsed = parse()
    parse_ms = _best_ms(parse, max(3, args.repeat // 3))
    before = "pandas" in sys.modules
    reduce_ms = _best_ms(lambda: reduce_file(parsed, None), args.repeat)
    rows = sum(len(c) for _, c in parsed)
    print(f"{args.path}: {rows} rows (working set); load average {os.getloadavg()[0]:.2f}")
    print(f"  parse + working set  {parse_ms:7.2f} ms (best of {max(3, args.repeat // 3)})")
    print(f"  reduce_file          {reduce_ms:7.2f} ms (best of {args.repeat})")
    print(f"  pandas imported by the reduce: {'pandas' in sys.modules and not before}")


if __name__ == "__main__":
    main()
