"""The JSON documents' schemas (the files beside this module) and the versions they carry.

Bump ``ANALYSIS_SCHEMA_VERSION`` on any change to ``tracekit analyze --json`` that removes
or renames a field; adding fields is a minor change (``1.x``). Baseline files record it.

The analysis schema's idle causes (``$defs/causes``) are those of :data:`tracekit.vocab.IDLE_CAUSES`:
:func:`analysis_schema` fills them in, and ``python -m tracekit.schemas`` writes the file
with them (tests/test_causes.py fails while the file is behind the registry).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracekit.vocab import IDLE_CAUSES

ANALYSIS_SCHEMA_VERSION = "1.7"
ANALYSIS_SCHEMA_PATH = Path(__file__).with_name("analysis.schema.json")


def cause_schema() -> dict[str, Any]:
    """The schema of a rank's idle by cause: one non-negative integer per registered cause."""
    columns = [c.column for c in IDLE_CAUSES]
    return {
        "type": "object",
        "required": columns,
        "additionalProperties": False,
        "properties": {column: {"type": "integer", "minimum": 0} for column in columns},
    }


def analysis_schema() -> dict[str, Any]:
    """The schema of ``tracekit analyze --json``, its causes those registered now."""
    schema: dict[str, Any] = json.loads(ANALYSIS_SCHEMA_PATH.read_text())
    schema["$defs"]["causes"] = cause_schema()
    return schema


def analysis_schema_text() -> str:
    """:func:`analysis_schema` as the file beside this module holds it."""
    return json.dumps(analysis_schema(), indent=1) + "\n"
