"""Build large multi-rank Kineto inputs from real traces, for the benchmarks.

Two kinds of run, both made of real profiler events, never synthetic ones:

- ``pp``: a captured pipeline run (``sample_traces/<name>``, 4 ranks) with its steps repeated
  ``copies`` times back to back (each copy shifted in time by the run's span, its
  ``ProfilerStep#N``, sequence numbers, external ids and flow ids renumbered), and its ranks
  repeated as data-parallel replicas (ranks 4-7 are a second pipeline, ...), with
  ``distributedInfo`` rewritten so each replica's default group maps P2P peers right.
- ``gpu``: one real GPU trace (``shared/real-traces/kineto-gpu``) cut to a size and written
  once per rank with its rank rewritten (a data-parallel job whose ranks did the same work).

And one kind that is NOT real, for the one path no real trace here exercises at scale:

- ``generated-gpu-pp``: a GENERATED GPU pipeline (``tests/gpu_tracegen.py`` simulates a 4-rank
  1F1B job on NCCL; nothing was captured on a GPU) with its ranks repeated as data-parallel
  replicas, in a folder named ``generated_*``: the device pipeline path (kernels, launches,
  SendRecv kernels, labelled actions) at thousands of ranks.

Files are plain ``.json`` (or ``.json.gz``) laid out as Kineto writes them, with ``baseTimeNanoseconds``
written after ``traceEvents`` as newer Kineto does. Run as a script to build one folder::

    python benchmarks/make_input.py pp /tmp/tk-bench/pp8 --ranks 8 --copies 16
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GPU_TRACE = ROOT.parent / "shared" / "real-traces" / "kineto-gpu" / "hta_df_index_resolver_df_index_resolver.json.gz"

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# Header keys Kineto writes after traceEvents (newer versions): the parser must find them there.
_TRAILER_KEYS = ("baseTimeNanoseconds", "traceName")


def _read(path: Path) -> dict:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return orjson.loads(data)


def _kineto_layout(event: dict) -> bytes:
    """One event laid out as torch 2.13's Kineto writes it: a field per line (~350 B/event)."""
    fields = b",\n    ".join(orjson.dumps(k) + b": " + orjson.dumps(v) for k, v in event.items())
    return b"  {\n    " + fields + b"\n  }"


def trace_body(events) -> bytes:
    """The text of a ``traceEvents`` array's elements."""
    return b",\n".join(_kineto_layout(e) for e in events)


def write_trace(path: Path, doc: dict, body: bytes) -> int:
    """Write a Chrome-trace document in Kineto's layout around ``body`` (see
    :func:`trace_body`); return its size in bytes."""
    header = {k: v for k, v in doc.items() if k != "traceEvents" and k not in _TRAILER_KEYS}
    trailer = {k: doc[k] for k in _TRAILER_KEYS if k in doc}
    # json (not orjson) for the header: HTA finds ranks with the regex '"rank":\s+(\d+)'.
    head = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
    head += '  "traceEvents": [\n'
    tail = "\n  ]" + "".join(f",\n  {json.dumps(k)}: {json.dumps(v)}" for k, v in trailer.items()) + "\n}\n"
    data = head.encode() + body + tail.encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data, compresslevel=6))
    else:
        path.write_bytes(data)
    return len(data)


def _span_us(docs: list[dict]) -> float:
    lo, hi = float("inf"), float("-inf")
    for doc in docs:
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)):
                lo = min(lo, e["ts"])
                hi = max(hi, e["ts"] + e.get("dur", 0))
    return hi - lo


def _repeat_steps(events: list[dict], copies: int, period_us: float) -> list[dict]:
    steps = sorted({int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))})
    n_steps = max(1, len(steps))
    max_seq = (
        max(
            (
                e.get("args", {}).get("Sequence number", 0)
                for e in events
                if isinstance(e.get("args", {}).get("Sequence number"), int)
            ),
            default=0,
        )
        + 1
    )
    max_ext = (
        max(
            (
                e.get("args", {}).get("External id", 0)
                for e in events
                if isinstance(e.get("args", {}).get("External id"), int)
            ),
            default=0,
        )
        + 1
    )
    max_flow = max((e["id"] for e in events if isinstance(e.get("id"), int)), default=0) + 1
    out = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    for copy in range(copies):
        for e in body:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + copy * period_us
            if copy:
                if isinstance(e.get("id"), int):
                    e["id"] += copy * max_flow
                match = _STEP.match(str(e.get("name", "")))
                if match:
                    e["name"] = f"ProfilerStep#{int(match.group(1)) + copy * n_steps}"
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    if isinstance(args.get("Sequence number"), int):
                        args["Sequence number"] += copy * max_seq
                    if isinstance(args.get("External id"), int):
                        args["External id"] += copy * max_ext
                    e["args"] = args
            out.append(e)
    return out


def build_pp(out_dir: Path, ranks: int = 8, copies: int = 11, sample: str = "1f1b", gz: bool = False) -> list[Path]:
    """A pipeline run: ``sample``'s steps repeated ``copies`` times, ranks as DP replicas."""
    src = sorted((SAMPLES / sample).glob("rank*.json*"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
    docs = [_read(p) for p in src]
    p = len(docs)
    if not p or ranks % p:
        raise SystemExit(f"ranks ({ranks}) must be a multiple of the {p} ranks of sample_traces/{sample}")
    period = _span_us(docs) + 1000.0
    bodies = [trace_body(_repeat_steps(doc["traceEvents"], copies, period)) for doc in docs]
    return _write_replicas(out_dir, docs, bodies, ranks, gz)


def _write_replicas(out_dir: Path, docs: list[dict], bodies: list[bytes], ranks: int, gz: bool = False) -> list[Path]:
    """The pipeline of ``docs`` (headers) and ``bodies`` (their events' text), one per rank,
    written as ``ranks // len(docs)`` data-parallel replicas: ``distributedInfo`` rewritten so
    each replica's default group maps P2P peers onto its own ranks."""
    p = len(docs)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(ranks):
        doc = {k: v for k, v in docs[rank % p].items() if k != "traceEvents"}
        base = rank - rank % p
        info = dict(doc.get("distributedInfo") or {})
        info.update(rank=rank, world_size=ranks)
        info["pg_config"] = [dict(pg, ranks=list(range(base, base + p))) for pg in info.get("pg_config") or []]
        doc["distributedInfo"] = info
        doc["traceName"] = f"rank{rank}.json"
        path = out_dir / f"rank{rank}.json{'.gz' if gz else ''}"
        write_trace(path, doc, bodies[rank % p])
        written.append(path)
    return written


def build_gpu(
    out_dir: Path,
    ranks: int = 8,
    target_mb: float = 26.0,
    source: Path = GPU_TRACE,
    gz: bool = False,
    window: bool = False,
) -> list[Path]:
    """A data-parallel GPU run: one real GPU trace cut (or repeated in time) to ``target_mb``
    of JSON, once per rank.

    The cut takes the file's events in file order: the real V100 trace lists its CPU ops
    before its kernels (the first kernel is 21 MB in), so a cut under ~21 MB holds no device
    work at all (a host run). ``window``: take the events in time order instead, so a cut of
    any size is a window of the run with its host ops, launches and kernels (each kernel's
    launch comes before it)."""
    doc = _read(source)
    events = doc["traceEvents"]
    if window:
        events = sorted(events, key=lambda e: float(e.get("ts", 0.0)))
    budget = int(target_mb * 1e6)
    parts, size, copies = [], 0, 1
    while size < budget:
        if copies > 1:
            events = _repeat_steps(doc["traceEvents"], copies, _span_us([doc]) + 1000.0)[len(parts) :]
        for e in events:
            text = _kineto_layout(e)
            size += len(text) + 2
            if size > budget:
                break
            parts.append(text)
        copies += 1
    body = b",\n".join(parts)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(ranks):
        rdoc = {k: v for k, v in doc.items() if k != "traceEvents"}
        info = dict(rdoc.get("distributedInfo") or {})
        info.update(rank=rank, world_size=ranks)
        rdoc["distributedInfo"] = info
        rdoc["traceName"] = f"rank{rank}.json"
        path = out_dir / f"rank{rank}.json{'.gz' if gz else ''}"
        write_trace(path, rdoc, body)
        written.append(path)
    return written


def build_generated_gpu_pipeline(out_dir: Path, ranks: int = 8, kernels: int = 10, steps: int = 3) -> list[Path]:
    """GENERATED, not real: a 4-rank 1F1B GPU pipeline (m=8) simulated by
    ``tests/gpu_tracegen.py`` with ``kernels`` kernels a forward and twice that a backward,
    ``steps`` steps, its ranks repeated as data-parallel replicas (``distributedInfo`` rewritten
    so each replica's group maps P2P peers onto its own ranks). ``out_dir`` should be named
    ``generated_*``."""
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from gpu_tracegen import Scenario, generate

    scenario = Scenario(f"scale_k{kernels}", kernels_f=kernels, kernels_b=2 * kernels, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        folder, _ = generate(scenario, tmp)
        docs = [_read(folder / f"rank{r}.json.gz") for r in range(scenario.p)]
    p = len(docs)
    if ranks % p:
        raise SystemExit(f"ranks ({ranks}) must be a multiple of the generated pipeline's {p} ranks")
    return _write_replicas(out_dir, docs, [trace_body(doc["traceEvents"]) for doc in docs], ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["pp", "gpu", "generated-gpu-pp"])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--copies", type=int, default=11, help="pp: step repeats per rank")
    parser.add_argument("--mb", type=float, default=26.0, help="gpu: MB of JSON per rank")
    parser.add_argument("--sample", default="1f1b", help="pp: which sample run")
    parser.add_argument("--gz", action="store_true", help="write .json.gz")
    parser.add_argument("--window", action="store_true", help="gpu: cut a time window (kernels at any size)")
    args = parser.parse_args()
    if args.kind == "pp":
        paths = build_pp(args.out_dir, args.ranks, args.copies, args.sample, args.gz)
    elif args.kind == "gpu":
        paths = build_gpu(args.out_dir, args.ranks, args.mb, gz=args.gz, window=args.window)
    else:
        paths = build_generated_gpu_pipeline(args.out_dir, args.ranks)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1e6:.1f} MB, to {args.out_dir}")


if __name__ == "__main__":
    main()
