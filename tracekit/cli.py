"""The ``tracekit`` command: a thin click group; each subcommand lives in tracekit/commands/."""
from __future__ import annotations

import os
import sys

import click

from tracekit import __version__
from tracekit.errors import TracekitError


class _Group(click.Group):
    """Turns a user's mistake into one line and exit status 2, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TracekitError as err:
            click.echo(f"tracekit: error: {err}", err=True)
            sys.exit(err.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("tracekit: interrupted", err=True)
            sys.exit(130)
        except Exception as err:  # a bug in tracekit, not the user's fault
            if os.environ.get("TRACEKIT_DEBUG"):
                raise
            click.echo(f"tracekit: internal error: {type(err).__name__}: {err} (a tracekit bug: "
                       "rerun with TRACEKIT_DEBUG=1 for the traceback and report it)", err=True)
            sys.exit(3)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def main() -> None:
    """Find where pipeline-parallel training sits idle, and why.

    RUN is a folder of per-rank profiler traces (PyTorch profiler JSON, Nsight Systems
    SQLite). tracekit finds the schedule, measures each rank's bubbles and attributes every
    idle nanosecond to warm-up, drain, schedule gaps, stage imbalance, comm or overhead.

    \b
    Typical use:
      tracekit analyze run/                       # bubbles, causes, blame, what to try
      tracekit analyze run/ --json                # the same, for scripts
      tracekit report run/                        # interactive HTML report
      tracekit check run/ --baseline base.json    # CI gate: exit 1 on a regression
      tracekit diff run_a/ run_b/                 # what changed, what matters most
      tracekit export run/ -o merged.json.gz      # one timeline for Perfetto
      tracekit capture -o run/ --schedule 1F1B    # record a real PP run (needs torch)
    """


def _register() -> None:
    from tracekit.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
