"""The Kineto scanner's bytes/s on a plain GPU trace and on the same trace with ``with_stack``
frames, side by side (issue #29: the second at 80% of the first or more).

The input is GENERATED (no real GPU trace with ``with_stack`` is at hand): one rank of
``tests/gpu_tracegen.py``'s 4-rank 1F1B on NCCL, written without labels, and the same rank with
``tests/generated_python_frames.py``'s frames added as torch writes them: Megatron's
``forward_step`` / ``backward_step`` around each action (the frames tracekit keeps), module
frames around each op and calls that hold no op (the ones it drops), as many as make
``--frames-per-op`` Python frames per CPU op. The default, 4.2, is what a real capture held: a
torch.profiler ``with_stack`` run of Megatron-core 0.16.1 on CPU (``tracekit capture
--framework megatron --schedule Interleaved1F1B -v 2`` with ``with_stack=True``) wrote 32,364
``python_function`` events beside 7,641 CPU ops on rank 1. Both files are laid out as Kineto
writes them (a field per line: ``make_input.write_trace``).

Measured, per file, in turns: the scanner's pass (``ChromeTraceStream`` offering every run to the
native scanner, the row builder keeping its columns: ``parse_file.py``'s ``native`` part) and the
whole parse (``read_kineto``), best CPU time of ``--repeat`` runs; bytes/s = the file's JSON
bytes / the scanner's CPU time. ``--pair PLAIN WITH_STACK`` measures two given files instead
(e.g. a capture with and without ``with_stack``).

Run: ``python benchmarks/with_stack.py`` (or ``--pair a.json.gz b.json.gz``).
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import orjson  # noqa: E402

from make_input import trace_body, write_trace  # noqa: E402

# The real capture's ratio (see the module doc): 32,364 python_function events / 7,641 CPU ops.
REAL_FRAMES_PER_OP = 32_364 / 7_641


def build(out_dir: Path, frames_per_op: float, kernels: int, steps: int) -> tuple[Path, Path]:
    """The plain generated GPU rank and the same with frames, as ``.json`` in ``out_dir``."""
    from generated_python_frames import framed, gpu_actions
    from gpu_tracegen import Scenario, generate

    sc = Scenario("with_stack_bench", labelled=False, kernels_f=kernels, kernels_b=2 * kernels, steps=steps)
    folder, _ = generate(sc, out_dir / "source")
    doc = orjson.loads(gzip.decompress((folder / "rank1.json.gz").read_bytes()))
    actions, main = gpu_actions(sc, doc, 1)
    cpu_ops = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    without_leaves = _frames(framed(doc, actions, main, interleaved=False))
    forward_ops = sum(len(a.ops) for a in actions)
    leaves = max(0, math.ceil((frames_per_op * cpu_ops - without_leaves) / forward_ops))
    with_stack = framed(doc, actions, main, interleaved=False, leaves=leaves)
    plain_path, stack_path = out_dir / "generated_plain.json", out_dir / "generated_with_stack.json"
    for path, trace in ((plain_path, doc), (stack_path, with_stack)):
        write_trace(path, trace, trace_body(trace["traceEvents"]))
    return plain_path, stack_path


def _frames(doc: dict) -> int:
    return sum(1 for e in doc["traceEvents"] if e.get("cat") == "python_function")


def _counts(path: Path) -> dict:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    events = orjson.loads(data)["traceEvents"]
    cpu_ops = sum(1 for e in events if e.get("cat") == "cpu_op")
    frames = sum(1 for e in events if e.get("cat") == "python_function")
    return {"bytes": len(data), "events": len(events), "frames_per_op": frames / max(cpu_ops, 1)}


def _scanner_pass(path: Path) -> int:
    """The scanner's pass over ``path`` (as parse_file.py's ``native`` part); its rows."""
    from tracekit.ingest.kineto_document import read_json_document
    from tracekit.ingest.kineto_rows import _RowBuilder
    from tracekit.ingest.kineto_stream import ChromeTraceStream

    builder = _RowBuilder()
    for batch in ChromeTraceStream(path, whole_document=read_json_document, scanner=builder.native_scanner()):
        builder.add(batch)
    return builder.n_rows


def _whole_parse(path: Path) -> int:
    from tracekit.ingest.kineto import read_kineto

    return len(read_kineto(path, 0)[1])


def measure(paths: list[Path], repeat: int) -> dict[Path, dict]:
    """Each file's best scanner and whole-parse CPU ms, the files measured in turns."""
    from tracekit.ingest import kineto_native

    if not kineto_native.enabled():
        raise SystemExit("the native scanner is not built (or TRACEKIT_NATIVE=0): nothing to measure")
    out = {p: {**_counts(p), "scanner_ms": math.inf, "parse_ms": math.inf} for p in paths}
    for _ in range(repeat):
        for path in paths:
            for key, run in (("scanner_ms", _scanner_pass), ("parse_ms", _whole_parse)):
                start = time.process_time()
                out[path]["rows"] = run(path)
                out[path][key] = min(out[path][key], (time.process_time() - start) * 1000)
    before = dict(kineto_native.RUNS)
    for path in paths:
        _scanner_pass(path)
    declined = kineto_native.RUNS["declined"] - before.get("declined", 0)
    no_element = kineto_native.RUNS["declined: no whole element yet"] - before.get("declined: no whole element yet", 0)
    out[paths[0]]["refused"] = declined - no_element  # runs the Python path read instead (both files)
    return out


def report(figures: dict[Path, dict], names: tuple[str, str]) -> float:
    """Print the two files side by side; the ratio of their bytes/s."""
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'':12s} {'MB':>7s} {'events':>9s} {'frames/op':>9s} {'rows':>7s} {'scanner ms':>11s} {'MB/s':>7s} {'parse ms':>9s}"
    )
    rates = []
    for name, f in zip(names, figures.values()):
        rate = f["bytes"] / 1e6 / (f["scanner_ms"] / 1000)
        rates.append(rate)
        print(
            f"{name:12s} {f['bytes'] / 1e6:7.2f} {f['events']:9,d} {f['frames_per_op']:9.2f} {f['rows']:7,d} "
            f"{f['scanner_ms']:11.2f} {rate:7.0f} {f['parse_ms']:9.2f}"
        )
    ratio = rates[1] / rates[0]
    refused = next(iter(figures.values()))["refused"]
    print(f"with_stack bytes/s = {ratio:.0%} of plain (goal >= 80%); runs the scanner refused: {refused}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=2, type=Path, metavar=("PLAIN", "WITH_STACK"), help="measure these files")
    parser.add_argument("--frames-per-op", type=float, default=REAL_FRAMES_PER_OP)
    parser.add_argument("--kernels", type=int, default=16, help="kernels a forward (twice that a backward)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=15, help="runs of each file (best kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tk-with-stack-") as tmp:
        if args.pair:
            paths = list(args.pair)
            print(f"{paths[0]} beside {paths[1]}; best of {args.repeat}, CPU time")
        else:
            paths = list(build(Path(tmp), args.frames_per_op, args.kernels, args.steps))
            print(
                f"GENERATED: gpu_tracegen 1F1B rank 1 (k={args.kernels}, {args.steps} steps) plain and with "
                f"generated with_stack frames; best of {args.repeat}, CPU time"
            )
        report(measure(paths, args.repeat), ("plain", "with_stack"))


if __name__ == "__main__":
    main()
