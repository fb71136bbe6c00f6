"""Events as plain columns: what steps and actions are found from, both in a parser worker
(one rank's parsed file, without pandas: :mod:`.per_rank`) and on the whole run's table.

Numbers are numpy arrays; ``cat`` and ``name`` are int codes into a list of distinct strings
(a parsed file's dictionary encoding, or the table's categorical codes and categories: no
string is copied). A decision on a name (a prefix, a label rule) is made once per distinct
name and looked up by code: a rank has a few thousand rows but a few dozen names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.ingest.columns import EventColumns, row_indices, take_rows

if TYPE_CHECKING:
    import pandas as pd

# The device's own work (kernels, copies, sets); a rank that records any is measured there.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# The CUDA or HIP API calls on the host (cudaLaunchKernel, hipExtLaunchKernel, ...): they link
# device work to the host.
LAUNCH_CATEGORY = "runtime"
_STRING_COLUMNS = ("cat", "name")


@dataclass(frozen=True)
class EventArrays:
    """Rows of events: ``numbers`` by column, ``codes`` and ``values`` for cat and name."""

    numbers: Mapping[str, np.ndarray]
    codes: Mapping[str, np.ndarray]  # "cat" / "name" -> int codes into values
    values: Mapping[str, list[str]]  # "cat" / "name" -> the distinct strings

    @classmethod
    def of(cls, events: pd.DataFrame | EventColumns | EventArrays) -> EventArrays:
        """A parsed file's columns or an events table as arrays, without copying them."""
        if isinstance(events, EventArrays):
            return events
        if isinstance(events, EventColumns):
            return cls(events.numbers, events.codes, events.values)
        import pandas as pd  # an events table: pandas is loaded already

        numbers = {c: events[c].to_numpy() for c in events.columns if c not in _STRING_COLUMNS}
        codes, values = {}, {}
        for col in _STRING_COLUMNS:
            if col not in events.columns:  # a table of some columns only (tests build such)
                continue
            strings = events[col]
            if not isinstance(strings.dtype, pd.CategoricalDtype):
                strings = strings.astype("category")
            codes[col] = strings.cat.codes.to_numpy()
            values[col] = [str(v) for v in strings.cat.categories]
        return cls(numbers, codes, values)

    def __len__(self) -> int:
        return len(self.numbers["start_ns"])

    def take(self, rows: np.ndarray) -> EventArrays:
        """The rows ``rows`` (a mask or indices) selects, in order; the strings are shared."""
        rows = row_indices(rows)
        return EventArrays(take_rows(self.numbers, rows), take_rows(self.codes, rows), self.values)

    def __getitem__(self, column: str) -> np.ndarray:
        return self.numbers[column]

    def per_name(self, column: str, decide: Callable[[str], Any], dtype: Any = bool) -> np.ndarray:
        """``decide`` of each row's ``column`` string, called once per distinct string."""
        values = self.values[column]
        if not values:
            return np.zeros(len(self), dtype=dtype)
        decided: np.ndarray = np.array([decide(v) for v in values], dtype=dtype)[self.codes[column]]
        return decided

    def is_in(self, column: str, strings: tuple[str, ...]) -> np.ndarray:
        """Which rows' ``column`` is one of ``strings``."""
        wanted = set(strings)
        return self.per_name(column, wanted.__contains__)

    def starts_with(self, prefixes: str | tuple[str, ...]) -> np.ndarray:
        """Which rows' names start with (one of) ``prefixes``."""
        return self.per_name("name", lambda name: name.startswith(prefixes))

    def names(self, rows: np.ndarray) -> list[str]:
        """The names of ``rows`` (indices), as strings."""
        values = self.values["name"]
        return [values[c] for c in self.codes["name"][rows].tolist()]


def has_device_work(events: EventArrays) -> bool:
    """Whether any row is the device's own work (see :data:`DEVICE_CATEGORIES`)."""
    return bool((events["on_gpu"] & events.is_in("cat", DEVICE_CATEGORIES)).any())
