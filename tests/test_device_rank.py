"""A GPU rank's device timeline reduced (tracekit.reconstruct.device_rank) answers what the
analyses ask of a step window exactly as the ops themselves do: busy time in the window,
device idle waiting for launches in it, busy time after it; folded (each step's actions'
span summed into constants) or not, for every window that holds the span.

Inputs are GENERATED here (random ops, launches and actions: not real traces); the expected
figures are computed from the ops by the definitions in tracekit/analyze/device.py's module
doc, one op at a time (reference loops below), not with tracekit's code.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.analyze.device import _busy_after, _busy_in, _launch_wait
from tracekit.model.device import DeviceSummary
from tracekit.reconstruct.device_rank import (
    COLLECTIVE,
    COMPUTE,
    P2P,
    RankActions,
    RankOps,
    RankSides,
    join_ranks,
    kind_codes,
    reduce_rank,
    stack_part,
)


def _generated_rank(rng: np.random.Generator, n_ops: int, n_actions: int) -> tuple[RankOps, RankActions]:
    """generated_: a rank's ops over 3 steps, some launched inside action labels."""
    steps = rng.integers(0, 3, n_actions)
    label_start = np.sort(steps * 10_000 + rng.integers(0, 8_000, n_actions))
    steps = label_start // 10_000
    label_end = label_start + rng.integers(0, 600, n_actions)
    order = np.zeros(n_actions, dtype=np.int64)
    for s in np.unique(steps):
        order[steps == s] = np.arange(int((steps == s).sum()))
    op_step = rng.integers(-1, 3, n_ops)
    start = np.maximum(op_step, 0) * 10_000 + rng.integers(0, 11_000, n_ops)
    end = start + rng.integers(0, 900, n_ops)
    order_ops = np.lexsort((end, start))
    launch = np.where(rng.random(n_ops) < 0.8, start - rng.integers(0, 2_000, n_ops), -1)
    launch_end = np.where(launch >= 0, launch + rng.integers(0, 3_000, n_ops), -1)
    # some launches inside labels, so ops have owners
    pick = rng.integers(0, max(n_actions, 1), n_ops)
    inside = (rng.random(n_ops) < 0.6) & (n_actions > 0) & (launch >= 0)
    if n_actions:
        launch = np.where(inside, label_start[pick] + (label_end[pick] - label_start[pick]) // 2, launch)
        op_step = np.where(inside, steps[pick], op_step)
        launch_end = np.where(launch >= 0, np.maximum(launch_end, launch), -1)
    kind = rng.choice([COMPUTE, COMPUTE, COMPUTE, COLLECTIVE, P2P], n_ops).astype(np.int8)
    ops = RankOps(
        step=op_step[order_ops],
        start_ns=start[order_ops],
        end_ns=end[order_ops],
        stream=rng.integers(7, 10, n_ops)[order_ops],
        launch_ns=launch[order_ops],
        launch_end_ns=launch_end[order_ops],
        launch_tid=np.full(n_ops, 1, dtype=np.int64),
        kind=kind[order_ops],
        sendrecv=np.zeros(n_ops, dtype=bool),
        p2p_capable=np.zeros(n_ops, dtype=bool),
        peer=np.full(n_ops, -1, dtype=np.int64),
    )
    actions = RankActions(
        step=steps.astype(np.int64),
        order=order,
        label_start_ns=label_start.astype(np.int64),
        label_end_ns=label_end.astype(np.int64),
        start_ns=label_start.astype(np.int64),
    )
    return ops, actions


_NO_SIDES = {c: np.zeros(0, np.int64) for c in ("file_id", "source_index", "direction", "peer")}


def _summary(ops: RankOps, actions: RankActions, compress: bool) -> tuple[DeviceSummary, object]:
    found = reduce_rank(ops, RankSides(np.zeros(0, np.int64), np.zeros(0, np.int64)), actions, compress)
    return join_ranks([stack_part([found.tables(0, _NO_SIDES)], {}, {0: len(ops)})]), found


def _reference(
    ops: RankOps, busy: np.ndarray, step: int, lo: int, hi: int, gradient: np.ndarray
) -> tuple[int, int, int]:
    """Busy in [lo, hi), launch wait in it and the step's work after hi (busy ops and its
    gradient collectives, which no action waits for), op by op."""
    mine = [i for i in range(len(ops)) if ops.step[i] == step]
    work = sorted((int(ops.start_ns[i]), int(ops.end_ns[i])) for i in mine if busy[i])
    late = sorted((int(ops.start_ns[i]), int(ops.end_ns[i])) for i in mine if busy[i] or gradient[i])

    def covered(a: int, b: int, work: list[tuple[int, int]] = work) -> int:
        total, reach = 0, a
        for s, e in work:
            s, e = max(s, reach), min(e, b)
            if e > s:
                total += e - s
                reach = e
        return total

    after_end = max([hi] + [e for _, e in late])
    wait, reach = 0, lo
    for i in sorted(mine, key=lambda i: int(ops.start_ns[i])):
        s, launched = int(ops.start_ns[i]), int(ops.launch_end_ns[i])
        gap_hi = min(s, hi)
        if launched >= 0 and gap_hi > reach and min(launched, gap_hi) > reach:
            wait += min(launched, gap_hi) - reach
        reach = max(reach, int(ops.end_ns[i]))
    return covered(lo, hi), wait, covered(hi, after_end, late)


@pytest.mark.parametrize("seed", range(80))
def test_a_reduced_rank_answers_every_window_holding_its_span_as_its_ops_do(seed):
    rng = np.random.default_rng(seed)
    ops, actions = _generated_rank(rng, int(rng.integers(1, 60)), int(rng.integers(1, 12)))
    folded, found = _summary(ops, actions, compress=True)
    plain, _ = _summary(ops, actions, compress=False)
    busy = (found.kind == COMPUTE) | ((found.kind == COLLECTIVE) & (found.owner >= 0))
    # the profile's collectives no action launched (and so waits for): the step's, not busy
    gradient = (found.kind == COLLECTIVE) & (found.owner < 0) & (ops.step >= 0)
    steps = folded["steps"]
    for k in range(len(steps["step"])):
        step, a, b = int(steps["step"][k]), int(steps["span_lo_ns"][k]), int(steps["span_hi_ns"][k])
        if a > b:  # a step without actions: nothing folded; any window
            a, b = int(rng.integers(0, 40_000)), 0
        # the tightest window (the rank's own span: its actions start and end the step) and
        # wider ones, some by a hair
        for wider_lo, wider_hi in [(0, 0), (1, 1), (50, 0), (0, 50)] + [
            (int(x), int(y)) for x, y in rng.integers(0, 12_000, (6, 2))
        ]:
            lo = a - wider_lo
            hi = max(b, lo) + wider_hi
            q = (np.zeros(1, np.int64), np.array([step]), np.array([lo]), np.array([hi]))
            expected = _reference(ops, busy, step, lo, hi, gradient)
            for summary in (folded, plain):
                got = (
                    int(_busy_in(summary, *q)[0]),
                    int(_launch_wait(summary, *q)[0]),
                    int(_busy_after(summary, q[0], q[1], q[3])[0]),
                )
                assert got == expected, (seed, step, lo, hi)
    # folding keeps fewer rows, never more
    assert len(folded["busy"]["rank"]) <= len(plain["busy"]["rank"])
    assert len(folded["gaps"]["rank"]) <= len(plain["gaps"]["rank"])


def test_a_window_that_does_not_hold_a_folded_span_is_refused():
    rng = np.random.default_rng(3)
    ops, actions = _generated_rank(rng, 40, 6)
    folded, _ = _summary(ops, actions, compress=True)
    steps = folded["steps"]
    k = int(np.flatnonzero(steps["span_lo_ns"] <= steps["span_hi_ns"])[0])
    a = int(steps["span_lo_ns"][k])
    q = (np.zeros(1, np.int64), steps["step"][k : k + 1], np.array([a + 1]), np.array([a + 10**9]))
    with pytest.raises(RuntimeError, match="does not hold"):
        _busy_in(folded, *q)


def _part(found_by_rank: dict[int, object], n_ops: dict[int, int]) -> dict:
    """A file's part as reduce_ranks sends it, of some ranks' reduce_rank results."""
    ranks = sorted(found_by_rank)
    return stack_part([found_by_rank[r].tables(r, _NO_SIDES) for r in ranks], {}, {r: n_ops[r] for r in ranks})


def test_ranks_join_by_rank_whatever_files_hold_them():
    """One report may hold several ranks (Nsight Systems): parts whose ranks interleave (ranks
    0 and 2 in one file, 1 in another) join as one file per rank does."""
    rng = np.random.default_rng(7)
    found, n_ops = {}, {}
    for rank in range(3):
        ops, actions = _generated_rank(rng, 30, 6)
        found[rank] = reduce_rank(ops, RankSides(np.zeros(0, np.int64), np.zeros(0, np.int64)), actions, True)
        n_ops[rank] = len(ops)
    one_each = join_ranks([_part({r: found[r]}, n_ops) for r in (2, 0, 1)])
    interleaved = join_ranks([_part({0: found[0], 2: found[2]}, n_ops), _part({1: found[1]}, n_ops)])
    for name, table in one_each.tables.items():
        assert table["rank"].tolist() == sorted(table["rank"].tolist())
        for column, values in table.items():
            assert values.tolist() == interleaved.tables[name][column].tolist(), (name, column)
    kernels = one_each["p2p_kernels"]
    assert (kernels["kernel"][kernels["rank"] == 1] >= n_ops[0]).all()  # numbered after rank 0's ops


# RCCL's one kernel for every op as ROCm 6.1, 6.2, 6.3 and later name it, NCCL's SendRecv kernel
# and one of its collective kernels (issue #29; sources in tests/gpu_tracegen.py's module doc).
_COMM_KERNELS = {
    "rccl_main_kernel(ncclDevComm*, unsigned long, ncclWork*)": P2P,
    "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)": P2P,
    "ncclDevKernel_Generic_4(ncclDevComm*, channelMasks, ncclWork*)": P2P,
    "ncclDevKernel_Generic_2(ncclDevKernelArgsStorage<4096ul>)": P2P,
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": P2P,
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": COLLECTIVE,
}


def test_a_comm_kernel_is_p2p_where_a_send_or_recv_launched_it_and_never_by_its_name():
    """generated_ ops: each comm kernel twice, once launched on the thread of a host send (at
    or after the call began: its kernel) and once on a thread that made no P2P call. RCCL runs
    P2P and collectives in one generic kernel, so the launch alone says P2P; NCCL's collective
    kernel stays a collective even where a send's thread launched it."""
    names = list(_COMM_KERNELS)
    kinds, sendrecv, p2p_capable = kind_codes(names)
    n = 2 * len(names)
    code = np.repeat(np.arange(len(names)), 2)
    launch = np.arange(n, dtype=np.int64) * 1_000 + 10
    ops = RankOps(
        step=np.zeros(n, dtype=np.int64),
        start_ns=launch + 500,
        end_ns=launch + 900,
        stream=np.full(n, 20, dtype=np.int64),
        launch_ns=launch,
        launch_end_ns=launch + 100,
        launch_tid=np.tile(np.array([1, 2], dtype=np.int64), len(names)),  # even ops: the send's thread
        kind=kinds[code],
        sendrecv=sendrecv[code],
        p2p_capable=p2p_capable[code],
        peer=np.full(n, -1, dtype=np.int64),
    )
    sides = RankSides(tid=np.ones(len(names), dtype=np.int64), start_ns=launch[::2] - 10)
    no_actions = RankActions(*(np.zeros(0, dtype=np.int64) for _ in range(5)))
    found = reduce_rank(ops, sides, no_actions, compress=False)
    expected = list(_COMM_KERNELS.values())
    assert found.kind[::2].tolist() == expected, "launched by a send"
    assert found.kind[1::2].tolist() == [COLLECTIVE] * len(names), "launched where no send or recv was"
    tied = [2 * i if kind == P2P else -1 for i, kind in enumerate(expected)]
    assert found.sides["kernel"].tolist() == tied
