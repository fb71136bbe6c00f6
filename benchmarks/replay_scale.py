"""How long attribution and blame take on a big pipeline step: a generated graph.

The graph is Interleaved1F1B's ideal order (``tracekit.analyze.schedules``) for p ranks, v
chunks and m microbatches, with durations and latencies that make every cause count: the
forward and backward of each stage jittered around 1 and 2 ms (a fixed seed), stage 5
20% slower, one latency per message and a slow link (rank 3 -> 4), and an overhead before
every action. Generated, not measured: it has the size and shape of a real step, not a
real run's numbers. It times building the graph's measured form, one replay, and the whole
attribution of the step (8 replays for the Shapley values, up to 32 stage blame replays,
and for up to 32 links each freed, each alone, and each pipeline's links all free), best of
``--repeat``.

    python benchmarks/replay_scale.py                 # p=32 v=2 m=128: 16,384 actions
    python benchmarks/replay_scale.py --p 8 --v 2 --m 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tracekit.analyze.attribution import attribute_step
from tracekit.analyze.replay import StepGraph, idle_per_rank, replay
from tracekit.analyze.schedules import graph_from_orders, interleaved_1f1b


def generated_graph(p: int, v: int, m: int, seed: int = 0) -> StepGraph:
    """Interleaved1F1B's order with uneven durations, latencies and overheads (see the module doc)."""
    graph = graph_from_orders(interleaved_1f1b(p, v, m), {"F": 1_000_000, "B": 2_000_000}, latency_ns=50_000)
    rng = np.random.default_rng(seed)
    jitter = rng.integers(-50_000, 50_000, len(graph.dur))
    slow = np.where(graph.stage == 5, 1.2, 1.0)
    graph.dur = (graph.dur * slow).astype(np.int64) + jitter
    graph.ovh = rng.integers(0, 20_000, len(graph.dur)).astype(np.int64)
    links = graph.edge_links()
    graph.edge_lat = np.array([400_000 if link == (3, 4) else 50_000 for link in links], dtype=np.int64)
    graph.edge_lat = graph.edge_lat + rng.integers(0, 10_000, len(links))
    return graph


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=32)
    parser.add_argument("--v", type=int, default=2)
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    t_build, graph = best(lambda: generated_graph(args.p, args.v, args.m), 1)
    assert isinstance(graph, StepGraph)
    n, e = len(graph.action_id), len(graph.edge_src)
    t_replay, result = best(lambda: replay(graph), args.repeat)
    measured_idle = idle_per_rank(graph, result)
    makespan = result.makespan(graph.t0)
    t_attr, attributed = best(lambda: attribute_step(graph, measured_idle, makespan), args.repeat)
    print(f"Interleaved1F1B p={args.p} v={args.v} m={args.m}: {n} actions, {e} message edges (generated)")
    print(f"  build graph      {t_build:8.3f} s")
    print(f"  one replay       {t_replay:8.3f} s")
    print(f"  attribute step   {t_attr:8.3f} s  (Shapley + stage and link blame; best of {args.repeat})")
    table = attributed.table
    print(f"  idle attributed  {int(table['idle_ns'].sum()) / 1e6:.1f} ms over {len(table)} ranks")


if __name__ == "__main__":
    main()
