"""generated_mixed_replicas: a GENERATED data-parallel run whose replicas are different real
captures of the same configuration (not a real capture, and never committed as one).

Replicated runs built by ``benchmarks/make_input.py`` repeat one capture, so their replicas
are identical and show no pattern across replicas. Here replica i is the real sample
``samples[i]`` (e.g. ``1f1b``, ``1f1b``, ``1f1b_slow_stage2``, ``1f1b``): its events are the
capture's own, its ranks renumbered ``i*p + r`` and its ``distributedInfo`` (rank, world
size, process groups) rewritten as make_input does. The captures were recorded at different
times, so each replica's steps are moved onto one common timeline: step k of every replica
begins (its last rank enters ``ProfilerStep#k``) at the same time, and the next step once the
slowest replica's step k is done (as data-parallel replicas line up at their gradient
all-reduce). Every event of a rank moves
with the step it falls in on that rank (its own ``ProfilerStep#k`` spans), so the time
between events within a step is the capture's own.
"""

from __future__ import annotations

import bisect
import gzip
import re
import sys
from pathlib import Path

import orjson

from conftest import ROOT, SAMPLES

sys.path.insert(0, str(ROOT / "benchmarks"))
import make_input  # noqa: E402

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _read(path: Path) -> dict:
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _step_starts(doc: dict) -> dict[int, float]:
    """ProfilerStep#k start (us) on this rank."""
    return {
        int(m.group(1)): float(e["ts"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and (m := _STEP.match(str(e.get("name", ""))))
    }


def generated_mixed_replicas(out_dir: Path, samples: list[str]) -> Path:
    """Write the run (``rank<R>.json``, one replica per sample) into ``out_dir``; return it."""
    replicas = []
    for sample in samples:
        paths = sorted((SAMPLES / sample).glob("rank*.json*"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
        replicas.append([_read(p) for p in paths])
    p = len(replicas[0])
    assert all(len(docs) == p for docs in replicas), "every sample must have the same number of ranks"
    starts = [[_step_starts(doc) for doc in docs] for docs in replicas]
    steps = sorted(set.intersection(*(set(s) for rep in starts for s in rep)))
    # replica r's step k begins when the last of its ranks enters ProfilerStep#k: with a flush,
    # after all of its step k-1 compute (a rank that enters earlier only waits for input)
    begin = [{k: max(s[k] for s in rep) for k in steps} for rep in starts]
    common = {steps[0]: begin[0][steps[0]]}
    for prev, k in zip(steps, steps[1:]):
        common[k] = common[prev] + max(b[k] - b[prev] for b in begin)
    out_dir.mkdir(parents=True, exist_ok=True)
    world = p * len(samples)
    for i, docs in enumerate(replicas):
        offset = {k: common[k] - begin[i][k] for k in steps}
        for local, doc in enumerate(docs):
            own = sorted((starts[i][local][k], k) for k in steps)
            times = [t for t, _ in own]
            events = []
            for e in doc["traceEvents"]:
                if isinstance(e.get("ts"), (int, float)):
                    at = max(bisect.bisect_right(times, float(e["ts"])) - 1, 0)
                    e = {**e, "ts": e["ts"] + offset[own[at][1]]}
                events.append(e)
            rank = i * p + local
            header = {k: v for k, v in doc.items() if k != "traceEvents"}
            info = dict(header.get("distributedInfo") or {})
            info.update(rank=rank, world_size=world)
            info["pg_config"] = [dict(pg, ranks=list(range(i * p, i * p + p))) for pg in info.get("pg_config") or []]
            header["distributedInfo"] = info
            header["traceName"] = f"rank{rank}.json"
            make_input.write_trace(out_dir / f"rank{rank}.json", header, make_input.trace_body(events))
    return out_dir
