"""Per-layer compute: what each layer of the model costs, forward and backward, per microbatch.

Two sources, each figure saying which it came from:

- ``"op-pattern"``: the repeating top-level ops inside each action. A layer runs the same
  ops every time (``aten::linear``, the activation, its autograd functions), so inside one
  stage's forwards the op names that occur the same number of times in every action, carrying
  most of the time, occur once per layer: that count is the stage's layer count, and the
  first such op of each layer (its *anchor*) starts it. Ranges count as ops, and numbers in
  names are blanked first, so per-layer labels (``linear3(F)``) repeat like any op. Layer ``k`` of an action is the span
  from its anchor to the next one (the first layer from the action's start, the last to its
  end), so the layers of an action add up to its compute span, gaps and extra ops (the loss
  on the last stage) included. Backwards run the layers in reverse: the ``k``-th block of a
  backward is the stage's layer ``n-1-k``. Where the run split its backwards, a layer's
  backward is its input-grad plus weight-grad block (a kind whose actions hold no repeating
  ops, e.g. torch's empty input-grad on stage 0, adds nothing). Each figure is the mean
  over the microbatches and steps: means add up, so a stage's layers sum to its actions'
  mean compute (a median of sums is not the sum of medians, and the replay rescales means).
- ``"file"``: a user's ``--layer-costs FILE`` (see :func:`read_layer_costs`).

Both give the costs at the measured microbatch size, in ns.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.errors import TracekitError
from tracekit.model.run import Run

SOURCES = ("op-pattern", "file")
_NUMBER = r"\d+"
# Where the per-layer op counts disagree, the count carrying the most time must hold at
# least this share of the action's top-level op time to be read as layers.
MIN_ANCHOR_SHARE = 0.5


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
    detail: str  # how: the anchor ops, or the file's path
    measured_split: list[int] | None  # layers per measured stage, where known

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "detail": self.detail,
            "measured_split": self.measured_split,
            "layers": [c.to_dict() for c in self.layers],
        }


def layer_costs_from_ops(run: Run) -> LayerCosts:
    """Per-layer costs of ``run`` from the repeating ops inside its actions (see the module
    doc); a TracekitError says why where the ops show no layers."""
    actions = run.actions[run.actions["step"] >= 0]
    if not len(actions):
        raise TracekitError(f"{run.source}: no actions in the profiled steps; no layers to read")
    ops = _host_ops(run.events)
    by_stage: dict[int, dict[str, list[list[int]]]] = {}  # stage -> kind -> per action: block ns
    anchors: dict[str, str] = {}
    for key, group in actions.groupby(["stage", "kind"], sort=True):
        stage_id, kind_name = key
        found = _blocks_of(ops, group)
        if found is None:
            continue
        per_action, anchor = found
        by_stage.setdefault(int(str(stage_id)), {})[str(kind_name)] = per_action
        anchors.setdefault(str(kind_name), anchor)
    stages = sorted(int(s) for s in actions["stage"].unique())
    costs: list[LayerCost] = []
    split: list[int] = []
    for stage in stages:
        kinds = by_stage.get(stage, {})
        if "F" not in kinds:
            raise TracekitError(
                f"{run.source}: stage {stage}'s forwards show no repeating ops (no layers to read); "
                "give the layer costs with --layer-costs FILE"
            )
        forward = kinds["F"]
        n = len(forward[0])
        backward = np.zeros(n)
        backward_samples = 0
        for kind in ("B", "I", "W"):
            if kind not in kinds:
                continue
            blocks = kinds[kind]
            if len(blocks[0]) != n:
                raise TracekitError(
                    f"{run.source}: stage {stage}'s forwards repeat {n} times but its {kind} actions "
                    f"{len(blocks[0])} times; give the layer costs with --layer-costs FILE"
                )
            backward += np.mean(np.array(blocks), axis=0)[::-1]  # backwards run the layers in reverse
            backward_samples = max(backward_samples, len(blocks))
        if not backward_samples:
            raise TracekitError(
                f"{run.source}: stage {stage}'s backwards show no repeating ops; "
                "give the layer costs with --layer-costs FILE"
            )
        fwd = np.mean(np.array(forward), axis=0)
        for k in range(n):
            costs.append(
                LayerCost(
                    len(costs), int(round(fwd[k])), int(round(backward[k])), stage, min(len(forward), backward_samples)
                )
            )
        split.append(n)
    detail = "layers = blocks of the repeating top-level ops in each action, starting at " + ", ".join(
        f"{_short(name)} ({kind})" for kind, name in sorted(anchors.items())
    )
    return LayerCosts(costs, "op-pattern", detail, split)


def _short(name: str) -> str:
    return name.removeprefix("autograd::engine::evaluate_function: ")


def _host_ops(events: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """Per rank, its main thread's host ops and ranges (``cpu_op``, ``user_annotation``), by
    start time, with their names' numbers blanked (``linear3(F)`` -> ``linear#(F)``): a
    per-layer range or module name repeats once per layer only without its index."""
    host = events["cat"].isin(["cpu_op", "user_annotation"]) & (~events["on_gpu"])
    ev = events[host & (events["tid"] == events["pid"])]
    ev = ev[["rank", "name", "start_ns", "end_ns", "depth"]].sort_values(["rank", "start_ns"], kind="stable")
    ev = ev.assign(name=ev["name"].astype(str).str.replace(_NUMBER, "#", regex=True))
    return {int(str(r)): g.reset_index(drop=True) for r, g in ev.groupby("rank", sort=True)}


def _top_ops(ops: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """The outermost ops that lie inside [start_ns, end_ns]."""
    starts = ops["start_ns"].to_numpy()
    lo, hi = np.searchsorted(starts, start_ns, "left"), np.searchsorted(starts, end_ns, "right")
    inside = ops.iloc[lo:hi]
    inside = inside[inside["end_ns"] <= end_ns]
    if not len(inside):
        return inside
    top: pd.DataFrame = inside[inside["depth"] == inside["depth"].min()]
    return top


def _blocks_of(ops: dict[int, pd.DataFrame], group: pd.DataFrame) -> tuple[list[list[int]], str] | None:
    """The per-layer block durations of every action in ``group`` (one stage and kind) and the
    anchor op's name, or None where the actions show no repeating ops."""
    tops = []
    for rank, start, end in zip(group["rank"].tolist(), group["start_ns"].tolist(), group["end_ns"].tolist()):
        rank_ops = ops.get(int(rank))
        if rank_ops is None:
            return None
        top = _top_ops(rank_ops, int(start), int(end))
        if not len(top):
            return None
        tops.append((top, int(start), int(end)))
    anchor = _anchor([t for t, _, _ in tops])
    if anchor is None:
        return None
    per_action = []
    for top, start, end in tops:
        at = top.loc[top["name"] == anchor, "start_ns"].to_numpy()
        bounds = [start, *at[1:].tolist(), end]  # the first layer starts with the action
        per_action.append([b - a for a, b in zip(bounds[:-1], bounds[1:])])
    return per_action, anchor


def _anchor(tops: Sequence[pd.DataFrame]) -> str | None:
    """The op that starts every layer: among the names that occur equally often in every action
    (the layers' own ops), the count carrying the most op time is the layer count, and the
    first name in the action's order with that count is the anchor."""
    counts = [Counter(t["name"].tolist()) for t in tops]
    steady = {name: n for name, n in counts[0].items() if all(c.get(name) == n for c in counts[1:])}
    if not steady:
        return None
    first = tops[0]
    time_of = (first["end_ns"] - first["start_ns"]).groupby(first["name"]).sum()
    time_by_count: Counter[int] = Counter()
    for name, n in steady.items():
        time_by_count[n] += int(time_of.get(name, 0))
    n_layers, time_ns = time_by_count.most_common(1)[0]
    if time_ns < MIN_ANCHOR_SHARE * max(1, int(time_of.sum())):
        return None
    for name in first["name"].tolist():
        if steady.get(name) == n_layers:
            return str(name)
    return None


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
