"""Clock alignment across hosts, estimated from the messages themselves.

Ranks on one host share a clock. Across hosts the offset is whatever NTP/PTP left, often
tens of microseconds to milliseconds, enough to make a message arrive before it was sent.
Each matched message bounds the offset: with host B's clock ahead of A's by ``x``,
``recv_done(B) - send_post(A) = delay + x`` and the reverse direction gives
``delay' - x``. Delays are >= 0, so the fastest message each way brackets ``x``; its
midpoint (NTP's symmetric-delay estimate) is the offset used. Hosts are aligned to the
host of the lowest rank, walking the graph of hosts that exchanged messages.
"""

from __future__ import annotations

from collections import deque
from typing import cast

import pandas as pd

from tracekit.model.events import TraceFile


def host_of_rank(files: list[TraceFile]) -> dict[int, str]:
    """Which clock domain each rank is on: its host, or its own file if the file's clock is
    relative to the file (each such file has a clock of its own)."""
    hosts = {}
    for index, trace in enumerate(files):
        for rank in trace.ranks or [trace.rank]:
            if trace.clock == "relative":
                hosts[rank] = f"file:{index}"
            else:
                hosts[rank] = trace.host or "unknown-host"
    return hosts


def estimate_offsets(files: list[TraceFile], messages: pd.DataFrame) -> tuple[dict[int, int], list[str]]:
    """ns to subtract from each rank's times to put it on the reference clock (only ranks
    that need a shift appear), and notes on what was done."""
    hosts = host_of_rank(files)
    if len(set(hosts.values())) <= 1 or messages.empty:
        return {}, []
    src_host = messages["src_rank"].map(hosts)
    dst_host = messages["dst_rank"].map(hosts)
    crossing = messages[src_host != dst_host].assign(src_host=src_host, dst_host=dst_host)
    if crossing.empty:
        return {}, [
            f"ranks are on {len(set(hosts.values()))} clocks and no message crosses between "
            "them: their clocks cannot be aligned; times across them may be off"
        ]
    # fastest apparent delay per ordered host pair
    crossing = crossing.assign(apparent=crossing["recv_done_ns"] - crossing["send_post_ns"])
    fastest = cast(dict[tuple[str, str], int], crossing.groupby(["src_host", "dst_host"])["apparent"].min().to_dict())
    reference = hosts[min(hosts)]
    offset = {reference: 0}
    queue = deque([reference])
    while queue:
        a = queue.popleft()
        for (s, d), _ in fastest.items():
            for here, there in ((s, d), (d, s)):
                if here != a or there in offset:
                    continue
                ahead = fastest.get((here, there))  # there's clock minus here's, plus delay
                behind = fastest.get((there, here))  # here's clock minus there's, plus delay
                if ahead is not None and behind is not None:
                    x = (ahead - behind) // 2
                elif ahead is not None:
                    x = min(0, ahead)  # only bound: x <= ahead
                else:
                    assert behind is not None  # (here, there) is a key of fastest one way or the other
                    x = max(0, -behind)  # only bound: x >= -behind
                offset[there] = offset[a] + int(x)
                queue.append(there)
    notes = []
    unreached = sorted({h for h in hosts.values() if h not in offset})
    if unreached:
        notes.append(f"clocks {', '.join(unreached)} exchanged no message with the others: not aligned")
    shifts = {rank: offset[h] for rank, h in hosts.items() if offset.get(h, 0) != 0}
    if shifts:
        by_host = sorted({(h, offset[h]) for h in offset if offset[h] != 0})
        notes.append(
            "aligned clocks from message timing: " + ", ".join(f"{h} {off / 1e3:+.1f} us" for h, off in by_host)
        )
    return shifts, notes


def shift_ranks(
    frame: pd.DataFrame, shifts: dict[int, int], rank_col: str, time_cols: list[str], unset: int | None = None
) -> pd.DataFrame:
    """Subtract each rank's offset from the given time columns; a value equal to ``unset``
    (a marker such as -1, "no launch recorded") is not a time and stays as it is."""
    if not shifts or frame.empty:
        return frame
    delta = frame[rank_col].map(shifts).fillna(0).astype("int64")
    frame = frame.copy()
    for col in time_cols:
        shifted = frame[col] - delta
        frame[col] = shifted if unset is None else shifted.where(frame[col] != unset, unset)
    return frame
