"""Capture a real pipeline-parallel run under Nsight Systems: a scrubbed SQLite report.

``run_nsys_capture(config, out_dir)`` runs the same training as the Kineto capture
(:mod:`tracekit.capture.worker`: torch.distributed.pipelining over gloo, emulated or real
compute) inside ``nsys profile -t nvtx``, exports the report to SQLite, removes what a
report must not carry when shared (environments, command lines, file paths, other
processes and their threads), and writes ``nsys_report.sqlite`` and ``capture.json`` into
``out_dir``. The raw ``.nsys-rep`` is made in a temporary folder and deleted.

What each rank records as NVTX ranges (steps 2.. only; steps 0 and 1 warm up untraced):

* with a CUDA build of torch: ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``;
* with a CPU-only build (whose emit_nvtx refuses to run), :class:`NvtxOpEmitter`, which
  writes the same strings emit_nvtx would: ``aten::addmm, seq = 351, op_id = 12,
  sizes = [[256], [8, 256], [256, 256], [], []]`` for every op (a TorchDispatchMode), autograd
  Function and backward node (hooks), and ``PP:1F0, op_id = 7`` for every
  ``record_function``; plus ``gloo:send`` / ``gloo:recv`` start/end ranges from inside
  ``c10d::send`` / ``c10d::recv_`` to ``wait()`` returning, as ProcessGroupGloo's own
  RecordFunctions span.
* the harness adds ``ProfilerStep#N`` around each step and one mark
  ``tracekit:rank=R world_size=P`` per process, so the report states its ranks.

nsys and the Python ``nvtx`` package (0.2.8; 0.2.16's ranges are not recorded by nsys
2022.4) must be installed; nothing here needs a GPU.

By job: :mod:`.driver` runs nsys and exports its report, :mod:`.scrub` removes what a shared
report must not carry, :mod:`.emitter` writes emit_nvtx's ranges on a CPU-only torch, and
:mod:`.ranks` is the program nsys launches (``python -m tracekit.capture.nsys CONFIG_JSON
OUT_DIR``), which spawns the ranks.
"""

from tracekit.capture.nsys.driver import (
    NVTX_PACKAGE_HINT,
    REPORT_NAME,
    TRACE_FLAGS,
    find_nsys,
    record_report,
    run_nsys_capture,
)
from tracekit.capture.nsys.emitter import NvtxOpEmitter
from tracekit.capture.nsys.ranks import RANK_MARK
from tracekit.capture.nsys.scrub import FORBIDDEN, scrub_report

__all__ = [
    "FORBIDDEN",
    "NVTX_PACKAGE_HINT",
    "RANK_MARK",
    "REPORT_NAME",
    "TRACE_FLAGS",
    "NvtxOpEmitter",
    "find_nsys",
    "record_report",
    "run_nsys_capture",
    "scrub_report",
]
