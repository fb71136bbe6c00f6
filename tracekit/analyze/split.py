"""The best contiguous split of a model's layers over the pipeline's p·v stages.

From per-layer costs (:mod:`tracekit.analyze.layers`), one microbatch's forward + backward
per layer:

1. **Dynamic programming** finds the smallest possible cost of the slowest stage over every
   contiguous split into S stages (each stage at least one layer), then, among the splits
   that reach it, the one with the smallest sum of squared stage costs (the evenest rest: a
   step is not only its slowest stage, the fill and drain run through every stage). Every
   contiguous split into S stages has the same S-1 boundary messages, so messages break no
   ties here.
2. The **candidates**: every split whose slowest stage is within ``slack`` of that optimum
   (enumerated depth-first, never into a prefix the rest cannot complete, at most
   ``MAX_ENUMERATED``), best first by (slowest stage, sum of squares), the few best kept
   after the DP's own; plus the measured split and the even one as references.
3. Each candidate is **replayed** (:func:`tracekit.analyze.whatif.predict` with per-stage
   compute: the run's own cost samples rescaled to the candidate's stage costs), since a step
   is a max over paths that the slowest stage alone does not decide. The recommended split
   is the one with the shortest predicted step, references included (every split is
   replayed with the same draws, so the comparison is paired).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tracekit.analyze.layers import LayerCosts
from tracekit.analyze.costs import CostModel
from tracekit.analyze.whatif import Prediction, check_target, predict
from tracekit.errors import TracekitError
from tracekit.model import schedules as traits

#: schedules a split is replayed on: their actions are F and B, whose per-stage costs the layer
#: costs give (zero-bubble targets would need each layer's I and W apart: not read yet)
SPLIT_TARGETS = traits.names(generated=True, split_backward=False)
#: candidates replayed besides the references (measured and even split)
DEFAULT_CANDIDATES = 4
#: splits whose slowest stage is within this share of the optimum are candidates
DEFAULT_SLACK = 0.10
#: the enumeration of near-optimal splits stops after this many (in its depth-first order, so a
#: long model's list is a sample of them; the exact optimum is always a candidate besides)
MAX_ENUMERATED = 2_000


def split_cost(costs: Sequence[int], split: Sequence[int]) -> list[int]:
    """The cost of each stage of ``split`` (layers per stage, in order)."""
    out, first = [], 0
    for n in split:
        out.append(sum(costs[first : first + n]))
        first += n
    return out


def best_bottleneck(costs: Sequence[int], n_stages: int) -> int:
    """The smallest slowest-stage cost over all contiguous splits of ``costs`` into
    ``n_stages`` non-empty stages (dynamic programming, O(S·L²))."""
    n = len(costs)
    _check(n, n_stages)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j]: the smallest bottleneck of the first j layers in s stages (s the loop's count)
    best: list[float] = [inf] * (n + 1)
    best[0] = 0
    for s in range(1, n_stages + 1):
        nxt: list[float] = [inf] * (n + 1)
        for j in range(s, n - (n_stages - s) + 1):
            for i in range(j - 1, s - 2, -1):  # the last stage grows as its first layer moves left
                stage = prefix[j] - prefix[i]
                if stage >= nxt[j]:
                    break  # every longer last stage costs at least this much
                nxt[j] = min(nxt[j], max(best[i], stage))
        best = nxt
    return int(best[n])


def best_split(costs: Sequence[int], n_stages: int) -> list[int]:
    """The contiguous split (layers per stage) with the smallest slowest stage and, among
    those, the smallest sum of squared stage costs (exact: a second DP under that bound)."""
    bound = best_bottleneck(costs, n_stages)
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # score[s][j]: the smallest sum of squares of the first j layers in s stages, each <= bound
    score = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[-1] * (n + 1) for _ in range(n_stages + 1)]
    score[0][0] = 0
    for s in range(1, n_stages + 1):
        for j in range(s, n - (n_stages - s) + 1):
            for i in range(j - 1, s - 2, -1):
                stage = prefix[j] - prefix[i]
                if stage > bound:
                    break  # longer last stages only cost more
                if score[s - 1][i] == inf:
                    continue
                total = score[s - 1][i] + stage * stage
                if total < score[s][j]:
                    score[s][j], cut[s][j] = total, i
    split, j = [], n
    for s in range(n_stages, 0, -1):
        i = cut[s][j]
        split.append(j - i)
        j = i
    return split[::-1]


def near_optimal_splits(
    costs: Sequence[int], n_stages: int, slack: float = DEFAULT_SLACK, most: int = MAX_ENUMERATED
) -> list[list[int]]:
    """Every contiguous split whose slowest stage is within ``slack`` of the optimum (at most
    ``most`` of them), best first by (slowest stage, sum of squared stage costs)."""
    bound = best_bottleneck(costs, n_stages) * (1 + slack)
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # fits[s][i]: layers i.. split into s stages within the bound (so the walk never backtracks)
    fits = [[False] * (n + 1) for _ in range(n_stages + 1)]
    fits[0][n] = True
    for s in range(1, n_stages + 1):
        for i in range(n - s, -1, -1):
            for end in range(i + 1, n - s + 2):
                if prefix[end] - prefix[i] > bound:
                    break
                if fits[s - 1][end]:
                    fits[s][i] = True
                    break
    found: list[list[int]] = []
    stack: list[tuple[int, int, list[int]]] = [(0, n_stages, [])]  # depth-first, first stages smallest first
    while stack and len(found) < most:
        first, left, acc = stack.pop()
        if left == 0:
            found.append(acc)
            continue
        ends = []
        for end in range(first + 1, n - left + 2):
            if prefix[end] - prefix[first] > bound:
                break
            if fits[left - 1][end]:
                ends.append(end)
        stack.extend((end, left - 1, [*acc, end - first]) for end in reversed(ends))

    def key(split: list[int]) -> tuple[int, int]:
        stages = split_cost(costs, split)
        return max(stages), sum(c * c for c in stages)

    return sorted(found, key=key)


def _check(n_layers: int, n_stages: int) -> None:
    if n_stages < 1 or n_layers < n_stages:
        raise TracekitError(f"{n_layers} layers cannot fill {n_stages} stages (each stage needs at least one layer)")


def ranges(split: Sequence[int]) -> list[str]:
    """``[6, 4, 3, 3]`` -> ``["0-5", "6-9", "10-12", "13-15"]`` (one layer: ``"7"``)."""
    out, first = [], 0
    for n in split:
        out.append(f"{first}-{first + n - 1}" if n > 1 else str(first))
        first += n
    return out


def default_split_target(model: CostModel) -> tuple[str, int, int]:
    """The (schedule, v, m) a split is searched for when none is asked for: the measured
    configuration where a split can be replayed on it, else 1F1B at the measured m."""
    if model.schedule in SPLIT_TARGETS:
        try:
            check_target(model, model.schedule, model.v, model.m)
            return model.schedule, model.v, model.m
        except TracekitError:
            pass
    return "1F1B", 1, model.m


@dataclass(frozen=True)
class SplitCandidate:
    """One split, its stage costs and its replayed bubble and step time."""

    split: list[int]
    role: str  # "recommended" | "candidate" | "given" (a --split) | "reference" (measured / even only)
    stage_ns: list[int]  # F + B of one microbatch per stage (the layer costs' sums)
    prediction: Prediction
    matches: tuple[str, ...] = ()  # which references it equals: "measured", "even"

    @property
    def slowest_stage_ns(self) -> int:
        """The bottleneck: its slowest stage's F + B of one microbatch."""
        return max(self.stage_ns)

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "split": list(self.split),
            "ranges": ranges(self.split),
            "role": self.role,
            "matches": list(self.matches),
            "stage_ns": list(self.stage_ns),
            "max_stage_ns": self.slowest_stage_ns,
            "bubble_ratio": p.bubble_ratio,
            "bubble_sd": p.bubble_sd,
            "step_ns": int(round(p.step_ns)),
            "step_sd_ns": int(round(p.step_sd)),
        }


@dataclass(frozen=True)
class SplitSearch:
    """The splits scored for one target (schedule, v, m)."""

    schedule: str
    v: int
    m: int
    optimum_bottleneck_ns: int  # the DP's smallest slowest stage
    candidates: list[SplitCandidate]  # the recommendation first, then by predicted step

    @property
    def recommended(self) -> SplitCandidate:
        return self.candidates[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "v": self.v,
            "m": self.m,
            "optimum_max_stage_ns": self.optimum_bottleneck_ns,
            "recommended": self.recommended.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def stage_costs(layers: LayerCosts, split: Sequence[int]) -> dict[tuple[int, str], float]:
    """(stage, kind) -> one microbatch's compute of that stage, for ``predict``."""
    out: dict[tuple[int, str], float] = {}
    fwd = split_cost([c.forward_ns for c in layers.layers], split)
    bwd = split_cost([c.backward_ns for c in layers.layers], split)
    for s, (f, b) in enumerate(zip(fwd, bwd)):
        out[(s, "F")], out[(s, "B")] = float(f), float(b)
    return out


def check_split(layers: LayerCosts, split: Sequence[int], n_stages: int, what: str = "--split") -> None:
    """A one-line TracekitError for a split that does not fit the model and the stages."""
    given = ",".join(str(n) for n in split)
    if len(split) != n_stages:
        raise TracekitError(f"{what} {given}: {len(split)} stages, but the target has p*v = {n_stages}")
    if any(n < 1 for n in split):
        raise TracekitError(f"{what} {given}: every stage needs at least one layer")
    if sum(split) != len(layers.layers):
        raise TracekitError(
            f"{what} {given} holds {sum(split)} layers; the model has {layers.found()}: a split moves whole "
            f"layers, {n_stages} counts summing to {len(layers.layers)}"
        )


def score(
    model: CostModel,
    layers: LayerCosts,
    split: Sequence[int],
    schedule: str,
    v: int,
    m: int,
    role: str,
    keep: str = "global-batch",
    samples: int = 32,
    seed: int = 0,
) -> SplitCandidate:
    """Replay ``schedule`` with the stages of ``split``."""
    if schedule not in SPLIT_TARGETS:
        raise TracekitError(
            f"{schedule}: a split is replayed on {', '.join(SPLIT_TARGETS)} (forward and full backward "
            "per layer); choose one of those with -s"
        )
    check_split(layers, split, model.p * v)
    costs = stage_costs(layers, split)
    label = f"{schedule} v={v} m={m} split {_commas(split)}"
    prediction = predict(model, schedule, v, m, keep, samples, seed, stage_costs=costs, label=label)
    totals = [int(costs[(s, "F")] + costs[(s, "B")]) for s in range(len(split))]
    return SplitCandidate(list(split), role, totals, prediction)


def search_split(
    model: CostModel,
    layers: LayerCosts,
    schedule: str,
    v: int,
    m: int,
    keep: str = "global-batch",
    samples: int = 32,
    seed: int = 0,
    n_candidates: int = DEFAULT_CANDIDATES,
    slack: float = DEFAULT_SLACK,
) -> SplitSearch:
    """The best split of ``layers`` for ``schedule`` at ``v`` and ``m`` (see the module doc)."""
    check_target(model, schedule, v, m)
    if schedule not in SPLIT_TARGETS:
        raise TracekitError(
            f"{schedule}: the split search replays {', '.join(SPLIT_TARGETS)} (forward and full backward "
            "per layer); choose one of those with -s"
        )
    n_stages = model.p * v
    totals = [c.total_ns for c in layers.layers]
    _check(len(totals), n_stages)
    optimum = best_bottleneck(totals, n_stages)
    chosen: list[list[int]] = [best_split(totals, n_stages)]
    for split in near_optimal_splits(totals, n_stages, slack):
        if len(chosen) >= n_candidates:
            break
        if split not in chosen:
            chosen.append(split)
    references: dict[tuple[int, ...], list[str]] = {}
    if layers.measured_split is not None and len(layers.measured_split) == n_stages:
        references.setdefault(tuple(layers.measured_split), []).append("measured")
    if len(totals) % n_stages == 0:
        references.setdefault((len(totals) // n_stages,) * n_stages, []).append("even")
    scored = [score(model, layers, s, schedule, v, m, "candidate", keep, samples, seed) for s in chosen]
    for reference in references:
        if list(reference) not in chosen:
            scored.append(score(model, layers, reference, schedule, v, m, "reference", keep, samples, seed))
    # the fastest replayed step wins, a reference too: a split that replays slower than the
    # measured one is no recommendation (the slowest stage does not decide the step alone)
    best = min(scored, key=lambda c: c.prediction.step_ns)
    ordered = [best, *sorted((c for c in scored if c is not best), key=lambda c: c.prediction.step_ns)]
    out = [replace(c, matches=tuple(references.get(tuple(c.split), ()))) for c in ordered]
    out[0] = replace(
        out[0],
        role="recommended",
        prediction=replace(best.prediction, label=f"{schedule} v={v} m={m} best split {_commas(best.split)}"),
    )
    return SplitSearch(schedule, v, m, optimum, out)


@dataclass(frozen=True)
class SplitReport:
    """What ``tracekit whatif --balanced`` / ``--split`` adds: the layer costs used, the best
    split per target and the given splits' predictions."""

    layers: LayerCosts
    searches: list[SplitSearch]  # --balanced: one per target
    given: list[SplitCandidate]  # --split: each given split on each target it fits
    assumptions: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer_costs": self.layers.to_dict(),
            "searches": [s.to_dict() for s in self.searches],
            "given": [
                {"schedule": c.prediction.schedule, "v": c.prediction.v, "m": c.prediction.m, **c.to_dict()}
                for c in self.given
            ],
            "assumptions": list(self.assumptions),
        }


def split_report(
    model: CostModel,
    layers: LayerCosts,
    targets: Sequence[tuple[str, int, int]],
    search: bool,
    given: Sequence[Sequence[int]] = (),
    keep: str = "global-batch",
    samples: int = 32,
    seed: int = 0,
) -> SplitReport:
    """The split search (``search``) and the ``given`` splits on each target (schedule, v, m);
    a given split is predicted on the targets with as many stages as it has, and one that
    fits none is a TracekitError."""
    searches = [search_split(model, layers, s, v, m, keep, samples, seed) for s, v, m in targets] if search else []
    predicted: list[SplitCandidate] = []
    for split in given:
        fits = [(s, v, m) for s, v, m in targets if model.p * v == len(split)]
        if not fits:
            stages = sorted({model.p * v for _, v, _ in targets})
            raise TracekitError(
                f"--split {','.join(str(n) for n in split)} has {len(split)} stages; the targets have "
                f"p*v = {', '.join(str(n) for n in stages)} (choose -v to match)"
            )
        for s, v, m in fits:
            predicted.append(score(model, layers, split, s, v, m, "given", keep, samples, seed))
    assumptions = [
        f"layer costs: {layers.found()} ({layers.detail}); one microbatch at the measured m, mean of "
        f"{min((c.samples for c in layers.layers), default=0) or 'the file'}"
        + (" actions each" if layers.source != "file" else ""),
        "best split: the smallest slowest stage (F+B of one microbatch) by dynamic programming, ties "
        "by the smallest sum of squared stage costs; the near-optimal splits replayed, the fastest step "
        "recommended",
        "a split's stages replayed with each rank's measured cost samples rescaled to the stage's "
        "layer costs (relative spread, overheads and message latencies as measured)",
    ]
    return SplitReport(layers, searches, predicted, assumptions)


def _commas(split: Sequence[int]) -> str:
    return ",".join(str(n) for n in split)


def parse_split(text: str) -> list[int]:
    """``"5,3,4,4"`` -> ``[5, 3, 4, 4]``, else a one-line TracekitError."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise TracekitError(
            f"--split {text!r}: a split moves whole layers; give layer counts per stage separated by commas, "
            "e.g. 5,3,4,4"
        ) from None
