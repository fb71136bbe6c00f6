"""HolisticTraceAnalysis's temporal breakdown of run folders (run in the venv that has HTA).

Prints one JSON line: for each folder given, HTA's ``get_temporal_breakdown`` per rank
(idle, compute, non-compute and kernel time, in HTA's microseconds), loaded with
``include_last_profiler_step=True`` so that the last step counts too. Used by
``hta_compare.py`` as a subprocess: HTA is never a dependency of tracekit.
"""

import json
import logging
import sys

logging.disable(logging.WARNING)  # HTA logs a line per file at WARNING

from hta.trace_analysis import TraceAnalysis  # noqa: E402

out = {}
for folder in sys.argv[1:]:
    try:
        analysis = TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
        table = analysis.get_temporal_breakdown(visualize=False)
        out[folder] = [
            {
                "rank": int(r["rank"]),
                "idle_us": float(r["idle_time(us)"]),
                "compute_us": float(r["compute_time(us)"]),
                "non_compute_us": float(r["non_compute_time(us)"]),
                "kernel_us": float(r["kernel_time(us)"]),
            }
            for r in table.to_dict("records")
        ]
    except Exception as exc:  # one folder HTA cannot read must not hide the others
        out[folder] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
print(json.dumps(out))
