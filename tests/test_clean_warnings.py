"""Issue #29: a clean trace prints no warning, on GENERATED GPU pipelines (tests/gpu_tracegen.py,
not real traces) and on every committed sample.

Two false warnings are held off here:

- "message N arrives after its consumer started; ignored", 44 to 1,639 of them on every
  generated GPU run read with ``--timeline host``: an NCCL receive only queues a kernel and
  returns, so the consumer's host starts right after posting it (2-5 us later), while the
  producer's host may still be busy. Such a message binds no host span: it is no edge of the
  host's replay.
- "N cross-rank dependencies have no matched message", on labelled runs that post a send
  after their backward with ``batch_isend_irecv`` (6 a step at p=4, 28 at p=8): the label's
  own thread ran only communication ops, whose last (``nccl:coalesced``) ends just before
  the label does, and that remainder stretched the backward past its send, so the send's
  producer was taken to be the action before.
"""

from __future__ import annotations

import numpy as np
import pytest

import replay_reference as ref
from conftest import sample_runs
from gpu_tracegen import SCENARIOS, Scenario, generate
from test_replay_fast import _same
from tracekit import LoadOptions, load
from tracekit.analyze import analyze
from tracekit.analyze.replay import graph_from_run

FALSE_NOTES = ("arrives after its consumer started", "have no matched message")
# Not clean: clocks that disagree are said; a host that runs ahead (or a launch-bound one)
# starts its next step before the other hosts end theirs, which the host timeline says.
# wrong_peer_metadata's metadata is wrong on purpose: it is said once (tests/test_megatron_gpu.py).
NOT_CLEAN = {
    "auto": {"clock_offset", "wrong_peer_metadata"},
    "host": {"clock_offset", "host_ahead", "launch_bound", "wrong_peer_metadata"},
}
LABELLED_FUSED = Scenario("labelled_fused", fused_p2p=True)  # a backward's range posts its send after it


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean_warnings")
    folders: dict[str, object] = {}

    def get(sc: Scenario):
        if sc.name not in folders:
            folders[sc.name] = generate(sc, out)[0]
        return folders[sc.name]

    return get


@pytest.mark.parametrize("timeline", ["auto", "host"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_clean_generated_run_prints_no_warning(generated, name, timeline):
    run = load(generated(SCENARIOS[name]), LoadOptions(timeline=timeline))
    analyze(run)
    if name in NOT_CLEAN[timeline]:
        assert not [w for w in run.warnings if any(note in w for note in FALSE_NOTES)], run.warnings
    else:
        assert run.warnings == ()


@pytest.mark.parametrize("timeline", ["auto", "host"])
def test_a_labelled_backward_that_posts_its_send_keeps_its_messages(generated, timeline):
    run = load(generated(LABELLED_FUSED), LoadOptions(timeline=timeline))
    analyze(run)
    assert run.warnings == ()
    # each gradient's producer is a backward: the action whose range posted it
    kinds = run.actions.set_index("action_id")["kind"]
    gradients = run.messages[run.messages["dst_rank"] < run.messages["src_rank"]]
    assert set(kinds.loc[gradients["producer_action"]]) == {"B"}


def test_a_gpu_run_on_the_host_timeline_builds_the_graph_the_reference_builds(generated):
    """The message-by-message build (tests/replay_reference.py) states the host rule too."""
    run = load(generated(SCENARIOS["interleaved"]), LoadOptions(timeline="host"))
    assert run.timeline == "host" and len(run.messages)
    for step in sorted(set(run.actions["step"].tolist()) - {-1}):
        fast = graph_from_run(run, step)
        _same(fast, ref.graph_from_run(run, step))
        # no message edge: the hosts never waited for one another
        assert not np.any(fast.edge_msg >= 0)


@pytest.mark.parametrize("run_dir", sample_runs(), ids=lambda p: p.name)
def test_no_sample_says_a_message_came_late_or_a_dependency_has_none(loaded_runs, run_dir):
    run, _ = loaded_runs(run_dir)
    assert not [w for w in run.warnings if any(note in w for note in FALSE_NOTES)], run.warnings
