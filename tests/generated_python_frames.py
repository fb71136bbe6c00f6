"""GENERATED ``python_function`` frames (torch.profiler ``with_stack=True``, ``with_modules``)
added to traces the tests already have. Not captured with ``with_stack``: the frames are
written here, around ops whose actions the source trace's own ground truth names, so that
tests can hold tracekit to that truth. Folders are named ``generated_*``.

How torch writes them (torch 2.13, seen in a CPU capture of Megatron-core 0.16.1 run with
``with_stack=True``; the names and args come from torch's ``collection.cpp``
``toString(ExtraFields<EventType::PyCall>)`` and ``profiler_kineto.cpp``
``AddTensorboardFields``):

- ``{"ph": "X", "cat": "python_function", "name": ..., "pid", "tid", "ts", "dur", "args":
  {"Python parent id": <id or null>, "Python id": <id>, "Ev Idx": <n>}}`` on the thread that
  ran the Python code; ``nn.Module: <Class>_<k>`` frames (``with_modules``) add ``"Python
  module id"``; ``"Python thread"`` only with the profiler's verbose experimental option.
- Names ``<file>(<line>): <function>`` with the site-packages or ``sys.path`` prefix cut
  (``torch/profiler/python_tracer.py`` ``_prefix_regex``), ``nn.Module: Linear_0``, and
  ``<built-in function linear>`` for C calls.
- A frame holds the frames and ops it called (``forward_step`` > ``nn.Module: ...`` >
  ``module.py(...): _call_impl`` > ``forward`` > ``<built-in function linear>`` > the
  ``aten::linear`` op). The file lists them after every op, in the order they started.
- Megatron's ``backward_step`` runs on the main thread and waits in
  ``torch.autograd.backward``; on a GPU the engine runs the backward's ops on its own thread
  (``pt_autograd_<device>``), on a CPU on the caller's.

What is generated, per compute action: ``schedules.py(403): forward_step`` (or ``(539):
backward_step``) around its ops on the main thread; for interleaving, Megatron's helpers
(``forward_step_helper`` / ``backward_step_helper``) around those; under a forward, the
module frames around each top-level op; under a backward, ``torch.autograd.backward`` and
the engine's ``run_backward`` call; around each step's actions the schedule function. And,
for a benchmark's density, optional leaf calls (``isinstance`` and the like) before each op.

Simplifications: the generated GPU pipelines' ops follow each other with no host time
between them, so a forward's frames span exactly its ops (torch's start a little before and
end a little after); the CPU samples' frames reach halfway to the neighbouring ops at most,
and a forward's frame starts at its first layer op (Megatron's batch slicing before it and
its token counter after it are left outside).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from gpu_tracegen import Scenario, generate, schedule_order

SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"
FORWARD_STEP = f"{SCHEDULES}(403): forward_step"
BACKWARD_STEP = f"{SCHEDULES}(539): backward_step"
_SCHEDULE_FUNCTION = {
    False: f"{SCHEDULES}(2147): forward_backward_pipelining_without_interleaving",
    True: f"{SCHEDULES}(1019): forward_backward_pipelining_with_interleaving",
}
_HELPER = {"F": f"{SCHEDULES}(1385): forward_step_helper", "B": f"{SCHEDULES}(1458): backward_step_helper"}
# Frames between a forward and each of its ops (the first only with_modules), and under a backward.
_MODULE_CHAIN = (
    "nn.Module: Linear_{k}",
    "torch/nn/modules/module.py(1784): _call_impl",
    "torch/nn/modules/linear.py(125): forward",
    "<built-in function linear>",
)
_BACKWARD_CHAIN = (
    "torch/autograd/__init__.py(255): backward",
    "torch/autograd/graph.py(829): _engine_run_backward",
    "<built-in method run_backward of torch._C._EngineBase object at 0x7f3a5c1d2e90>",
)
# Calls that hold no op, as the CPU capture shows them most (for a benchmark's density).
LEAF_CALLS = (
    "<built-in function isinstance>",
    "inspect.py(2751): kind",
    "torch/nn/modules/module.py(1940): __getattr__",
    "<built-in method append of list object at 0x7f1be4265240>",
    "torch/distributed/distributed_c10d.py(817): WORLD",
    "<built-in function len>",
)


@dataclass
class Action:
    """One compute action of a rank: its kind, what it truly was (stage, microbatch) and the
    span of its frame on the main thread (µs, as the trace's ts), with the top-level ops a
    forward's module frames go around."""

    kind: str
    stage: int
    microbatch: int
    start_us: float
    end_us: float
    ops: list[dict] = field(default_factory=list)


@dataclass
class _Frame:
    name: str
    start_us: float
    end_us: float
    module: int | None = None  # nn.Module frames: the module's id


def framed(
    doc: dict, actions: list[Action], tid: int, interleaved: bool, modules: bool = True, leaves: int = 0
) -> dict:
    """``doc`` with the frames of ``actions`` (run on thread ``tid``) appended to its events, as
    torch writes them; ``modules``: with_modules' nn.Module frames; ``leaves``: calls that hold
    no op, before each op of a forward (0: none)."""
    pid = next(e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("tid") == tid)
    frames: list[_Frame] = []
    for step_actions in _by_step(doc, actions, tid):
        first, last = step_actions[0], step_actions[-1]
        frames.append(_Frame(_SCHEDULE_FUNCTION[interleaved], first.start_us - 0.002, last.end_us + 0.002))
    for action in actions:
        frames += _action_frames(action, interleaved, modules, leaves)
    frames.sort(key=lambda f: (f.start_us, -(f.end_us - f.start_us)))
    events = list(doc["traceEvents"])
    n_ops = sum(1 for e in events if e.get("ph") == "X")
    stack: list[tuple[float, int]] = []  # (end, python id) of the open frames
    for python_id, frame in enumerate(frames, start=1):
        while stack and (frame.start_us >= stack[-1][0] or frame.end_us > stack[-1][0]):
            stack.pop()
        args: dict = {"Python parent id": stack[-1][1] if stack else None, "Python id": python_id}
        if frame.module is not None:
            args["Python module id"] = frame.module
        args["Ev Idx"] = n_ops + python_id - 1
        events.append(
            {
                "ph": "X",
                "cat": "python_function",
                "name": frame.name,
                "pid": pid,
                "tid": tid,
                "ts": round(frame.start_us, 3),
                "dur": round(frame.end_us - frame.start_us, 3),
                "args": args,
            }
        )
        stack.append((frame.end_us, python_id))
    return {**doc, "with_stack": 1, "with_modules": int(modules), "traceEvents": events}


def _by_step(doc: dict, actions: list[Action], tid: int) -> list[list[Action]]:
    """The actions within each ProfilerStep mark of thread ``tid``, steps in order."""
    marks = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("tid") == tid and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    steps = [[a for a in actions if lo <= a.start_us and a.end_us <= hi] for lo, hi in marks]
    return [s for s in steps if s]


def _action_frames(action: Action, interleaved: bool, modules: bool, leaves: int) -> list[_Frame]:
    """The frames of one action: its entry point (in Megatron's helper when interleaved), and
    what torch writes under it."""
    lo, hi = action.start_us, action.end_us
    entry = FORWARD_STEP if action.kind == "F" else BACKWARD_STEP
    frames = [_Frame(entry, lo, hi)]
    if interleaved:
        frames.append(_Frame(_HELPER[action.kind], lo - 0.001, hi + 0.001))
    if action.kind == "B":
        return frames + [
            _Frame(name, lo + 0.001 * (k + 1), hi - 0.001 * (k + 1)) for k, name in enumerate(_BACKWARD_CHAIN)
        ]
    chain = _MODULE_CHAIN if modules else _MODULE_CHAIN[1:]
    for k, op in enumerate(action.ops):
        start, end = op["ts"], op["ts"] + op["dur"]
        for name in chain:  # same span as the op where nothing separates the ops (see the module doc)
            frames.append(_Frame(name.format(k=k), start, end, k if name.startswith("nn.Module") else None))
        frames += [_Frame(LEAF_CALLS[j % len(LEAF_CALLS)], start, start) for j in range(leaves)]
    return frames


def write_run(folder: Path, docs: dict[int, dict], truth: dict) -> tuple[Path, dict]:
    """Write ``rank{R}.json.gz`` into ``folder`` and ``<folder>.truth.json`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, doc in docs.items():
        (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    folder.with_name(folder.name + ".truth.json").write_text(json.dumps(truth, indent=1))
    return folder, truth


def _read(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


# -- Megatron on generated GPU pipelines (tests/gpu_tracegen.py) --------------------------------


def gpu_actions(sc: Scenario, doc: dict, rank: int) -> tuple[list[Action], int]:
    """The compute actions of a generated GPU rank written without labels, in order, and its
    main thread: each forward is ``kernels_f`` top-level ops on the main thread
    (``aten::linear`` / ``aten::gelu``), each backward ``kernels_f`` engine ops on the autograd
    thread, the order :func:`gpu_tracegen.schedule_order` says, step after step."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    main = next(e["tid"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    forwards = sorted((e for e in events if e["tid"] == main and e["name"] in ("aten::linear", "aten::gelu")), key=_ts)
    backwards = sorted((e for e in events if e["name"].startswith("autograd::engine::evaluate_function")), key=_ts)
    kf = sc.kernels_f
    f_groups = [forwards[i : i + kf] for i in range(0, len(forwards), kf)]
    b_groups = [backwards[i : i + kf] for i in range(0, len(backwards), kf)]
    order = schedule_order(sc, rank) * sc.steps
    if len(f_groups) + len(b_groups) != len(order):
        raise ValueError(f"rank {rank}: {len(f_groups)} forwards and {len(b_groups)} backwards, not {len(order)}")
    actions, handoff_us = [], 3.0  # gpu_tracegen's hand-off to and from the autograd thread
    for stage, kind, mb in order:
        ops = f_groups.pop(0) if kind == "F" else b_groups.pop(0)
        lo, hi = ops[0]["ts"], max(e["ts"] + e["dur"] for e in ops)
        if kind == "B":
            lo, hi = lo - handoff_us, hi + handoff_us
        actions.append(Action(kind, stage, mb, lo, hi, ops if kind == "F" else []))
    return actions, main


def megatron_gpu(sc: Scenario, out_dir: Path, modules: bool = True, leaves: int = 0) -> tuple[Path, dict]:
    """GENERATED: ``gpu_tracegen``'s run of ``sc`` written without labels, then Megatron's frames
    around each action (``generated_<name>_with_stack/``). The truth: each rank's actions per
    step in order, ``[kind, stage, microbatch]``, and the scenario's p, v, m."""
    if sc.labelled:
        raise ValueError("Megatron writes no labels: give an unlabelled scenario")
    source, _ = generate(sc, out_dir / "source")
    docs, order = {}, {}
    for rank in range(sc.p):
        doc = _read(source / f"rank{rank}.json.gz")
        actions, main = gpu_actions(sc, doc, rank)
        docs[rank] = framed(doc, actions, main, sc.v > 1, modules, leaves)
        order[str(rank)] = _order_by_step(doc, actions, main)
    truth = {"what": "GENERATED frames on a GENERATED GPU pipeline", "p": sc.p, "v": sc.v, "m": sc.m, "order": order}
    return write_run(out_dir / f"generated_{sc.name}_with_stack", docs, truth)


# -- Megatron on the committed CPU samples (real Megatron-core runs, no frames) -----------------


def cpu_actions(run_dir: Path, rank: int) -> tuple[dict, list[Action], int]:
    """A Megatron sample rank's trace, its actions as ``capture.json["executed_order"]`` lists
    them with the spans ``test_megatron_capture.compute_actions`` finds in the trace alone,
    and its main thread."""
    from test_megatron_capture import _main_thread_ops, compute_actions

    capture = json.loads((run_dir / "capture.json").read_text())
    doc = _read(run_dir / f"rank{rank}.json.gz")
    main_ops, _ = _main_thread_ops(doc)
    main = main_ops[0]["tid"]
    spans = compute_actions(run_dir, rank, capture["compute"]["layers_per_stage"])
    top = _top_level(main_ops)
    actions = []
    for step, executed in sorted(capture["executed_order"][str(rank)].items(), key=lambda kv: int(kv[0])):
        found = spans[int(step)]
        if [k for k, _, _ in found] != [a["kind"] for a in executed]:
            raise ValueError(f"rank {rank} step {step}: the trace's actions are not the executed order")
        for (kind, lo, hi), truth in zip(found, executed):
            lo, hi = _widened(top, lo, hi)
            ops = [e for e in top if lo <= e["ts"] and e["ts"] + e["dur"] <= hi] if kind == "F" else []
            actions.append(Action(kind, truth["stage"], truth["microbatch"], lo, hi, ops))
    return doc, actions, main


def megatron_cpu(run_dir: Path, out_dir: Path, modules: bool = True) -> tuple[Path, dict]:
    """GENERATED: a committed Megatron sample (``sample_traces/megatron_*``) with Megatron's
    frames added around each action (``generated_<sample>_with_stack/``; no capture.json: the
    folder is no capture). The truth: each rank's actions per step, as the capture recorded
    them, and its p, v, m."""
    capture = json.loads((run_dir / "capture.json").read_text())
    docs, order = {}, {}
    for rank in range(capture["p"]):
        doc, actions, main = cpu_actions(run_dir, rank)
        docs[rank] = framed(doc, actions, main, capture["v"] > 1, modules)
        order[str(rank)] = _order_by_step(doc, actions, main)
    truth = {
        "what": f"GENERATED frames on the real CPU capture sample_traces/{run_dir.name}",
        "p": capture["p"],
        "v": capture["v"],
        "m": capture["m"],
        "order": order,
    }
    return write_run(out_dir / f"generated_{run_dir.name}_with_stack", docs, truth)


def _ts(e: dict) -> float:
    return e["ts"]


def _order_by_step(doc: dict, actions: list[Action], tid: int) -> dict[str, list[list]]:
    """Each ProfilerStep's actions as ``[kind, stage, microbatch]``, keyed by step number."""
    marks = sorted(
        (int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("tid") == tid and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    return {
        str(step): [[a.kind, a.stage, a.microbatch] for a in actions if lo <= a.start_us and a.end_us <= hi]
        for step, lo, hi in marks
    }


def _top_level(ops: list[dict]) -> list[dict]:
    """The ops right under a ProfilerStep mark on a thread (gloo's send/recv ranges, which
    span from posting to the wait's return across other ops, hold none)."""
    out, stack = [], []
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while stack and (e["ts"] >= stack[-1] or end > stack[-1]):
            stack.pop()
        if len(stack) == 1:
            out.append(e)
        if not e["name"].startswith("gloo:"):
            stack.append(end)
    return out


def _widened(top: list[dict], lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened halfway to the top-level ops before and after it, by 20 µs at most."""
    before = max((e["ts"] + e["dur"] for e in top if e["ts"] + e["dur"] <= lo), default=lo - 40)
    after = min((e["ts"] for e in top if e["ts"] >= hi), default=hi + 40)
    return lo - min(20.0, (lo - before) / 2), hi + min(20.0, (after - hi) / 2)
