"""``python -m tracekit.schemas``: write the analysis schema with the registered idle causes."""

from tracekit.schemas import ANALYSIS_SCHEMA_PATH, analysis_schema_text

ANALYSIS_SCHEMA_PATH.write_text(analysis_schema_text())
print(f"wrote {ANALYSIS_SCHEMA_PATH}")
