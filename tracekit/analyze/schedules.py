"""Ideal schedules as per-rank action orders, and graphs built from them for replay.

Used to check the closed-form bubbles against dependency-driven replays, and as the
starting point of what-if questions (another schedule, m, v): generate the order, give
it durations and latencies, replay.
"""

from __future__ import annotations

import numpy as np

from tracekit.analyze.replay import StepGraph, dependency_pairs, reorder, topological_order

Action = tuple[str, int, int]  # (kind, stage, microbatch)


def gpipe(p: int, m: int) -> dict[int, list[Action]]:
    """All forwards, then all backwards (torch's ScheduleGPipe order)."""
    return {r: [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)] for r in range(p)}


def one_f_one_b(p: int, m: int) -> dict[int, list[Action]]:
    """PipeDream-Flush: p-r-1 warm-up forwards, then one forward one backward, then drain."""
    orders = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        order: list[Action] = [("F", r, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            order.append(("F", r, f))
            order.append(("B", r, b))
            f, b = f + 1, b + 1
        order.extend(("B", r, i) for i in range(b, m))
        orders[r] = order
    return orders


def interleaved_1f1b(p: int, v: int, m: int) -> dict[int, list[Action]]:
    """Megatron's interleaved 1F1B; stage c*p + r on rank r (loop placement); m % p == 0."""
    if m % p:
        raise ValueError("interleaved 1F1B needs m to be a multiple of p")
    total = m * v

    def forward_of(r: int, k: int) -> Action:
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return ("F", chunk * p + r, mb)

    def backward_of(r: int, k: int) -> Action:
        chunk = v - 1 - (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return ("B", chunk * p + r, mb)

    orders = {}
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        order = [forward_of(r, k) for k in range(warmup)]
        f, b = warmup, 0
        while f < total:
            order.append(forward_of(r, f))
            order.append(backward_of(r, b))
            f, b = f + 1, b + 1
        order.extend(backward_of(r, k) for k in range(b, total))
        orders[r] = order
    return orders


GENERATORS = {
    "GPipe": lambda p, v, m: gpipe(p, m),
    "1F1B": lambda p, v, m: one_f_one_b(p, m),
    "Interleaved1F1B": interleaved_1f1b,
}


def graph_from_orders(
    orders: dict[int, list[Action]], durations: dict[str, int], latency_ns: int = 0, overhead_ns: int = 0
) -> StepGraph:
    """A replayable graph of an ideal schedule: per-kind durations, one latency for every
    cross-rank message, one overhead before every action."""
    kind, stage, mb, rank, prev = [], [], [], [], []
    for r in sorted(orders):
        last = -1
        for k, s, i in orders[r]:
            kind.append(k)
            stage.append(s)
            mb.append(i)
            rank.append(r)
            prev.append(last)
            last = len(kind) - 1
    rank_a, stage_a, mb_a = np.array(rank), np.array(stage), np.array(mb)
    kind_a = np.array(kind, dtype=object)
    pairs = dependency_pairs(rank_a, stage_a, kind_a, mb_a)
    fields = {
        "action_id": np.arange(len(kind)),
        "rank": rank_a,
        "stage": stage_a,
        "kind": kind_a,
        "microbatch": mb_a,
        "prev": np.array(prev, dtype=np.int64),
        "dur": np.array([durations[k] for k in kind], dtype=np.int64),
        "ovh": np.full(len(kind), overhead_ns, dtype=np.int64),
        "edge_src": np.array([s for s, _ in pairs], dtype=np.int64),
        "edge_dst": np.array([d for _, d in pairs], dtype=np.int64),
    }
    order = topological_order(
        len(kind), fields["prev"], fields["edge_src"], fields["edge_dst"], tie_break=np.arange(len(kind))
    )
    fields = reorder(fields, order)
    n_edges = len(pairs)
    return StepGraph(
        step=0,
        t0=0,
        action_id=fields["action_id"],
        rank=fields["rank"],
        stage=fields["stage"],
        kind=fields["kind"],
        microbatch=fields["microbatch"],
        prev=fields["prev"],
        dur=fields["dur"],
        ovh=fields["ovh"],
        edge_src=fields["edge_src"],
        edge_dst=fields["edge_dst"],
        edge_lat=np.full(n_edges, latency_ns, dtype=np.int64),
        edge_msg=np.full(n_edges, -1, dtype=np.int64),
    )
