"""Generated what-if cost models for unit tests (not traces): constant compute per
microbatch and rank, no host overhead, every message the same latency."""

from __future__ import annotations

import numpy as np

from tracekit.analyze.costs import CostModel


def constant_cost_model(p: int, work_ns: dict[str, int], latency_ns: int = 0) -> CostModel:
    """A measured-1F1B (p ranks, v=1, m=8) cost model whose every rank computes
    ``work_ns[kind]`` for one microbatch of each kind, with free host time and every
    message ``latency_ns``."""
    return CostModel(
        schedule="1F1B",
        p=p,
        v=1,
        m=8,
        ranks=list(range(p)),
        work={(r, kind): np.array([t]) for r in range(p) for kind, t in work_ns.items()},
        overhead={r: np.array([0]) for r in range(p)},
        latency={},
        all_latency=np.array([latency_ns]),
    )
