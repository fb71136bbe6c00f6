"""The ``tracekit`` command: a thin click group; each subcommand lives in tracekit/commands/."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

import click

from tracekit.errors import TracekitError
from tracekit.text import for_terminal
from tracekit.version import __version__


class _Group(click.Group):
    """Turns a user's mistake into one line and exit status 2, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        from tracekit._lean import pandas_without_pyarrow

        pandas_without_pyarrow()  # ~40 MB and ~0.1 s of CPU less; see tracekit/_lean.py
        from tracekit.output import GuardedStream

        stdout = sys.stdout
        if not isinstance(stdout, GuardedStream):  # run() guards it already; main() alone does not
            sys.stdout = GuardedStream(stdout)  # > /dev/full: one line, not an internal error
        try:
            return super().invoke(ctx)
        except TracekitError as err:
            # The line quotes file and event names: a hostile one must not drive the terminal.
            click.echo(f"tracekit: error: {for_terminal(str(err))}", err=True)
            sys.exit(err.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("tracekit: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            _reader_gone()
        except Exception as err:  # a bug in tracekit, not the user's fault
            _internal_error(err)
        finally:
            sys.stdout = stdout


#: exit status when standard output's reader went away (``| head``): a shell's for SIGPIPE
READER_GONE = 128 + 13


def _reader_gone() -> NoReturn:
    """Standard output's reader went away (``tracekit check run/ | head -2``): stop quietly
    as a shell tool does, with the SIGPIPE status; what is left to print goes nowhere."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        if sys.__stdout__ is not None:  # None only where Python started without a stdout
            os.dup2(devnull, sys.__stdout__.fileno())
    sys.exit(READER_GONE)


def _internal_error(err: Exception) -> NoReturn:
    """A bug in tracekit, not the user's fault: one line and exit status 3 (the traceback
    with TRACEKIT_DEBUG=1)."""
    if os.environ.get("TRACEKIT_DEBUG"):
        raise err
    click.echo(
        f"tracekit: internal error: {type(err).__name__}: {for_terminal(str(err))} (a tracekit bug: "
        "rerun with TRACEKIT_DEBUG=1 for the traceback and report it)",
        err=True,
    )
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
      tracekit whatif run/ -m 16                  # another schedule, v or m: predicted
      tracekit report run/                        # interactive HTML report
      tracekit check run/ --baseline base.json    # CI gate: exit 1 on a regression
      tracekit diff run_a/ run_b/                 # what changed, what matters most
      tracekit export run/ -o merged.json.gz      # one timeline for Perfetto
      tracekit capture -o run/ --schedule 1F1B    # record a real PP run (needs torch)
      tracekit cache info                         # where parsed traces are kept, how much
    """


def _register() -> None:
    from tracekit.commands import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_register()


def run() -> None:
    """The ``tracekit`` executable: :func:`main`, then a quick exit.

    Tearing down the interpreter (freeing every table and module one by one) takes ~0.1 s
    after a large analysis and does nothing useful, so once output is flushed and the exit
    handlers have run (cache entries, worker pools), the process ends at once."""
    from tracekit.output import GuardedStream

    sys.stdout = GuardedStream(sys.stdout)  # --help > /dev/full too: one line, exit 2
    try:
        main()
        code = 0
    except TracekitError as err:  # raised outside a command: --help's output could not be written
        click.echo(f"tracekit: error: {for_terminal(str(err))}", err=True)
        code = err.exit_code
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            click.echo(for_terminal(str(done.code)), err=True)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # stdout closed early (a pipe into head): nothing to flush
        code = code or READER_GONE
    except (OSError, ValueError) as err:  # > /dev/full: the output never arrived
        from tracekit.output import GuardedStream, standard_output_failure

        if isinstance(err, OSError) and not GuardedStream.failed:  # said once
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"tracekit: error: {standard_output_failure(err)}\n")
                sys.stderr.flush()
        code = code or 2
    if GuardedStream.reader_gone and code in (0, 1):  # click's own status for EPIPE is 1
        code = READER_GONE
    import atexit

    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
