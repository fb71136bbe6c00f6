"""The data model every stage shares: ingest -> reconstruct -> analyze -> render."""
from tracekit.model.events import EVENT_COLUMNS, EVENT_SCHEMA, TraceFile, empty_events
from tracekit.model.run import ACTION_COLUMNS, MESSAGE_COLUMNS, STEP_COLUMNS, Run, ScheduleInfo

__all__ = ["EVENT_COLUMNS", "EVENT_SCHEMA", "TraceFile", "empty_events", "Run", "ScheduleInfo", "ACTION_COLUMNS", "MESSAGE_COLUMNS", "STEP_COLUMNS"]
