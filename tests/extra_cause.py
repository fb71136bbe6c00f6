"""Run tracekit commands with a throwaway idle cause registered (tests/test_causes.py).

``python tests/extra_cause.py OUT_DIR :: ARGS :: ARGS ...``: registers :data:`EXTRA` in
tracekit.vocab before anything else reads the registry, computes it as half of each rank's
warm-up (a ``schedule`` cause: a share of the all-causes-removed replay's idle), then runs
each ``tracekit ARGS`` in turn, writing its output to OUT_DIR/<n>.out and its exit status
to OUT_DIR/<n>.rc, and the analysis schema as the registry makes it to OUT_DIR/schema.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tracekit.vocab as vocab

EXTRA = vocab.Cause(
    key="extra",
    name="extra cause",
    label="xtra",
    legend="extra legend",
    color="#44BB99",
    kind="schedule",
    drawn="middle",
    description="idle of a throwaway cause a test registers",
    blamed_on="the extra cause",
    aliases=("xtra",),
)


def register() -> None:
    """Add :data:`EXTRA` to the registry (and the names derived from it), and its computation."""
    vocab.IDLE_CAUSES = (*vocab.IDLE_CAUSES, EXTRA)
    vocab.CATEGORIES = tuple(c.key for c in vocab.IDLE_CAUSES)
    vocab.CAUSE_NAMES = {c.key: c.name for c in vocab.IDLE_CAUSES}
    from tracekit.analyze import attribution

    schedule_idle = attribution._schedule_idle

    def with_extra(*args):  # type: ignore[no-untyped-def]
        idle = schedule_idle(*args)
        idle["extra"] = idle["warmup"] // 2
        idle["warmup"] = idle["warmup"] - idle["extra"]
        return idle

    attribution._schedule_idle = with_extra


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    register()
    from click.testing import CliRunner

    from tracekit.cli import main as cli
    from tracekit.schemas import analysis_schema

    (out / "schema.json").write_text(json.dumps(analysis_schema()))
    commands = " ".join(argv[1:]).split("::")[1:]
    for n, args in enumerate(commands):
        result = CliRunner().invoke(cli, args.split())
        (out / f"{n}.out").write_text(result.stdout)
        (out / f"{n}.rc").write_text(str(result.exit_code))


if __name__ == "__main__":
    main(sys.argv[1:])
