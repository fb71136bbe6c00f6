"""Nsight Systems reports: the SQLite export (``nsys export --type sqlite``), and the JSON
export as a fallback, read into the normalised event table, one ``(TraceFile, events)``
pair per rank found in the report.

What becomes rows (see :mod:`tracekit.model.events`):

* CUDA kernels, memcpys and memsets (``on_gpu``; pid = device, tid = stream), and the CUDA
  API calls that launched them (cat ``runtime``, ``correlation`` set on both sides);
* NVTX ranges, normalised to Kineto's conventions by :mod:`tracekit.ingest.nsys_names`
  (``emit_nvtx`` ops -> ``cpu_op`` with ``seq``; labels -> ``user_annotation``; NCCL's
  domain -> ``nccl:<call>``).

NCCL point-to-point kernels are told apart by where they were launched, not by name: a
kernel whose launch (joined on correlation id AND process: ids collide across processes)
falls inside an NCCL-domain ``ncclSend``/``ncclRecv`` range, or inside an ``ncclGroupEnd``
closing a group of sends/receives, on the same thread, is P2P and is renamed
``nccl:SendRecv|<kernel short name>``, unless that call sits inside an all_to_all
(``nccl:all_to_all`` / ``c10d::alltoall*`` on the same thread): torch runs all_to_all as a
group of sends and receives, one per peer, and it is a collective. The kernel-name pattern
is used only when the launch cannot be placed, and not in a process where kernels of that
pattern were placed in collectives (there the name says nothing).
:func:`match_nccl_p2p` pairs P2P kernels across ranks.

Processes become ranks by, in order: the caller's ``rank_map`` {pid: rank}; what the report
states (NVTX marks or thread names such as ``tracekit:rank=3 world_size=4`` or ``MPI Rank 0``,
``rank=N`` in every range name of a process; a one-process report's RANK / PMI_RANK /
SLURM_PROCID environment, command line, or file name); the CUDA device of each process's
kernels; the order of pids. ``TraceFile.rank_source`` and ``warnings`` say which.

By job: :mod:`tracekit.ingest.nsys_read` reads a report into raw rows,
:mod:`tracekit.ingest.nsys_events` builds the event table, :mod:`tracekit.ingest.nsys_ranks`
decides the ranks, :mod:`tracekit.ingest.nsys_names` holds the name conventions and
:mod:`tracekit.ingest.nsys_sqlite` the schema-discovering queries; this module is the entry.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tracekit.ingest import nsys_sqlite as db
from tracekit.ingest.nsys_events import Parsed, _build
from tracekit.ingest.nsys_read import _read_json, _read_sqlite


def parse_nsys_sqlite(path: str | Path, file_id: int, rank_map: dict[int, int] | None = None) -> Parsed:
    """Parse an ``nsys export --type sqlite`` file: one ``(TraceFile, events)`` per rank."""
    path = Path(path)
    conn = db.connect_read_only(path)
    try:
        report = _read_sqlite(conn, path)
    except sqlite3.DatabaseError as err:
        raise db.damaged(path, err) from None
    finally:
        conn.close()
    return _build(report, file_id, rank_map)


def parse_nsys_json(path: str | Path, file_id: int, rank_map: dict[int, int] | None = None) -> Parsed:
    """Parse an ``nsys export --type json`` file (line-delimited objects): NVTX ranges only.

    The JSON export has no session start time, so its times are relative to the capture
    start and cannot be aligned with other reports by themselves.
    """
    return _build(_read_json(Path(path)), file_id, rank_map)
