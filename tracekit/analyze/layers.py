"""Per-layer compute: what each layer of the model costs, forward and backward, per microbatch.

Three sources, tried in this order, each figure saying which it came from (``source``):

- ``"module-names"``: the model's own names, where the trace has them. Python frames of
  ``with_stack`` / ``with_modules`` traces, ``nn.Module: <Class>_<k>`` (torch numbers each
  class's instances per process), and ranges or frames naming a layer by its place in the
  model (``decoder.layers.3``, ``model.layers.3.mlp``: Megatron's and Hugging Face's
  qualified module names). The layer is the name group whose instances every forward of
  every stage holds, each forward of a stage the same number, and that carries the most
  time among the groups with more than one instance on some stage (so a stage's container,
  one instance, is no layer, and neither are a layer's own Linears, which it holds). A
  ``layers.N`` group is taken before module classes. Layer ``k`` of a forward starts at its
  ``k``-th instance's first frame.
- ``"op-period"``: the smallest repeating unit of each stage's forward op sequence. A layer
  runs the same ops every time, so the top-level ops (ranges count as ops, numbers in names
  blanked: ``linear3(F)`` repeats like any op) that occur equally often in every forward of
  the stage form a sequence ``prefix + unit x N + suffix``: the unit that tiles most of it,
  the shortest of those, is one layer and N the stage's layer count (a unit of two ops that
  repeats 4 times is 4 layers, not 8; a last repeat cut short, the last layer without the
  activation that follows the others, is a layer where it holds at least half the unit's
  ops). The repeats must carry at least half the forward's op time. A stage that repeats
  nothing holds one layer: a unit another stage repeats, or, where no stage repeats one, the
  forward most stages run. The ops are those whose middle lies in the forward's compute
  span, but for ranges around all of it (a per-layer range starts before its first op).
  A forward whose ops differ from most of its stage's (the forward share of DualPipeV's fused
  forward-backward) is left out.
- ``"file"``: a user's ``--layer-costs FILE`` (see :func:`read_layer_costs`).

From a trace, layer ``k`` of a forward is the span from its start to the next layer's (the
first layer from the action's start, the last to its end), so the layers of an action add
up to its compute span, gaps and extra ops (the embedding on the first stage, the loss on
the last) included. A backward is cut by autograd's own bookkeeping: every backward op
carries the sequence number of the forward op it differentiates, so each top-level op of a
backward (or of its input-grad and weight-grad actions, where the run split them) belongs
to the layer whose forward ran that number, an op without one (``AccumulateGrad``) to the
layer before it, and each op's span runs to the next op's start (the first from the
action's start, the last to its end). Each figure is the mean over the microbatches and
steps: means add up, so a stage's layers sum to its actions' mean compute (a median of sums
is not the sum of medians, and the replay rescales means).

All give the costs at the measured microbatch size, in ns.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.errors import TracekitError
from tracekit.model.names import FRAME_CATEGORY, MODULE_FRAME
from tracekit.model.run import Run

SOURCES = ("module-names", "op-period", "file")
#: each source as the outputs say it
SOURCE_WORDS = {
    "module-names": "the model's module names",
    "op-period": "the repeating unit of the forward ops",
    "file": "--layer-costs",
}
_NUMBER = r"\d+"
# A range or frame that names a layer by its place in the model: Megatron's decoder.layers.3,
# Hugging Face's model.layers.3.mlp (the group is the name up to the index).
_PLACED_LAYER = re.compile(r"^(?:.*?\s)?(?P<group>(?:[\w]+\.)*layers)\.(?P<index>\d+)(?:\.|\s|$)")
# The repeating unit must carry at least this share of the forward's top-level op time, and a
# last repeat cut short is a layer where it carries this share of a whole unit's op time.
MIN_PERIOD_SHARE = 0.5
BACKWARD_KINDS = ("B", "I", "W")


@dataclass(frozen=True)
class LayerCost:
    """One layer's compute for one microbatch."""

    layer: int  # 0-based position in the model
    forward_ns: int
    backward_ns: int  # full backward (input-grad + weight-grad where the run split them)
    stage: int | None  # the measured stage that holds it (None: unknown, file without a split)
    samples: int  # actions each figure is the mean of (0: given in a file)

    @property
    def total_ns(self) -> int:
        return self.forward_ns + self.backward_ns

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "forward_ns": self.forward_ns,
            "backward_ns": self.backward_ns,
            "stage": self.stage,
            "samples": self.samples,
        }


@dataclass(frozen=True)
class LayerCosts:
    """The model's layers in order, with where their figures came from."""

    layers: list[LayerCost]
    source: str  # one of SOURCES
    detail: str  # how: the layer's name group, the repeating unit, or the file's path
    measured_split: list[int] | None  # layers per measured stage, where known

    def found(self) -> str:
        """``16 layers from the model's module names, 4,4,4,4 per stage`` (the file: no stages)."""
        per_stage = f", {_commas(self.measured_split)} per stage" if self.measured_split else ""
        return f"{len(self.layers)} layers from {SOURCE_WORDS[self.source]}{per_stage}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "detail": self.detail,
            "n_layers": len(self.layers),
            "measured_split": self.measured_split,
            "layers": [c.to_dict() for c in self.layers],
        }


def layer_costs_from_trace(run: Run) -> LayerCosts:
    """Per-layer costs of ``run`` from its module names, else from the period of its forward
    ops (see the module doc); a TracekitError says why where neither shows the layers."""
    actions = run.actions[run.actions["step"] >= 0]
    if not len(actions):
        raise TracekitError(f"{run.source}: no actions in the profiled steps; no layers to read")
    ops = _host_ops(run.events)
    stages = sorted(int(s) for s in actions["stage"].unique())
    forwards = {s: actions[(actions["stage"] == s) & (actions["kind"] == "F")] for s in stages}
    for stage, group in forwards.items():
        if not len(group):
            raise TracekitError(
                f"{run.source}: stage {stage} has no forward actions (no layers to read); "
                "give the layer costs with --layer-costs FILE"
            )
    found = _by_module_names(_layer_marks(run.events), forwards)
    if found is None:
        found = _by_op_period(ops, forwards, run.source)
    starts, source, detail = found
    by_seq = _layer_of_sequence(ops, forwards, starts)
    costs: list[LayerCost] = []
    split: list[int] = []
    for stage in stages:
        forward = np.array(
            [np.diff([*s, int(e)]) for s, e in zip(starts[stage], forwards[stage]["end_ns"].tolist()) if s is not None],
            dtype=float,
        )
        n = forward.shape[1]
        # a microbatch's backward is one B action, or an I and a W (I empty or missing where
        # the stage's input needs no gradient): per layer, the time of all of them over the
        # number of B and W actions read
        backward = np.zeros(n)
        backward_samples = backwards = 0
        backward_ns = 0.0  # all of the stage's backward actions, read or not
        left_out = False
        for kind in BACKWARD_KINDS:
            group = actions[(actions["stage"] == stage) & (actions["kind"] == kind)]
            read = [_backward_blocks(ops, by_seq, n, action) for action in group.itertuples()]
            blocks = [b for b in read if b is not None]
            left_out |= len(blocks) < len(read)
            if blocks:
                backward += np.sum(np.array(blocks, dtype=float), axis=0)
            backward_ns += float((group["end_ns"] - group["start_ns"]).sum())
            if kind != "I":
                backward_samples += len(blocks)
                backwards += len(group)
        if not backward_samples:
            raise TracekitError(
                f"{run.source}: stage {stage}'s backwards hold no op that names a forward op read (autograd "
                "sequence numbers): no per-layer backward; give the layer costs with --layer-costs FILE"
            )
        backward /= backward_samples
        fwd = forward.mean(axis=0)
        # Where actions were left out (a forward unlike its stage's others, a backward of one),
        # those read give each layer's share, and the stage's layers still add up to the mean
        # of all its actions: the left-out ones may cost more or less (TeraPipe's slices do).
        group = forwards[stage]
        if len(forward) < len(group):
            fwd *= float((group["end_ns"] - group["start_ns"]).mean()) / max(1.0, float(fwd.sum()))
        if left_out and backward.sum() > 0:
            backward *= backward_ns / backwards / float(backward.sum())
        for k in range(n):
            costs.append(
                LayerCost(
                    len(costs), int(round(fwd[k])), int(round(backward[k])), stage, min(len(forward), backward_samples)
                )
            )
        split.append(n)
    return LayerCosts(costs, source, detail, split)


# Per stage, per forward action (in the table's order): the start of each of its layers
# (None: a forward left out, see _by_op_period).
LayerStarts = dict[int, list[list[int] | None]]


def _host_ops(events: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Per rank, its main thread's host ops and ranges (``cpu_op``, ``user_annotation``), by
    start time, with their names' numbers blanked (``linear3(F)`` -> ``linear#(F)``): a
    per-layer range or module name repeats once per layer only without its index."""
    host = events["cat"].isin(["cpu_op", "user_annotation"]) & (~events["on_gpu"])
    ev = events[host & (events["tid"] == events["pid"])]
    ev = ev[["rank", "name", "start_ns", "end_ns", "depth", "seq"]].sort_values(["rank", "start_ns"], kind="stable")
    ev = ev.assign(name=ev["name"].astype(str).str.replace(_NUMBER, "#", regex=True))
    return {int(str(r)): g.reset_index(drop=True) for r, g in ev.groupby("rank", sort=True)}


def _inside(ops: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """The rows of ``ops`` (by start) that lie inside [start_ns, end_ns]."""
    starts = ops["start_ns"].to_numpy()
    lo, hi = np.searchsorted(starts, start_ns, "left"), np.searchsorted(starts, end_ns, "right")
    inside = ops.iloc[lo:hi]
    return inside[inside["end_ns"] <= end_ns]


def _top_ops(ops: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """The outermost ops of the compute span [start_ns, end_ns]: those whose middle is inside
    it, but for the ranges around all of it (the action's label, a whole-step range). A range
    around a layer may start before the span's first op (a per-layer label: the span is its
    compute) and end after its last: its middle is inside."""
    starts = ops["start_ns"].to_numpy()
    lo, hi = np.searchsorted(starts, 2 * start_ns - end_ns, "left"), np.searchsorted(starts, end_ns, "right")
    near = ops.iloc[lo:hi]
    middle = (near["start_ns"] + near["end_ns"]) // 2
    around = (near["start_ns"] <= start_ns) & (near["end_ns"] >= end_ns)
    inside = near[(middle >= start_ns) & (middle <= end_ns) & ~around]
    if not len(inside):
        return inside
    top: pd.DataFrame = inside[inside["depth"] == inside["depth"].min()]
    return top


# ---------------------------------------------------------------------------------------
# module names
# ---------------------------------------------------------------------------------------
def _layer_marks(events: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Per rank, the main thread's rows that name a layer instance: ``group`` (the module
    class, ``nn.Module: SleepLinear``, or the placed name, ``decoder.layers``), ``key`` (the
    instance: torch's per-class number, or the index in the model), ``placed`` (a layers.N
    name), by their middle (``mid_ns``)."""
    host = (~events["on_gpu"]) & (events["tid"] == events["pid"])
    cand = events[host & events["cat"].isin([FRAME_CATEGORY, "user_annotation"])]
    rows = []
    for name in cand["name"].astype(str).unique().tolist():
        module = MODULE_FRAME.match(name)
        placed = _PLACED_LAYER.match(name)
        if placed is not None:
            rows.append((name, placed["group"], int(placed["index"]), True))
        elif module is not None:
            rows.append((name, "nn.Module: " + module["cls"], int(module["index"]), False))
    if not rows:
        return {}
    table = pd.DataFrame(rows, columns=["name", "group", "key", "placed"])
    marks = cand[["rank", "name", "start_ns", "end_ns"]].assign(name=cand["name"].astype(str)).merge(table, on="name")
    # a layer's frame starts before its first op and ends after its last: its middle is
    # inside the forward's compute span
    marks = marks.assign(mid_ns=(marks["start_ns"] + marks["end_ns"]) // 2)
    marks = marks.sort_values(["rank", "mid_ns"], kind="stable")
    return {int(str(r)): g.reset_index(drop=True) for r, g in marks.groupby("rank", sort=True)}


def _by_module_names(
    marks: dict[int, pd.DataFrame], forwards: dict[int, pd.DataFrame]
) -> tuple[LayerStarts, str, str] | None:
    """Each forward's layer starts from the layer's name group (see the module doc), or None
    where no group is a layer of every stage."""
    if not marks:
        return None
    # per group: per stage, per action, its instances in first-start order (start, key)
    seen: dict[str, dict[int, list[list[int]]]] = {}
    time_of: Counter[str] = Counter()
    placed: set[str] = set()
    for stage, group in forwards.items():
        for i, (rank, start, end) in enumerate(
            zip(group["rank"].tolist(), group["start_ns"].tolist(), group["end_ns"].tolist())
        ):
            rank_marks = marks.get(int(rank))
            if rank_marks is None:
                continue
            mids = rank_marks["mid_ns"].to_numpy()
            lo, hi = np.searchsorted(mids, int(start), "left"), np.searchsorted(mids, int(end), "right")
            inside = rank_marks.iloc[lo:hi]
            for name, rows in inside.groupby("group", sort=False):
                first = rows.sort_values("start_ns", kind="stable").drop_duplicates("key")
                per_action = seen.setdefault(str(name), {}).setdefault(stage, [[] for _ in range(len(group))])
                per_action[i] = first["start_ns"].astype(np.int64).tolist()
                time_of[str(name)] += int((rows["end_ns"] - rows["start_ns"]).sum())
                if bool(rows["placed"].iloc[0]):
                    placed.add(str(name))
    layers = []
    for name, by_stage in seen.items():
        if set(by_stage) != set(forwards):
            continue
        counts = {s: {len(a) for a in per_action} for s, per_action in by_stage.items()}
        if any(len(c) != 1 or 0 in c for c in counts.values()):
            continue  # a stage whose forwards hold it a different number of times, or not at all
        most = max(next(iter(c)) for c in counts.values())
        layers.append((name in placed, most > 1, time_of[name], name))
    if not layers:
        return None
    _, _, _, name = max(layers)
    starts: LayerStarts = {
        stage: [[int(start), *firsts[1:]] for start, firsts in zip(forwards[stage]["start_ns"].tolist(), per_action)]
        for stage, per_action in seen[name].items()
    }
    what = f"{name}.N" if name in placed else f"{name}_N"
    return starts, "module-names", f"layers = the model's {what} in each forward (its own names)"


# ---------------------------------------------------------------------------------------
# the period of the forward ops
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Period:
    """``unit`` repeats ``repeats`` times from op ``first`` of the sequence (a last repeat cut
    short included, ``cut`` ops of it)."""

    unit: tuple[str, ...]
    first: int
    repeats: int
    cut: int


def smallest_period(names: Sequence[str]) -> _Period | None:
    """The unit whose consecutive repeats (at least two) cover most of ``names`` (a last
    repeat may be cut short), the shortest of those, from its first place; the whole
    sequence once where nothing repeats; None for an empty sequence."""
    n = len(names)
    if not n:
        return None
    codes = pd.factorize(pd.Series(list(names), dtype=object))[0]
    best: tuple[int, int, int] | None = None  # (ops covered, -period, -first)
    for period in range(1, n // 2 + 1):
        same = codes[:-period] == codes[period:]
        if not same.any():
            continue
        # the longest run of positions i with codes[i] == codes[i + period]
        edges = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        k = int(np.argmax(run_ends - run_starts))
        covered = int(run_ends[k] - run_starts[k]) + period
        if covered < 2 * period:
            continue
        key = (covered, -period, -int(run_starts[k]))
        if best is None or key > best:
            best = key
    if best is None:
        return _Period(tuple(names), 0, 1, 0)
    covered, period, first = best[0], -best[1], -best[2]
    return _Period(tuple(names[first : first + period]), first, covered // period, covered % period)


def _by_op_period(
    ops: dict[int, pd.DataFrame], forwards: dict[int, pd.DataFrame], source: str
) -> tuple[LayerStarts, str, str]:
    """Each forward's layer starts from the repeating unit of its stage's forward ops (see
    the module doc), or a TracekitError naming the stage that shows none."""
    tops: dict[int, list[pd.DataFrame | None]] = {}
    for stage, group in forwards.items():
        per_action = []
        for rank, start, end in zip(group["rank"].tolist(), group["start_ns"].tolist(), group["end_ns"].tolist()):
            rank_ops = ops.get(int(rank))
            top = _top_ops(rank_ops, int(start), int(end)) if rank_ops is not None else None
            if top is None or not len(top):
                raise TracekitError(
                    f"{source}: stage {stage}'s forwards hold no host ops (no layers to read); "
                    "give the layer costs with --layer-costs FILE"
                )
            per_action.append(top)
        counts = [Counter(t["name"].tolist()) for t in per_action]
        # a forward whose ops differ from most of the stage's (the forward share of a fused
        # forward-backward, DualPipeV's) is left out where most agree
        kinds = [tuple(sorted(c.items())) for c in counts]
        usual, n_usual = Counter(kinds).most_common(1)[0]
        used = [k == usual for k in kinds] if 2 * n_usual > len(kinds) else [True] * len(kinds)
        counts = [c for c, u in zip(counts, used) if u]
        steady = {name for name, n in counts[0].items() if all(c.get(name) == n for c in counts[1:])}
        tops[stage] = [t[t["name"].isin(steady)] if u else None for t, u in zip(per_action, used)]
    periods = {stage: smallest_period(_first(t)["name"].tolist()) for stage, t in tops.items()}
    # a stage that repeats nothing holds one layer: a unit another stage repeats, or where no
    # stage repeats one, the forward most stages run
    shared = [p.unit for p in periods.values() if p is not None and p.repeats > 1]
    if not shared:
        common = Counter(p.unit for p in periods.values() if p is not None).most_common(1)
        shared = [common[0][0]] if common and common[0][1] > 1 else []
    starts: LayerStarts = {}
    units: list[tuple[str, ...]] = []
    for stage, stage_tops in tops.items():
        period = periods[stage]
        candidates = [period.unit] if period is not None and period.repeats > 1 else sorted(set(shared), key=len)[::-1]
        found = None
        for unit in candidates:
            action_starts = [None if top is None else _unit_starts(top, unit) for top in stage_tops]
            read = [s for s, top in zip(action_starts, stage_tops) if top is not None]
            if all(s is not None for s in read) and len({len(s) for s in read if s is not None}) == 1:
                found = unit, action_starts
                break
        if found is None:
            raise TracekitError(
                f"{source}: stage {stage}'s forwards repeat no unit of ops that all of them hold alike (no layers to "
                "read); record module names (torch.profiler with_stack=True) or give --layer-costs FILE"
            )
        unit, action_starts = found
        starts[stage] = [
            None if s is None else [int(start), *s[1:]]
            for s, start in zip(action_starts, forwards[stage]["start_ns"].tolist())
        ]
        if unit not in units:
            units.append(unit)
    detail = "layers = the repeating unit of each stage's forward ops: " + "; ".join(_unit_text(u) for u in units)
    return starts, "op-period", detail


def _first(tops: list[pd.DataFrame | None]) -> pd.DataFrame:
    return next(t for t in tops if t is not None)


def _unit_starts(top: pd.DataFrame, unit: tuple[str, ...]) -> list[int] | None:
    """The start of every repeat of ``unit`` from its first place in one forward's ops (a
    last repeat cut short counted where it holds at least half the unit's ops; a forward
    holding the unit only cut short is one layer), or None where the forward does not hold
    it, or its repeats carry less than half of the forward's op time."""
    names = top["name"].tolist()
    starts = top["start_ns"].to_numpy()
    time = (top["end_ns"] - top["start_ns"]).to_numpy()
    p = len(unit)
    least = (p + 1) // 2  # ops of a repeat cut short that still make a layer
    for length in range(p, least - 1, -1):
        head = unit[:length]
        first = next((i for i in range(len(names) - length + 1) if tuple(names[i : i + length]) == head), None)
        if first is not None:
            break
    if first is None:
        return None
    repeats = 1 if length == p else 0
    while repeats and tuple(names[first + repeats * p : first + (repeats + 1) * p]) == unit:
        repeats += 1
    end = first + repeats * p
    cut = 0
    while cut < p - 1 and end + cut < len(names) and names[end + cut] == unit[cut]:
        cut += 1
    layer_starts = [int(starts[first + k * p]) for k in range(repeats)]
    if cut >= least:
        layer_starts.append(int(starts[end]))
        end += cut
    if time[first:end].sum() < MIN_PERIOD_SHARE * max(1, int(time.sum())):
        return None
    return layer_starts


def _unit_text(unit: tuple[str, ...]) -> str:
    ops = [_short(op) for op in unit]
    return " > ".join(ops) if len(ops) <= 4 else " > ".join(ops[:3]) + f" > ... ({len(ops)} ops)"


def _commas(counts: Sequence[int]) -> str:
    return ",".join(str(n) for n in counts)


def _short(name: str) -> str:
    return name.removeprefix("autograd::engine::evaluate_function: ")


# ---------------------------------------------------------------------------------------
# backwards: each op to the layer whose forward ran its sequence number
# ---------------------------------------------------------------------------------------
def _layer_of_sequence(
    ops: dict[int, pd.DataFrame], forwards: dict[int, pd.DataFrame], starts: LayerStarts
) -> dict[int, dict[int, int]]:
    """Per rank: autograd sequence number -> the layer (within its stage) whose forward block
    ran the op that took it."""
    out: dict[int, dict[int, int]] = {}
    for stage, group in forwards.items():
        for (rank, start, end), layer_starts in zip(
            zip(group["rank"].tolist(), group["start_ns"].tolist(), group["end_ns"].tolist()), starts[stage]
        ):
            rank_ops = ops.get(int(rank))
            if rank_ops is None or layer_starts is None:
                continue
            inside = _inside(rank_ops, int(start), int(end))
            inside = inside[inside["seq"] >= 0]
            layer = np.searchsorted(
                np.asarray(layer_starts[1:], dtype=np.int64), inside["start_ns"].to_numpy(), "right"
            )
            out.setdefault(int(rank), {}).update(zip(inside["seq"].astype(int).tolist(), layer.tolist()))
    return out


def _backward_blocks(
    ops: dict[int, pd.DataFrame], by_seq: dict[int, dict[int, int]], n_layers: int, action: Any
) -> list[int] | None:
    """One backward action's time per layer of its stage: each top-level op's span to the
    next op (the first from the action's start, the last to its end) to the layer whose
    forward took its sequence number, an op without one to the layer of the op before it
    (the first mapped op's layer for those before it). An action without ops holds nothing
    (torch's empty input-grad on stage 0); None where no op names a forward read (the
    backward of a forward left out)."""
    start, end, rank = int(action.start_ns), int(action.end_ns), int(action.rank)
    blocks = [0] * n_layers
    rank_ops = ops.get(rank)
    top = _top_ops(rank_ops, start, end) if rank_ops is not None else None
    if top is None or not len(top):
        return blocks
    layer_of = by_seq.get(rank, {})
    layers = [layer_of.get(int(s), -1) for s in top["seq"].tolist()]
    known = [k for k in layers if k >= 0]
    if not known:
        return None
    current = known[0]
    bounds = [start, *top["start_ns"].astype(np.int64).tolist()[1:], end]
    for k, layer in enumerate(layers):
        if layer >= 0:
            current = layer
        blocks[min(current, n_layers - 1)] += bounds[k + 1] - bounds[k]
    return blocks


# ---------------------------------------------------------------------------------------
# --layer-costs FILE
# ---------------------------------------------------------------------------------------
def read_layer_costs(path: str | Path) -> LayerCosts:
    """A user's per-layer costs, one microbatch at the measured size, in model order:

    - JSON: ``{"layers": [{"forward_ns": 3300000, "backward_ns": 6600000}, ...]}`` (a bare
      list of those objects works too);
    - CSV: a header ``layer,forward_ns,backward_ns`` and one row per layer (``layer`` 0..L-1,
      in any row order).

    Anything else is a TracekitError naming the file and what is wrong (one line)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as err:
        raise TracekitError(f"--layer-costs {file}: cannot read it ({err.strerror or err})") from None
    rows = _csv_rows(file, text) if file.suffix.lower() == ".csv" else _json_rows(file, text)
    if not rows:
        raise TracekitError(f"--layer-costs {file}: no layers in it")
    layers = []
    for i, (fwd, bwd) in enumerate(rows):
        if fwd < 0 or bwd < 0 or fwd + bwd <= 0:
            raise TracekitError(f"--layer-costs {file}: layer {i} needs forward_ns, backward_ns >= 0, not both 0")
        layers.append(LayerCost(i, fwd, bwd, None, 0))
    return LayerCosts(layers, "file", str(file), None)


def _number(file: Path, where: str, value: object) -> int:
    try:
        number = float(value)  # type: ignore[arg-type]  # checked: a bad value is the user's error
    except (TypeError, ValueError):
        raise TracekitError(f"--layer-costs {file}: {where} is {value!r}, not a number of ns") from None
    if not np.isfinite(number):
        raise TracekitError(f"--layer-costs {file}: {where} is {value!r}, not a number of ns")
    return int(round(number))


def _json_rows(file: Path, text: str) -> list[tuple[int, int]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise TracekitError(f"--layer-costs {file}: not JSON ({err.msg} at line {err.lineno}); see --help") from None
    items = doc.get("layers") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise TracekitError(f'--layer-costs {file}: expected {{"layers": [{{"forward_ns": ..., "backward_ns": ...}}]}}')
    return [
        (
            _number(file, f"layer {i} forward_ns", item.get("forward_ns")),
            _number(file, f"layer {i} backward_ns", item.get("backward_ns")),
        )
        for i, item in enumerate(items)
    ]


def _csv_rows(file: Path, text: str) -> list[tuple[int, int]]:
    reader = csv.DictReader(text.splitlines())
    need = {"layer", "forward_ns", "backward_ns"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise TracekitError(f"--layer-costs {file}: the CSV header must name layer,forward_ns,backward_ns")
    by_layer: dict[int, tuple[int, int]] = {}
    for row in reader:
        layer = _number(file, "a layer column", row["layer"])
        if layer in by_layer:
            raise TracekitError(f"--layer-costs {file}: layer {layer} is given twice")
        by_layer[layer] = (
            _number(file, f"layer {layer} forward_ns", row["forward_ns"]),
            _number(file, f"layer {layer} backward_ns", row["backward_ns"]),
        )
    if sorted(by_layer) != list(range(len(by_layer))):
        raise TracekitError(f"--layer-costs {file}: the layers must be numbered 0..{len(by_layer) - 1}, each once")
    return [by_layer[i] for i in range(len(by_layer))]
