"""The CI gate: limits and baselines that ``tracekit check`` holds a run to.

``config`` reads the limits (flags, ``[tool.tracekit.check]``), ``baseline`` reads and
writes baseline files, and ``checks`` compares a run's measures
(:func:`tracekit.analyze.compare.measure`) with both; result files are written through
:mod:`tracekit.output`. Renderers for CI systems live in :mod:`tracekit.render.junit` and
:mod:`tracekit.render.markdown`.
"""

from tracekit.gate.checks import Check, GateResult, evaluate
from tracekit.gate.config import CheckConfig, find_config, load_config, with_flags

__all__ = ["Check", "CheckConfig", "GateResult", "evaluate", "find_config", "load_config", "with_flags"]
