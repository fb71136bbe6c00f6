"""The data model every stage shares: ingest -> reconstruct -> analyze -> render.

``events`` (the normalised event table and per-file facts) and ``run`` (the reconstructed
pipeline). Names load on first use, so a parser process that needs only ``TraceFile``
does not import pandas.
"""

_WHERE = {
    "EVENT_COLUMNS": "events",
    "EVENT_SCHEMA": "events",
    "TraceFile": "events",
    "empty_events": "events",
    "Run": "run",
    "ScheduleInfo": "run",
    "ACTION_COLUMNS": "run",
    "MESSAGE_COLUMNS": "run",
    "STEP_COLUMNS": "run",
    "COMM_PREFIXES": "names",
    "SEND_NAMES": "names",
    "RECV_NAMES": "names",
    "STEP_MARK_PREFIX": "names",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
