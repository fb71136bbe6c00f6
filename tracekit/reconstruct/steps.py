"""Training steps: ``ProfilerStep#N`` spans on each rank's main thread."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.model.names import STEP_MARK_PREFIX
from tracekit.model.run import STEP_COLUMNS

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


def find_steps(events: pd.DataFrame) -> pd.DataFrame:
    """One row per rank and step. A rank with no step markers is one step (number 0)
    spanning all of its events."""
    is_mark = ((events["cat"] == "user_annotation") & ~events["on_gpu"]).to_numpy()
    is_mark = is_mark & events["name"].str.startswith(STEP_MARK_PREFIX).to_numpy(dtype=bool)
    marks = events.loc[is_mark, ["rank", "name", "start_ns", "end_ns"]]
    rows = []
    for row in marks.itertuples(index=False):
        match = _STEP_NAME.match(row.name)
        if match:
            rows.append((int(row.rank), int(match.group(1)), int(row.start_ns), int(row.end_ns)))
    marked = set(marks["rank"].tolist())
    ranks = events["rank"].to_numpy()
    for rank in np.unique(ranks):
        if int(rank) not in marked:
            mine = ranks == rank
            rows.append(
                (
                    int(rank),
                    0,
                    int(events["start_ns"].to_numpy()[mine].min()),
                    int(events["end_ns"].to_numpy()[mine].max()),
                )
            )
    steps = pd.DataFrame(rows, columns=STEP_COLUMNS[:4])
    steps["n_actions"] = 0
    return steps.sort_values(["rank", "step"]).reset_index(drop=True)


def step_of(ranks: np.ndarray, times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step number each (rank, time) falls in (the earlier step where two touch); -1
    outside every step."""
    out = np.full(len(times), -1, dtype=np.int64)
    for row in steps.iloc[::-1].itertuples(index=False):
        out[(ranks == row.rank) & (times >= row.step_start_ns) & (times <= row.step_end_ns)] = row.step
    return out
