"""The report's what-if: the default targets, as is and at their ideal balance, and the best
split of the layers (what ``tracekit whatif --balanced`` recommends), within a budget of
replays. Apart from :mod:`tracekit.analyze.whatif` (which predicts) and
:mod:`tracekit.analyze.split` (which searches splits with it), as it uses both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracekit.analyze.costs import CostModel, cost_model
from tracekit.analyze.layers import layer_costs_from_trace
from tracekit.analyze.replay import StepGraph
from tracekit.analyze.split import SplitSearch, default_split_target, search_split
from tracekit.analyze.whatif import DEFAULT_SAMPLES, Prediction, WhatIf, default_targets, replays_within, what_if
from tracekit.errors import TracekitError
from tracekit.model.run import Run

if TYPE_CHECKING:
    import pandas as pd

# The report's what-if: each default target twice (as is and at its ideal balance), and the
# best split of the layers, within about this many replayed actions in all; as many replays
# a row as tracekit whatif makes where that fits, so that a row of both has one figure.
REPORT_REPLAY_BUDGET = 1_000_000
REPORT_REPLAYS = DEFAULT_SAMPLES
# Fewer replays per row than this say too little about the spread to be worth a table.
REPORT_MIN_REPLAYS = 4


@dataclass(frozen=True)
class ReportWhatIf:
    """The what-if table of a report (the default targets, as is and at their ideal balance,
    and the best split of the layers: ``tracekit whatif --balanced``), or why there is none:
    ``note`` says what a reader of the report should know instead, ``split_note`` why the
    best split is missing."""

    result: WhatIf | None
    note: str = ""
    split: SplitSearch | None = None
    split_note: str = ""

    @property
    def split_prediction(self) -> Prediction | None:
        """The best split's replayed bubble and step, or None where there is none."""
        return self.split.recommended.prediction if self.split is not None else None

    @property
    def rows(self) -> list[Prediction]:
        """Every prediction of the table, the best split last."""
        if self.result is None:
            return []
        split = self.split_prediction
        return [*self.result.predictions, *([split] if split is not None else [])]

    @property
    def best(self) -> list[Prediction]:
        """The fastest configuration and the best split of the layers, the shorter step first."""
        if self.result is None:
            return []
        return sorted(
            (p for p in (self.result.fastest, self.split_prediction) if p is not None), key=lambda p: p.step_ns
        )


def report_what_if(
    run: Run, graphs: list[StepGraph], bubbles: pd.DataFrame, progress: Callable[[str], None] | None = None
) -> ReportWhatIf:
    """The default what-if with ideal balance rows, and the best split of the layers on the
    configuration ``tracekit whatif --balanced`` searches, on the step graphs the attribution
    replayed; a run that cannot be varied gets the reason instead."""
    try:
        model = cost_model(run, graphs)
    except TracekitError as err:
        return ReportWhatIf(None, f"What if: not computed: {err}")
    targets = default_targets(model)
    samples = replays_within(REPORT_REPLAY_BUDGET, model.p, targets, rows_per_target=2, most=REPORT_REPLAYS)
    if samples < REPORT_MIN_REPLAYS:
        return ReportWhatIf(
            None,
            f"What if: not computed here: {model.p} ranks and m={model.m} are too large "
            f"to replay {REPORT_MIN_REPLAYS} times per row within the report's budget; "
            "run tracekit whatif with the targets you want",
        )
    try:
        result = what_if(run, targets, samples=samples, balanced=True, model=model, bubbles=bubbles, progress=progress)
    except TracekitError as err:
        return ReportWhatIf(None, f"What if: not computed: {err}")
    split, split_note = _best_split(run, model, samples, progress)
    return ReportWhatIf(result, split=split, split_note=split_note)


def _best_split(
    run: Run, model: CostModel, samples: int, progress: Callable[[str], None] | None
) -> tuple[SplitSearch | None, str]:
    """The split search ``tracekit whatif --balanced`` makes (its target, layer costs from the
    run's ops), or None and why not."""
    try:
        layers = layer_costs_from_trace(run)
        schedule, v, m = default_split_target(model)
        if progress:
            progress(f"what-if: the best split of the layers for {schedule} v={v} m={m}")
        return search_split(model, layers, schedule, v, m, samples=samples), ""
    except TracekitError as err:
        return None, f"Best split of the layers (tracekit whatif --balanced): not computed here: {err}"
