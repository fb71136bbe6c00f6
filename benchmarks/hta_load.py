"""Load a run folder with HolisticTraceAnalysis (run in the venv that has HTA installed).

Prints one JSON line: the seconds ``TraceAnalysis(trace_dir=...)`` took (HTA's import
excluded) and how many events it kept. Used by ``bench.py`` as a subprocess so each tool's
process tree is measured alone.
"""

import json
import logging
import sys
import time

logging.disable(logging.WARNING)  # HTA logs a line per file at WARNING

from hta.trace_analysis import TraceAnalysis  # noqa: E402

started = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
load_s = time.perf_counter() - started
rows = sum(len(df) for df in analysis.t.get_all_traces().values())
print(json.dumps({"load_s": load_s, "rows": rows, "ranks": len(analysis.t.get_all_traces())}))
