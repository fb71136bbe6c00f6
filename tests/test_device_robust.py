"""Damaged device events never crash the device timeline (GENERATED traces, mutated here).

The device code joins kernels to launches by correlation id, orders ops per stream and pairs
SendRecv kernels across ranks: each of those meets ids that collide or are not numbers,
launches without kernels, kernels without launches, times out of order. Seeded mutations
of a generated GPU pipeline (tests/gpu_tracegen.py) must end in an analysis or in one line
and exit 2, on every timeline, never in a traceback.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest
from click.testing import CliRunner

from gpu_tracegen import SCENARIOS, generate
from tracekit.cli import main

CASES = 8
_ODD_IDS = [0, -5, 2**70, "x", None, 1.5, [1], 123456]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder, _ = generate(SCENARIOS["slow_link"], tmp_path_factory.mktemp("robust"))
    return {p.name: json.loads(gzip.decompress(p.read_bytes())) for p in sorted(folder.glob("rank*.json.gz"))}


def _mutate(doc: dict, rng: random.Random) -> dict:
    doc = json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    device = [e for e in events if e.get("cat") in ("kernel", "cuda_runtime", "gpu_memcpy", "gpu_user_annotation")]
    for _ in range(rng.randint(1, 30)):
        event = rng.choice(device)
        args = event.setdefault("args", {})
        what = rng.randrange(9)
        if what == 0:
            args["correlation"] = rng.choice(_ODD_IDS)
        elif what == 1:
            event["ts"] = event["ts"] + rng.choice([-1e6, -1e3, 1e3, 1e7])
        elif what == 2 and event in events:
            events.remove(event)
        elif what == 3:
            event["tid"] = rng.choice([0, -1, "stream", 2**40])
        elif what == 4:
            event["name"] = rng.choice(["ncclDevKernel_SendRecv(x)", "ncclKernel_AllReduce", "", "x"])
        elif what == 5:
            events.append(json.loads(json.dumps(event)))
        elif what == 6:
            event["dur"] = rng.choice([0, -3, 1e9])
        elif what == 7:
            event["cat"] = rng.choice(["kernel", "cuda_runtime", "cuda_driver", "gpu_memset"])
        else:
            args.pop("correlation", None)
    return doc


@pytest.mark.parametrize("case", range(CASES))
def test_mutated_device_events_end_in_an_answer_or_one_line(pristine, tmp_path, case):
    rng = random.Random(case)
    for name, doc in pristine.items():
        (tmp_path / name).write_bytes(gzip.compress(json.dumps(_mutate(doc, rng)).encode()))
    for timeline in ("auto", "device", "host"):
        result = CliRunner().invoke(
            main, ["analyze", str(tmp_path), "--json", "--no-cache", "-j", "1", "--timeline", timeline]
        )
        assert result.exit_code in (0, 2), (case, timeline, result.output[-2000:], result.exception)
        if result.exit_code == 0:
            doc = json.loads(result.output)
            assert doc["timeline"] == ("host" if timeline == "host" else "device")
            for rank in doc["ranks"]:
                if "causes" in rank:
                    assert sum(rank["causes"].values()) == rank["idle_ns"]
        else:
            assert len(result.output.strip().splitlines()) == 1, result.output
