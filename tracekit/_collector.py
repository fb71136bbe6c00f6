"""The command's garbage collector: paused while the modules it needs load, then told to skip them.

Loading click, numpy, pandas and tracekit's analysis creates ~110k long-lived container
objects. Python's collector, triggered every 700 new ones, walks them again and again while
they load (each full pass over everything loaded so far), and after that in every full pass
of the analysis. None of them is ever garbage. So the ``tracekit`` command pauses the
collector from its start (:func:`pause`) until the modules are in (:func:`settle`), then
moves everything loaded into the permanent generation (``gc.freeze``), never walked again,
and collects as usual from there. On 8 GPU ranks of 26 MB on 2 cores: ~0.03 s less CPU, ~0.015
s less wall (``benchmarks/README.md``).

Reference counting frees everything that is not in a cycle as before; a cycle made while
paused is collected after :func:`settle` unless it is already garbage by then (it then stays
until the process ends; imports make none worth counting). Forked parser workers inherit the
pause and settle as they start, so they skip the parent's objects too (and leave those pages
shared: a collection writes to every object it walks).

Only the executable pauses (:func:`tracekit.cli.run`): a program that calls tracekit as a
library, or runs its commands in-process, keeps its collector as it configured it.
"""

from __future__ import annotations

import gc

_paused = False  # paused here, not yet settled (inherited by forked workers)


def pause() -> None:
    """Stop collecting while the command loads its modules (where the collector runs)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> None:
    """The modules are in: keep everything made so far out of all later collections and collect
    as usual from now on. Nothing where :func:`pause` did not pause."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def is_paused() -> bool:
    return _paused
