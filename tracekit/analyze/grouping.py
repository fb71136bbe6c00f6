"""Tables grouped or indexed by integer ids (rank, step, stage), with the keys as ints.

pandas-stubs type a groupby key or an index label as ``Hashable`` (a key could be any
label); the columns tracekit groups on are integer ids, so the keys are typed once here
instead of at each call site.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pandas as pd


def int_groups(frame: pd.DataFrame, by: list[str], sort: bool = True) -> Iterator[tuple[tuple[int, ...], pd.DataFrame]]:
    """``frame.groupby(by)``, each key a tuple of ints (one per column in ``by``)."""
    for key, group in frame.groupby(by, sort=sort):
        yield tuple(int(k) for k in cast(tuple[int, ...], key)), group


def int_items(series: pd.Series[Any]) -> Iterator[tuple[int, Any]]:
    """``series.items()`` of a series indexed by one integer id."""
    for key, value in series.items():
        yield int(cast(int, key)), value


def int_idxmax(series: pd.Series[Any]) -> int:
    """``series.idxmax()`` of a series indexed by one integer id."""
    return int(cast(int, series.idxmax()))


def ranks_by_stage(actions: pd.DataFrame) -> dict[int, list[int]]:
    """Stage -> the ranks that run it (one per TP shard and DP replica), each ascending."""
    pairs = actions[["stage", "rank"]].drop_duplicates().sort_values(["stage", "rank"])
    out: dict[int, list[int]] = {}
    for stage, rank in zip(pairs["stage"].tolist(), pairs["rank"].tolist()):
        out.setdefault(int(stage), []).append(int(rank))
    return out
