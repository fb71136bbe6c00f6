"""Errors a user can cause: each carries one line saying what is wrong and what to do.

The CLI turns a :class:`TracekitError` into that line on stderr and a non-zero exit;
it never shows a traceback for them.
"""

from __future__ import annotations


class TracekitError(Exception):
    """A problem with the user's input or invocation (exit status 2)."""

    exit_code = 2


class TraceFormatError(TracekitError):
    """A file is not a trace we can read (wrong format, corrupt, unsupported)."""


class RunLayoutError(TracekitError):
    """The run folder as a whole is inconsistent (duplicate ranks, mixed runs, no files)."""


class CaptureError(TracekitError):
    """A capture could not run (missing torch, bad options)."""
