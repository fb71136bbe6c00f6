"""Baseline files: a run's bubble ratios (run, per rank, per cause) kept to check later runs against.

Written by ``tracekit baseline RUN -o FILE``, read by ``tracekit check --baseline FILE``::

    {"kind": "tracekit-baseline", "schema_version": "1.0", "tracekit_version": "0.1.0",
     "analysis_schema_version": "1.0", "created": "...", "source": "runs/nightly",
     "formats": ["kineto"], "schedule": {"name": "1F1B", "p": 4, "v": 1, "m": 8},
     "n_steps": 3, "step_ns": 521857560, "bubble_ratio": 0.329,
     "ranks": {"0": 0.326, ...}, "causes": {"warmup": 0.125, ..., "comm": 0.038, ...},
     "timeline": "host"}

Cause values are shares of the step window (they add up to ``bubble_ratio``). Bump the
major ``schema_version`` on any change that removes or renames a field.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracekit.analyze.compare import Measures
from tracekit.errors import TracekitError
from tracekit.schemas import ANALYSIS_SCHEMA_VERSION
from tracekit.version import __version__
from tracekit.vocab import CATEGORIES

KIND = "tracekit-baseline"
SCHEMA_VERSION = "1.0"


def to_document(measures: Measures) -> dict[str, Any]:
    """The baseline file's content for a measured run."""
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "tracekit_version": __version__,
        "analysis_schema_version": ANALYSIS_SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": measures.source,
        "formats": list(measures.formats),
        "schedule": measures.schedule,
        "n_steps": measures.n_steps,
        "step_ns": round(measures.step_ns),
        "bubble_ratio": round(measures.bubble_ratio, 6),
        "ranks": {str(r): round(v, 6) for r, v in sorted(measures.rank_bubble.items())},
        "causes": {c: round(v, 6) for c, v in measures.cause_share.items()},
        "incomplete": measures.incomplete or None,
        "timeline": measures.timeline,
    }


def read_baseline(path: Path) -> Measures:
    """The measures kept in a baseline file; any problem is one :class:`TracekitError` line."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TracekitError(
            f"baseline {path}: no such file; make one with: tracekit baseline RUN_DIR -o {path}"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise TracekitError(f"baseline {path}: cannot read it ({err})") from None
    except json.JSONDecodeError as err:
        raise TracekitError(
            f"baseline {path}: not JSON ({err.msg} at line {err.lineno}); "
            "remake it with: tracekit baseline RUN_DIR -o FILE"
        ) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise TracekitError(
            f'baseline {path}: not a tracekit baseline (no "kind": "{KIND}"); '
            "make one with: tracekit baseline RUN_DIR -o FILE"
        )
    version = str(doc.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise TracekitError(
            f"baseline {path}: schema version {version or '?'} (written by tracekit "
            f"{doc.get('tracekit_version', '?')}); this tracekit reads {SCHEMA_VERSION}: "
            "remake the baseline or upgrade tracekit"
        )
    try:
        return _measures(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TracekitError(
            f"baseline {path}: malformed ({type(err).__name__}: {err}); "
            "remake it with: tracekit baseline RUN_DIR -o FILE"
        ) from None


def _measures(doc: dict[str, Any]) -> Measures:
    schedule = doc["schedule"]
    if schedule is not None:
        schedule = {
            "name": str(schedule["name"]),
            "p": int(schedule["p"]),
            "v": int(schedule["v"]),
            "m": int(schedule["m"]),
            **({"replicas": int(schedule["replicas"])} if int(schedule.get("replicas", 1)) > 1 else {}),
            **{role: int(schedule[role]) for role in ("tp", "dp") if int(schedule.get(role, 1)) > 1},
        }
    causes = {str(c): _share(v) for c, v in doc["causes"].items()}
    unknown = set(causes) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown causes {sorted(unknown)}")
    return Measures(
        source=str(doc["source"]),
        formats=[str(f) for f in doc.get("formats", [])],
        schedule=schedule,
        n_steps=int(doc.get("n_steps", 0)),
        step_ns=float(doc.get("step_ns", 0)),
        bubble_ratio=_share(doc["bubble_ratio"]),
        rank_bubble={int(r): _share(v) for r, v in doc["ranks"].items()},
        cause_share=causes,
        incomplete=str(doc.get("incomplete") or ""),
        # baselines from before the device timeline were all measured on the host
        timeline=str(doc.get("timeline") or "host"),
    )


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{value!r} is not a ratio between 0 and 1")
    return float(value)
