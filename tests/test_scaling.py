"""What keeps tracekit usable at thousands of ranks, checked on small real runs.

The multi-replica fixture is the project's real 1F1B sample laid out as a DP x PP job by the
benchmark's input builder (``benchmarks/make_input.py``): real events, replicated.
"""

from __future__ import annotations

import sys

from conftest import ROOT
from tracekit import LoadOptions, load
from tracekit.analyze import analyze, attribution

sys.path.insert(0, str(ROOT / "benchmarks"))
import make_input  # noqa: E402


def test_comm_blame_stays_inside_each_replica(tmp_path, monkeypatch):
    """A rank that no replayed link helps shares its comm among its own replica's links, not
    every link of the job (which at 4,096 ranks was a row per rank and link)."""
    folder = tmp_path / "1f1b_x3"
    make_input.build_pp(folder, ranks=12, copies=1, sample="1f1b")
    # one link replayed per step: most ranks take the fallback
    monkeypatch.setattr(attribution, "MAX_BLAME_REPLAYS", 1)
    result = analyze(load(folder, LoadOptions(jobs=1, rows="analysis")))
    links = result.attribution.link_blame
    assert len(links) and (links["comm_ns"] > 0).all()
    replica = links["rank"] // 4
    assert ((links["src_rank"] // 4 == replica) & (links["dst_rank"] // 4 == replica)).all()
    # all three replicas get their comm blamed, each on its own links
    assert set(replica) == {0, 1, 2}
