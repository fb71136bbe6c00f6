"""tracekit/model/schedules.py: one table of schedule traits that capture, what-if and the
command line read; each reader's view of it, and the table against the code it describes."""

from __future__ import annotations

import pytest

from tracekit.analyze.schedules import GENERATORS, TORCH_CLASSES, V_PLACED, ZERO_BUBBLE
from tracekit.analyze.split import SPLIT_TARGETS
from tracekit.analyze.whatif import ALL_TARGETS, TARGETS
from tracekit.capture import config as capture
from tracekit.commands.whatif import SCHEDULE_CHOICES
from tracekit.model.schedules import BY_NAME, SCHEDULES, chunks_per_rank, names


def test_what_each_reader_sees():
    """The sets each layer used to spell out itself, now read from the one table."""
    assert ALL_TARGETS == tuple(SCHEDULE_CHOICES) == tuple(GENERATORS)
    assert TARGETS == ("GPipe", "1F1B", "Interleaved1F1B")  # the default grid
    assert SPLIT_TARGETS == (*TARGETS, "LoopedBFS")
    assert ZERO_BUBBLE == ("ZB-H1", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
    assert V_PLACED == ("ZBVZeroBubble", "DualPipeV") and capture.V_PLACEMENT == set(V_PLACED)
    assert TORCH_CLASSES["ZB-H1"] == TORCH_CLASSES["InterleavedZeroBubble"] == "ScheduleInterleavedZeroBubble"
    assert list(capture.SCHEDULES) == [
        "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
        "PipeDream2BW", "TeraPipe",
    ]  # fmt: skip
    assert capture.DESIGNS == {"PipeDream2BW", "TeraPipe"}
    assert capture.SINGLE_STAGE == {"GPipe", "1F1B", "PipeDream2BW", "TeraPipe"}
    assert capture.SPLIT_BACKWARD == {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


def test_chunks_per_rank():
    assert [chunks_per_rank(s, several=4) for s in names(generated=True)] == [1, 1, 4, 4, 1, 4, 2, 2]
    assert all(s.v_shaped == (s.chunks == "two") for s in SCHEDULES)
    assert len(BY_NAME) == len(SCHEDULES)


def test_torch_runs_or_orders_every_schedule_the_table_gives_it():
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    for s in SCHEDULES:
        if not s.design:
            assert hasattr(pipelining, s.runner), s.name


def test_the_grid_that_s_v_m_ask_for():
    from types import SimpleNamespace

    from tracekit.analyze.whatif import requested_targets

    model = SimpleNamespace(m=8, v=1, schedule="1F1B")
    assert requested_targets(model, ms=(16,)) == [("GPipe", 1, 16), ("1F1B", 1, 16), ("Interleaved1F1B", 2, 16)]
    # a run of a schedule the grid leaves out unasked gets its own rows
    looped = SimpleNamespace(m=8, v=2, schedule="LoopedBFS")
    assert requested_targets(looped, ms=(8,))[-1] == ("LoopedBFS", 2, 8)
    assert requested_targets(model, vs=(2, 4), ms=(8,)) == [("Interleaved1F1B", 2, 8), ("Interleaved1F1B", 4, 8)]
    assert requested_targets(model, ("ZB-H1", "ZBVZeroBubble", "InterleavedZeroBubble"), ms=(8,)) == [
        ("ZB-H1", 1, 8),
        ("ZBVZeroBubble", 2, 8),
        ("InterleavedZeroBubble", 2, 8),
    ]
    # -v given: the V takes it too (and check_target refuses any but 2)
    assert requested_targets(model, ("DualPipeV",), vs=(4,)) == [("DualPipeV", 4, 8), ("DualPipeV", 4, 16)]
