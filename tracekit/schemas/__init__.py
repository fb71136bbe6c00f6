"""The JSON documents' schemas (the files beside this module) and the versions they carry.

Bump ``ANALYSIS_SCHEMA_VERSION`` on any change to ``tracekit analyze --json`` that removes
or renames a field; adding fields is a minor change (``1.x``). Baseline files record it.
"""

ANALYSIS_SCHEMA_VERSION = "1.7"
