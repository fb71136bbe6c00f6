"""Ideal schedules as per-rank action orders, and graphs built from them for replay.

Used to check the closed-form bubbles against dependency-driven replays, and as the
starting point of what-if questions (another schedule, m, v): generate the order, give
it durations and latencies, replay.

The zero-bubble family (backward split into input-grad I and weight-grad W: ZB-H1,
InterleavedZeroBubble, ZBVZeroBubble, DualPipeV with its fused OVERLAP_F_B pairs) follows
torch.distributed.pipelining 2.13's schedule classes; :func:`orders_for` takes the order
from torch's own class where torch is installed (:func:`torch_orders`) and from the
generators here otherwise; tests/test_whatif_zb.py checks the two agree action for action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np

from tracekit.analyze.replay import StepGraph, dependency_pairs, reorder, topological_order
from tracekit.model import schedules as traits

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


def looped_bfs(p: int, v: int, m: int) -> dict[int, list[Action]]:
    """Breadth-first pipelining, torch 2.13's ScheduleLoopedBFS
    (``torch/distributed/pipelining/schedules.py``, ``_calculate_single_rank_operations``):
    rank r runs every microbatch's forward of its stages r, p + r, ... in stage order, then
    every backward of them in reverse stage order, the microbatches last to first (the
    padding it starts with only delays the order). With v = 1 it is GPipe's order, backwards
    reversed."""
    return {
        r: [("F", c * p + r, i) for c in range(v) for i in range(m)]
        + [("B", c * p + r, i) for c in reversed(range(v)) for i in reversed(range(m))]
        for r in range(p)
    }


def interleaved_zero_bubble(p: int, v: int, m: int) -> dict[int, list[Action]]:
    """torch's ScheduleInterleavedZeroBubble (the paper's ZB-1P), v chunks a rank, stage
    c*p + r on rank r; with v=1 it is ZB-H1.

    Microbatches go in rounds of ``per_round = m // max(1, m // p)`` (m must split into
    whole rounds). Rank r runs (v-1)*per_round + p-1-r warm-up forwards, then pairs a
    forward with an input-grad backward (I) until the forwards are done, then the remaining
    I's. Forwards visit the chunks upwards a round at a time, I's downwards. Each rank
    holds back r weight-grad backwards (W): after its j-th I (j >= r) it runs the W of
    its (j-r)-th, the W's still owed come last. So W fills the bubble that 1F1B would
    leave: rank r would otherwise wait for gradients while deeper ranks drain."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"interleaved zero bubble needs m to split into {rounds} rounds of microbatches")
    return {r: _interleaved_zero_bubble_rank(p, v, m // rounds, m, r) for r in range(p)}


def _interleaved_zero_bubble_rank(p: int, v: int, per_round: int, m: int, r: int) -> list[Action]:
    total = v * m
    warmup = min((v - 1) * per_round + (p - 1 - r), total)
    seen: dict[tuple[str, int], int] = {}

    def next_of(kind: str, stage: int) -> Action:
        mb = seen.get((kind, stage), 0)
        seen[(kind, stage)] = mb + 1
        return (kind, stage, mb)

    forwards = [next_of("F", ((k // per_round) % v) * p + r) for k in range(total)]
    inputs = [next_of("I", (v - 1 - (j // per_round) % v) * p + r) for j in range(total)]
    order: list[Action] = forwards[:warmup]
    weights_done = 0
    for j, grad in enumerate(inputs):
        if warmup + j < total:
            order.append(forwards[warmup + j])
        order.append(grad)
        if j >= r:
            order.append(("W", *inputs[weights_done][1:]))
            weights_done += 1
    order.extend(("W", *grad[1:]) for grad in inputs[weights_done:])
    return order


def zb_h1(p: int, m: int) -> dict[int, list[Action]]:
    """ZB-H1 (Qi et al.): 1F1B with the backward split, rank r deferring r weight-grads.
    torch has no class of that name: it is ScheduleInterleavedZeroBubble with one stage a rank."""
    return interleaved_zero_bubble(p, 1, m)


def v_stages(p: int, r: int) -> tuple[int, int]:
    """The two stages of rank r in a V placement (torch's style="v"): r going down the
    ranks, 2p-1-r coming back up, so the last rank holds the middle two."""
    return r, 2 * p - 1 - r


def zbv_zero_bubble(p: int, m: int) -> dict[int, list[Action]]:
    """torch's ScheduleZBVZeroBubble (the paper's ZB-V), two stages a rank in a V.

    Planned for max(m, 2p-1) microbatches (enough to fill the V), then the actions of
    microbatches past m dropped, as torch does. Rank r (chunk 0 = stage r, chunk 1 =
    stage 2p-1-r): 2(p-r)-1 forwards of chunk 0; r times a forward of chunk 1 then of
    chunk 0; p-r times chunk 1's F, I, W; then, while forwards remain, chunk 0's (F), I, W
    and chunk 1's F, I, W; then r times chunk 0's and chunk 1's I; p-r times chunk 0's I
    and its oldest owed W; then chunk 1's owed W's, then chunk 0's."""
    planned = max(2 * p - 1, m)
    return {r: [a for a in _zbv_rank(p, planned, r) if a[2] < m] for r in range(p)}


def _zbv_rank(p: int, planned: int, r: int) -> list[Action]:
    down, up = v_stages(p, r)
    order: list[Action] = []
    f = {down: 0, up: 0}
    i = {down: 0, up: 0}
    w = {down: 0, up: 0}

    def run(kind: str, stage: int, count: dict[int, int]) -> None:
        order.append((kind, stage, count[stage]))
        count[stage] += 1

    for _ in range(2 * (p - r) - 1):
        run("F", down, f)
    for _ in range(r):
        run("F", up, f)
        run("F", down, f)
    for _ in range(p - r):
        run("F", up, f)
        run("I", up, i)
        run("W", up, w)
    while f[up] < f[down] or f[down] < planned:
        if f[down] < planned:
            run("F", down, f)
        run("I", down, i)
        run("W", down, w)
        run("F", up, f)
        run("I", up, i)
        run("W", up, w)
    for _ in range(r):
        run("I", down, i)
        run("I", up, i)
    for _ in range(p - r):
        run("I", down, i)
        run("W", down, w)
    while w[up] < i[up]:
        run("W", up, w)
    while w[down] < i[down]:
        run("W", down, w)
    return order


# One entry of a rank's order: an action, or a fused pair (torch's OVERLAP_F_B: a forward
# and a backward run back to back in one label, their sends posted after both).
Entry = Action | tuple[Action, Action]


def dualpipev(p: int, m: int) -> dict[int, list[Entry]]:
    """torch's ScheduleDualPipeV (DeepSeek's DualPipe cut in half), two stages a rank in a
    V, m >= 2p.

    Rank r (chunk 0 = stage r, chunk 1 = stage 2p-1-r), phase by phase:
    2(p-r-1) forwards of chunk 0; r+1 times chunk 0's then chunk 1's forward; p-r-1
    times chunk 1's I, the oldest owed W, chunk 1's F; then m-2p+r+1 times the fused
    pairs (chunk 0's F, chunk 1's full B) and (chunk 1's F, chunk 0's B) (the last rank
    runs its very first pair unfused); p-r-1 times chunk 1's B and the pair (chunk 1's F,
    chunk 0's B); r+1 times a backward of chunk 1 and of chunk 0, full B until halfway
    (odd ranks switch to I before chunk 1's, even ranks before chunk 0's), split I after;
    p-r-1 times an owed W and chunk 0's backward; r+1 owed W's. A W is owed by each I, oldest
    first; B's microbatch counts with the I's of its stage."""
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs m >= 2p = {2 * p} microbatches")
    return {r: _dualpipev_rank(p, m, r) for r in range(p)}


def _dualpipev_rank(p: int, m: int, r: int) -> list[Entry]:
    down, up = v_stages(p, r)
    order: list[Entry] = []
    forward = {down: 0, up: 0}
    backward = {down: 0, up: 0}  # I and full B of a stage share one count
    owed: list[Action] = []

    def f(stage: int) -> Action:
        forward[stage] += 1
        return ("F", stage, forward[stage] - 1)

    def b(stage: int, split: bool = False) -> Action:
        backward[stage] += 1
        action = ("I" if split else "B", stage, backward[stage] - 1)
        if split:
            owed.append(("W", stage, action[2]))
        return action

    def pay() -> None:
        if owed:
            order.append(owed.pop(0))

    order.extend(f(down) for _ in range(2 * (p - r - 1)))
    for _ in range(r + 1):
        order.extend((f(down), f(up)))
    for _ in range(p - r - 1):
        order.append(b(up, split=True))
        pay()
        order.append(f(up))
    for k in range(m - 2 * p + r + 1):
        if k == 0 and r == p - 1:
            order.extend((f(down), b(up)))
        else:
            order.append((f(down), b(up)))
        order.append((f(up), b(down)))
    for _ in range(p - r - 1):
        order.append(b(up))
        order.append((f(up), b(down)))
    split = False
    half = (r + 1) // 2
    for k in range(r + 1):
        split = split or (k == half and r % 2 == 1)
        order.append(b(up, split))
        split = split or (k == half and r % 2 == 0)
        order.append(b(down, split))
    for _ in range(p - r - 1):
        pay()
        order.append(b(down, split))
    for _ in range(r + 1):
        pay()
    return order


GENERATORS: dict[str, Callable[[int, int, int], Mapping[int, Sequence[Entry]]]] = {
    "GPipe": lambda p, v, m: gpipe(p, m),
    "1F1B": lambda p, v, m: one_f_one_b(p, m),
    "Interleaved1F1B": interleaved_1f1b,
    "LoopedBFS": looped_bfs,
    "ZB-H1": lambda p, v, m: zb_h1(p, m),
    "InterleavedZeroBubble": interleaved_zero_bubble,
    "ZBVZeroBubble": lambda p, v, m: zbv_zero_bubble(p, m),
    "DualPipeV": lambda p, v, m: dualpipev(p, m),
}
# The zero-bubble family: backward split into I and W, orders taken from torch where it is installed.
ZERO_BUBBLE = traits.names(generated=True, split_backward=True)
# torch.distributed.pipelining's class for each (and for LoopedBFS, whose generator here is
# checked against it: tests/test_whatif_zb.py), and the placement of its stages.
TORCH_CLASSES = {name: traits.BY_NAME[name].runner for name in (*ZERO_BUBBLE, "LoopedBFS")}
V_PLACED = traits.names(generated=True, v_shaped=True)


def torch_orders(schedule: str, p: int, v: int, m: int) -> dict[int, list[Entry]]:
    """The per-rank order torch's own schedule class computes for ``schedule`` (one of
    :data:`TORCH_CLASSES`), without running it: the classes build ``pipeline_order`` for every
    rank in their constructor from the stages' group size, stage count and the microbatch
    count, so stand-in stages carrying just those (no module, no process group) are enough;
    the constructor's last step, lowering the order into send/recv actions, is skipped.
    Raises ImportError where torch is not installed, ValueError where torch refuses (p, v, m)."""
    return {r: list(entries) for r, entries in _torch_orders(schedule, p, v, m).items()}


@lru_cache(maxsize=64)
def _torch_orders(schedule: str, p: int, v: int, m: int) -> dict[int, tuple[Entry, ...]]:
    from torch.distributed.pipelining import schedules as torch_schedules

    torch_class = getattr(torch_schedules, TORCH_CLASSES[schedule])

    class OrderOnly(torch_class):  # type: ignore[misc, valid-type]
        """torch's class, minus the lowering of its order into send/recv actions that its
        constructor ends with: quadratic in the actions (20 s for ZBV at p=128, m=256) and
        not part of the order."""

        def _prepare_schedule_with_comms(self, *args: Any, **kwargs: Any) -> None:
            pass

    local = 1 if traits.BY_NAME[schedule].chunks == "one" else v
    stages = [
        # what the constructors read: group size and rank, stage count; submod None skips
        # the torch.compile check; stage_index_to_group_rank is written back
        SimpleNamespace(group_size=p, group_rank=0, num_stages=p * local, submod=None, stage_index_to_group_rank={})
        for _ in range(local)
    ]
    try:
        built = OrderOnly(stages, m)
    except (AssertionError, RuntimeError) as err:  # torch's own refusals, said as ValueError
        raise ValueError(str(err)) from err
    return {int(r): tuple(_entry(a) for a in actions if a is not None) for r, actions in built.pipeline_order.items()}


def _entry(action: Any) -> Entry:
    if action.sub_actions is not None:  # OVERLAP_F_B: (forward, full backward), run in that order
        first, second = action.sub_actions
        return (_action(first), _action(second))
    return _action(action)


def _action(action: Any) -> Action:
    return (str(action.computation_type.value), int(action.stage_index), int(action.microbatch_index))


def orders_for(schedule: str, p: int, v: int, m: int, source: str = "auto") -> tuple[dict[int, list[Entry]], str]:
    """The order of ``schedule`` and where it came from. ``source``: "torch" (its own class),
    "tracekit" (the generators here) or "auto": torch's for the zero-bubble family where torch
    is importable, else tracekit's. Raises ValueError for a (p, v, m) the schedule refuses."""
    if schedule in ZERO_BUBBLE and source in ("auto", "torch"):
        try:
            import torch
        except ImportError:
            if source == "torch":
                raise
        else:
            orders = torch_orders(schedule, p, v, m)
            return orders, f"torch {torch.__version__} {TORCH_CLASSES[schedule]}"
    return {r: list(o) for r, o in GENERATORS[schedule](p, v, m).items()}, "tracekit's generator"


def flatten(orders: Mapping[int, Sequence[Entry]]) -> tuple[dict[int, list[Action]], np.ndarray]:
    """Fused pairs unpacked into their two actions, and per action (ranks in order, then
    each rank's order, as :func:`graph_from_orders` numbers them) whether it is the second
    half of a fused pair."""
    flat: dict[int, list[Action]] = {}
    fused: list[bool] = []
    for r in sorted(orders):
        flat[r] = []
        for entry in orders[r]:
            if isinstance(entry[0], tuple):
                flat[r].extend(entry)
                fused.extend((False, True))
            else:
                flat[r].append(entry)
                fused.append(False)
    return flat, np.array(fused, dtype=bool)


def graph_from_orders(
    orders: Mapping[int, Sequence[Entry]], durations: dict[str, int], latency_ns: int = 0, overhead_ns: int = 0
) -> StepGraph:
    """A replayable graph of an ideal schedule: per-kind durations, one latency for every
    cross-rank message, one overhead before every action. A fused pair's two actions run
    back to back and its first half's output leaves after the second half (torch posts a
    fused label's sends after both), so that message's edge starts at the second half."""
    flat, fused = flatten(orders)
    kind, stage, mb, rank, prev = [], [], [], [], []
    for r in sorted(flat):
        last = -1
        for k, s, i in flat[r]:
            kind.append(k)
            stage.append(s)
            mb.append(i)
            rank.append(r)
            prev.append(last)
            last = len(kind) - 1
    rank_a, stage_a, mb_a = np.array(rank), np.array(stage), np.array(mb)
    kind_a = np.array(kind, dtype=object)
    second_half = np.append(fused[1:], False)  # the action is a fused pair's first half
    pairs = [(j + 1 if second_half[j] else j, i) for j, i in dependency_pairs(rank_a, stage_a, kind_a, mb_a)]
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
