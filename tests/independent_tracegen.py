"""A small writer of GENERATED Kineto traces: torch's native ``Schedule1F1B`` on NCCL over 4
GPUs, with no ``PP:`` labels (issue #29). Nothing it writes is a real trace: its folders are
named ``generated_*``, and it knows the truth of what it wrote (actions, messages, device
bubble per rank and step).

It was written without reading ``tests/gpu_tracegen.py`` (the project's first generator), to
test that tracekit's segmentation does not depend on one generator's details. What it models,
and where each fact was read ("@commit chars a-b": pytorch/pytorch at that commit, character
offsets as the library's reader gives them, no line numbers being available there):

* Schedule: ``Schedule1F1B._step_microbatches`` (torch/distributed/pipelining/schedules.py
  @00722e64 chars 30400-35500): ``min(m, p - stage)`` warm-up forwards; each forward's
  receive posted and waited on alone; a warm-up forward's send fired after the previous
  send's wait, the last warm-up send held back and fused with the first backward's receive
  (``fwd_send_bwd_recv``), every backward's send fused with the next forward's receive
  (``bwd_send_fwd_recv``), the cool-down's sends waited on one backward late, the last at
  the end; ``perform_reduce_grad`` (``scale_grads``: ``div_`` on every parameter's grad).
  ``_batch_p2p`` calls ``dist.batch_isend_irecv`` for a non-empty list only (chars 16900-17300).
* ``batch_isend_irecv`` on NCCL: one coalescing group (``_coalescing_manager``), each op a
  ``c10d::send`` / ``c10d::recv_`` dispatcher op whose ``ProcessGroupNCCL::send/recv`` opens
  ``record_param_comms`` (``RECORD_PARAM_COMMS_DATA``) around ``pointToPoint``; there
  ``syncStream`` (``cudaEventRecord`` + ``cudaStreamWaitEvent``: the NCCL stream waits for the
  compute stream's work so far) and ``initWork`` with the op's profiling title
  ``nccl:send <rank>-><dst>`` / ``nccl:recv <rank><-<src>`` (torch/csrc/distributed/c10d/
  ProcessGroupNCCL.cpp @0007e752 chars 84300-90000, ``can_profile ? profilingTitle``);
  ``endCoalescing``'s ``ncclGroupEnd`` launches ONE ``ncclDevKernel_SendRecv`` for the group
  and ``initWork`` opens ``nccl:coalesced`` (same file, chars 75000-77000). Batched P2P keys
  its communicator by device: one NCCL stream per GPU (``getKeyFromDevices``, chars 84900).
  ``work.wait()`` makes the compute stream wait (``cudaStreamWaitEvent``), the host does not.
* Stage: ``get_fwd_send_ops`` / ``get_bwd_recv_ops`` (torch/distributed/pipelining/stage.py
  @01386103 chars 16100-19000): a first stage receives nothing, a last stage sends no
  activation and receives no gradient; receive buffers are made once at initialisation.
* Ops and nesting, as the real traces show them: ``aten::linear`` > ``aten::t`` >
  ``aten::transpose`` > ``aten::as_strided``, ``aten::addmm`` > ``aten::expand``; ``aten::relu``
  > ``aten::clamp_min``; ``Sequence number`` on ``aten::linear``, ``aten::t`` (same number:
  it creates ``TBackward0``), ``aten::addmm`` (next), ``aten::relu``; ``Fwd thread id`` 0 on
  forward ops, 1 on backward ones (shared/real-traces/kineto-gpu/hta_amd_trace_mi250_...,
  hta_nccl_parser_config_nccl_data.json.gz); ``aten::detach`` > ``detach`` before every
  activation send, numbered with the next number (sample_traces/1f1b_real, torch 2.13, a
  real CPU capture); ``aten::tensor_split`` > ``aten::slice`` for the batch (first stage) and
  targets (last stage); ``aten::div_`` per grad; ``Optimizer.zero_grad#SGD.zero_grad``,
  ``Optimizer.step#SGD.step`` > ``aten::_foreach_add_`` (MI250 trace).
* Backward on the engine's device thread (torch/csrc/autograd/engine.cpp: a CUDA graph task
  runs on the device's worker thread; the real traces name it ``pt_autograd_0``, and the NCCL
  trace names that thread twice, ``pt_main_thread`` first): per node
  ``autograd::engine::evaluate_function: XBackward0`` > ``XBackward0`` (both with the node's
  number), ``AddmmBackward0`` > ``aten::t``, ``aten::mm`` x2 then ``aten::sum``, ``aten::view``
  beside it; ``torch::autograd::AccumulateGrad`` (no number) > ``aten::detach`` > ``detach``
  for a grad's first microbatch, ``aten::add_`` after; a last stage seeds the gradient with
  ``aten::ones_like`` on the main thread (MI250 trace). ``fwdbwd`` flows from the forward op
  that made a node to its ``XBackward0`` op; ``ac2g`` flows from each launch to its kernel.
* Kineto's form: ``ProfilerStep#N`` user_annotation on the main thread (``tid == pid``),
  cpu_op args ``External id``, ``Record function id``, and with ``record_shapes`` ``Input
  Dims``, ``Input type``, ``Input Strides``, ``Concrete Inputs`` (``c10d::send``'s peer at [2],
  tag at [3]); launches ``cudaLaunchKernel`` (cbid 211) with ``correlation``; NCCL >= 2.19
  launches with ``cuLaunchKernelEx`` (cuda_driver); ``record_param_comms`` args as the NCCL
  trace has them (no peer: without ``record_shapes`` only the ``nccl:send`` title names
  it); every CUDA API call with its own ``correlation``; GPU rows on ``pid`` = device,
  ``tid`` = stream; ``gpu_user_annotation`` for ``ProfilerStep#N``, ``Optimizer.step#SGD.step``
  and ``nccl:coalesced`` (docs/trace-formats.md).

Guesses (not read anywhere): every duration (kernels, host costs, launch latency, NCCL
bandwidth); the user's loop (each rank records a CUDA event after the optimizer step and
synchronises on the event of ``host_lag`` steps before at the start of a step, so the host
runs up to that many steps ahead; ``host_lag=0``: at the end of each step); the model (per
stage ``layers`` x Linear(4096)+ReLU, MSE loss); ``nccl:coalesced``'s host span (around
the group's launch, opened before ``ncclGroupEnd`` as newer torch does, ended right after it
as pytorch#160680 does; @0007e752 opens it after the launch); the variant where composite ops
(``aten::linear``, ``aten::tensor_split``) record no number and only the ops below them
that make nodes do; the wrapper variant (a ``record_function`` the user puts around the
stage's forward).

Truth (``generate``'s second value): per rank and step the device bubble as
tests/device_reference.py defines it (window: the step's first to last compute kernel over
all ranks, never before the previous step's window ended; idle: the part of it where the rank
ran no compute kernel; busy: the union of the rank's compute kernels of the step; a kernel's
step: the ProfilerStep its launch is in), the actions (rank, stage, kind, microbatch) in run
order, and the messages with their kernels' times.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_TIME_NS = 1_767_225_600_000_000_000
ORIGIN_NS = 4_000_000_000  # the first host event, after baseTimeNanoseconds
FIRST_STEP = 2  # profiler schedule(wait=1, warmup=1): the first profiled step is #2
COMPUTE_STREAM, NCCL_STREAM = 7, 28
HIDDEN, MB_ROWS = 4096, 32
ACTIVATION_BYTES = HIDDEN * MB_ROWS * 4
LAUNCH_LATENCY_NS = 4_000
NCCL_SETUP_NS, NCCL_TAIL_NS = 6_000, 3_000
NCCL_BYTES_PER_NS = 20.0  # 20 GB/s between neighbours

GEMM_FWD = "ampere_sgemm_32x32_sliced1x4_tn"
GEMM_BWD = "ampere_sgemm_32x128_nt"
_EW = "void at::native::vectorized_elementwise_kernel<4, "
CLAMP = (
    _EW + "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, "
    "c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() "
    "const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::"
    "{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
)
THRESHOLD = (
    _EW + "at::native::BinaryFunctor<float, float, float, at::native::(anonymous namespace)::threshold_kernel_impl"
    "<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}>, at::detail::Array<char*, 3> >(int, "
    "at::native::BinaryFunctor<float, float, float, at::native::(anonymous namespace)::threshold_kernel_impl<float>"
    "(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}>, at::detail::Array<char*, 3>)"
)
_SUM_OP = (
    "at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::"
    "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>"
)
SUM = f"void at::native::reduce_kernel<128, 4, {_SUM_OP} >({_SUM_OP})"
ADD = (
    _EW + "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, "
    "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)
SCALE = (
    _EW + "at::native::BUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
    "at::detail::Array<char*, 2> >(int, at::native::BUnaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2>)"
)
FILL = (
    _EW + "at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, "
    "at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
)
_MSE_F = (
    "at::native::mse_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::"
    "operator()() const::{lambda(float, float)#1}"
)
MSE = f"{_EW}{_MSE_F}, at::detail::Array<char*, 3> >(int, {_MSE_F}, at::detail::Array<char*, 3>)"
_MSE_B = (
    "at::native::mse_backward_cuda_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() "
    "const::{lambda()#2}::operator()() const::{lambda(float, float, float)#1}"
)
_MSE_B_IMPL = (
    f"at::native::gpu_kernel_impl_nocast<{_MSE_B}>(at::TensorIteratorBase&, {_MSE_B} const&)::{{lambda(int)#1}}"
)
MSE_BACKWARD = f"void at::native::elementwise_kernel<128, 2, {_MSE_B_IMPL}>(int, {_MSE_B_IMPL})"
FOREACH_ADD = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
    "std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous "
    "namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"
)
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
_CBID = {"cudaLaunchKernel": 211, "cudaEventRecord": 135}  # CUPTI callback ids as the real A100 trace has them
# kernel -> (mean duration ns, its share of jitter)
KERNEL_NS = {
    GEMM_FWD: 260_000,
    GEMM_BWD: 250_000,
    CLAMP: 14_000,
    THRESHOLD: 16_000,
    SUM: 22_000,
    ADD: 30_000,
    SCALE: 28_000,
    FILL: 3_000,
    MSE: 9_000,
    MSE_BACKWARD: 8_000,
    FOREACH_ADD: 90_000,
}


@dataclass(frozen=True)
class Variant:
    """What a real torch could vary in one such job."""

    name: str
    record_shapes: bool = True
    numbered_composites: bool = True  # aten::linear, aten::tensor_split record a number (as seen) or not
    wrapped_forward: bool = False  # a user record_function around each stage forward
    host_lag: int = 2  # at step N the host waits for step N - host_lag on the device; 0: at the end of step N
    p: int = 4
    m: int = 8
    steps: int = 3
    layers: int = 4
    seed: int = 29


VARIANTS = {
    v.name: v
    for v in (
        Variant("generated_independent_1f1b"),
        Variant("generated_independent_1f1b_no_shapes", record_shapes=False),
        Variant("generated_independent_1f1b_unnumbered_composites", numbered_composites=False),
        Variant("generated_independent_1f1b_wrapped_forward", wrapped_forward=True),
        Variant("generated_independent_1f1b_wrapped_unnumbered", wrapped_forward=True, numbered_composites=False),
        Variant("generated_independent_1f1b_synchronised", host_lag=0),
    )
}


@dataclass(eq=False)
class _Message:
    src: int
    dst: int
    step: int
    kind: str  # "F": an activation, "B": a gradient
    microbatch: int
    send_kernel: _Kernel | None = None
    recv_kernel: _Kernel | None = None
    start_ns: int | None = None
    end_ns: int | None = None


@dataclass(eq=False)
class _Kernel:
    name: str
    stream: int
    step: int
    launch_ns: int
    dur_ns: int
    correlation: int
    external_id: int
    previous: _Kernel | None  # the one before it on its stream
    after: list[_Kernel]  # other streams' kernels it waits for (events)
    messages: list[_Message] = field(default_factory=list)
    start_ns: int | None = None
    end_ns: int | None = None

    @property
    def is_comm(self) -> bool:
        return self.stream == NCCL_STREAM

    @property
    def span(self) -> tuple[int, int]:
        """(start, end), once simulated."""
        assert self.start_ns is not None and self.end_ns is not None, "the kernel is simulated first"
        return self.start_ns, self.end_ns


@dataclass
class _Node:
    backward: str  # "AddmmBackward0", ...
    seq: int
    made_by: dict[str, Any]  # the forward op event that created it


def _strides(dims: list[Any]) -> list[int]:
    """A contiguous tensor's strides (nothing for a list of tensors or a scalar)."""
    if not dims or not isinstance(dims[0], int):
        return []
    return [int(_product(dims[i + 1 :])) for i in range(len(dims))]


def _product(values: list[int]) -> int:
    out = 1
    for value in values:
        out *= value
    return out


Event = dict[str, Any]  # one trace event as written (host events: "start"/"end" ns until then)
# (step, kind, microbatch, src, dst) -> the one message both sides post
MessageOf = Callable[[int, str, int, int, int], _Message]


class _Thread:
    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.now = ORIGIN_NS
        self.open: list[Event] = []


class _Rank:
    """One rank's host threads, its launches and the events of its trace file."""

    def __init__(self, variant: Variant, rank: int, rng: random.Random) -> None:
        self.v, self.rank, self.rng = variant, rank, rng
        self.pid = 2_910_000 + 1_000 * rank
        self.main = _Thread(self.pid)
        self.engine = _Thread(self.pid + 9_503)
        self.events: list[Event] = []
        self.flows: list[Event] = []
        self.kernels: list[_Kernel] = []
        self.ids = {"external": 0, "record": 0, "correlation": 1_000 * (rank + 1), "flow": 0}
        self.seq = 0  # the main thread's next autograd node number
        self.step = -1
        self.last_on: dict[int, _Kernel] = {}
        self.waits: list[_Kernel] = []  # NCCL kernels the compute stream waits for from the next launch
        self.grads_seen: set[str] = set()  # parameters whose grad exists (later microbatches add to it)
        self.on_gpu: list[tuple[Event, list[_Kernel]]] = []  # annotations Kineto also shows on the GPU
        self.step_done: list[_Kernel] = []  # each step's last compute kernel (the user's event)
        self.actions: list[tuple[int, str, int]] = []  # (step, kind, microbatch) in the order run
        self.mark: Event = {}

    # --- host events -------------------------------------------------------------------
    def cost(self, mean_ns: int) -> int:
        return max(500, int(mean_ns * self.rng.uniform(0.8, 1.25)))

    def _next(self, key: str) -> int:
        self.ids[key] += 1
        return self.ids[key]

    @contextmanager
    def op(self, t: _Thread, name: str, cat: str = "cpu_op", seq: int | None = None, **extra: Any) -> Iterator[Event]:
        event = self.begin(t, name, cat, seq, **extra)
        yield event
        self.end(t, event)

    def begin(self, t: _Thread, name: str, cat: str = "cpu_op", seq: int | None = None, **extra: Any) -> Event:
        t.now += self.cost(2_000)
        args: dict[str, Any] = {"External id": self._next("external"), "Record function id": self._next("record")}
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 1 if t is self.engine else 0
        dims = extra.pop("shapes", [[MB_ROWS, HIDDEN]])
        types = extra.pop("types", ["float" if d else "" for d in dims])
        concrete = extra.pop("concrete", ["" for _ in dims])
        if self.v.record_shapes and cat == "cpu_op":
            args["Input Dims"], args["Input type"], args["Concrete Inputs"] = dims, types, concrete
            args["Input Strides"] = [_strides(d) for d in dims]
        args.update(extra)
        event = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": t.tid, "start": t.now, "args": args}
        self.events.append(event)
        t.open.append(event)
        t.now += self.cost(3_000)
        return event

    def end(self, t: _Thread, event: Event) -> None:
        t.now += self.cost(2_000)
        event["end"] = t.now
        t.open.remove(event)

    def leaf(self, t: _Thread, name: str, cost_ns: int = 4_000, **extra: Any) -> Event:
        with self.op(t, name, **extra) as event:
            t.now += self.cost(cost_ns)
        return event

    def runtime(self, t: _Thread, name: str, cat: str = "cuda_runtime", cost_ns: int = 3_000) -> Event:
        owner = t.open[-1]["args"]["External id"] if t.open else 0
        start = t.now + self.cost(1_000)
        t.now = start + self.cost(cost_ns)
        event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": t.tid}
        event |= {"start": start, "end": t.now}
        # CUPTI gives every API call a correlation id, not only launches
        event["args"] = {"External id": owner, "correlation": self._next("correlation")}
        if name in _CBID:
            event["args"]["cbid"] = _CBID[name]
        self.events.append(event)
        return event

    def launch(self, t: _Thread, kernel_name: str, api: str = "cudaLaunchKernel", cat: str = "cuda_runtime") -> _Kernel:
        event = self.runtime(t, api, cat, cost_ns=5_000)
        correlation = event["args"]["correlation"]
        stream = NCCL_STREAM if kernel_name == SENDRECV else COMPUTE_STREAM
        after = [] if stream == NCCL_STREAM else self.waits
        if stream == COMPUTE_STREAM:
            self.waits = []
        kernel = _Kernel(
            kernel_name,
            stream,
            self.step,
            event["end"],
            self.cost(KERNEL_NS.get(kernel_name, 10_000)),
            correlation,
            event["args"]["External id"],
            self.last_on.get(stream),
            after,
        )
        self.last_on[stream] = kernel
        self.kernels.append(kernel)
        self.flows.append({"ph": "s", "id": correlation, "pid": self.pid, "tid": t.tid, "ts": event["start"]})
        return kernel

    def flow(self, source: Event, target: Event) -> None:
        n = self._next("flow")
        self.flows.append(
            {"ph": "s", "cat": "fwdbwd", "id": n, "pid": self.pid, "tid": source["tid"], "ts": source["start"]}
        )
        self.flows.append(
            {"ph": "f", "cat": "fwdbwd", "id": n, "pid": self.pid, "tid": target["tid"], "ts": target["start"]}
        )

    # --- model ---------------------------------------------------------------------------
    @contextmanager
    def node(self, t: _Thread, name: str, backward: str, nodes: list[_Node], **extra: Any) -> Iterator[Event]:
        """An op that creates an autograd node: it records the number, the next op the next."""
        with self.op(t, name, seq=self.seq, **extra) as event:
            yield event
        nodes.append(_Node(backward, self.seq, event))
        self.seq += 1

    def forward(self, mb: int) -> list[_Node]:
        t, nodes = self.main, list[_Node]()
        weight = [[HIDDEN, HIDDEN]]
        for _ in range(self.v.layers):
            composite = self.seq if self.v.numbered_composites else None
            with self.op(t, "aten::linear", seq=composite, shapes=[[MB_ROWS, HIDDEN], [HIDDEN, HIDDEN], [HIDDEN]]):
                with self.node(t, "aten::t", "TBackward0", nodes, shapes=weight):
                    with self.op(t, "aten::transpose", shapes=weight + [[], []], concrete=["", "0", "1"]):
                        self.leaf(t, "aten::as_strided", shapes=weight + [[], [], []])
                shapes = [[HIDDEN], [MB_ROWS, HIDDEN], [HIDDEN, HIDDEN], [], []]
                with self.node(t, "aten::addmm", "AddmmBackward0", nodes, shapes=shapes):
                    with self.op(t, "aten::expand", shapes=[[HIDDEN], [], []]):
                        self.leaf(t, "aten::as_strided", shapes=[[HIDDEN], [], [], []])
                    self.launch(t, GEMM_FWD)
            with self.node(t, "aten::relu", "ReluBackward0", nodes):
                with self.op(t, "aten::clamp_min", shapes=[[MB_ROWS, HIDDEN], []], concrete=["", "0"]):
                    self.launch(t, CLAMP)
        return nodes

    def loss(self, nodes: list[_Node]) -> None:
        t = self.main
        with self.node(t, "aten::mse_loss", "MseLossBackward0", nodes, shapes=[[MB_ROWS, HIDDEN]] * 2 + [[]]):
            self.leaf(t, "aten::empty", shapes=[[], [], [], [], [], []])
            self.launch(t, MSE)

    def backward(self, nodes: list[_Node], mb: int) -> None:
        """``stage_backward``: a last stage seeds the gradient on the main thread; the engine
        runs every node on its device thread while the main thread waits."""
        main, e = self.main, self.engine
        if nodes and nodes[-1].backward == "MseLossBackward0":
            with self.op(main, "aten::ones_like", shapes=[[]]):
                self.leaf(main, "aten::empty_like", shapes=[[]])
                with self.op(main, "aten::fill_", shapes=[[], []]):
                    self.launch(main, FILL)
        e.now = max(e.now, main.now) + self.cost(25_000)
        layer = self.v.layers
        for node in reversed(nodes):
            layer -= node.backward == "AddmmBackward0"
            with self.op(e, f"autograd::engine::evaluate_function: {node.backward}", seq=node.seq):
                with self.op(e, node.backward, seq=node.seq) as made:
                    self._backward_body(node.backward)
                self.flow(node.made_by, made)
                if node.backward == "AddmmBackward0":
                    with self.op(e, "aten::sum", shapes=[[MB_ROWS, HIDDEN], [], [], []]):
                        self.launch(e, SUM)
                    self.leaf(e, "aten::view", shapes=[[1, HIDDEN], []])
            if node.backward == "AddmmBackward0":
                self.accumulate(f"bias{layer}", [HIDDEN])
                if layer == 0 and self.rank > 0:
                    self.accumulate(f"input{mb}", [MB_ROWS, HIDDEN])  # the receive buffer's grad
            elif node.backward == "TBackward0":
                self.accumulate(f"weight{layer}", [HIDDEN, HIDDEN])
        main.now = e.now + self.cost(15_000)

    def _backward_body(self, name: str) -> None:
        e = self.engine
        if name == "ReluBackward0":
            with self.op(e, "aten::threshold_backward", shapes=[[MB_ROWS, HIDDEN]] * 2 + [[]]):
                self.launch(e, THRESHOLD)
        elif name == "AddmmBackward0":
            for _ in range(2):
                with self.op(e, "aten::t"):
                    self.leaf(e, "aten::transpose")
                with self.op(e, "aten::mm", shapes=[[HIDDEN, MB_ROWS], [MB_ROWS, HIDDEN]]):
                    self.launch(e, GEMM_BWD)
        elif name == "TBackward0":
            with self.op(e, "aten::t", shapes=[[HIDDEN, HIDDEN]]):
                self.leaf(e, "aten::transpose")
        elif name == "MseLossBackward0":
            with self.op(e, "aten::mse_loss_backward", shapes=[[], [MB_ROWS, HIDDEN], [MB_ROWS, HIDDEN], [], []]):
                self.launch(e, MSE_BACKWARD)

    def accumulate(self, param: str, dims: list[int]) -> None:
        e = self.engine
        with self.op(e, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"):
            with self.op(e, "torch::autograd::AccumulateGrad", shapes=[dims]):
                if param in self.grads_seen:
                    with self.op(e, "aten::add_", shapes=[dims, dims, []]):
                        self.launch(e, ADD)
                else:  # the first grad is stolen, not added (detach)
                    self.grads_seen.add(param)
                    with self.op(e, "aten::detach", shapes=[dims]):
                        self.leaf(e, "detach", shapes=[dims])

    # --- point-to-point ------------------------------------------------------------------
    def batch(self, ops: list[tuple[str, _Message]]) -> _Kernel | None:
        """``dist.batch_isend_irecv`` of ("send" | "recv", message) ops; None for no op."""
        if not ops:
            return None
        t = self.main
        for way, message in ops:
            peer = message.dst if way == "send" else message.src
            name, title = ("c10d::send", f"nccl:send {self.rank}->{peer}")
            if way == "recv":
                name, title = "c10d::recv_", f"nccl:recv {self.rank}<-{peer}"
            shapes = [[[MB_ROWS, HIDDEN]], [], [], []]
            concrete = ["", "", str(peer), "0"]
            types = ["TensorList", "ScriptObject", "Scalar", "Scalar"]
            with self.op(t, name, seq=self.seq, shapes=shapes, concrete=concrete, types=types):
                with self.op(t, "record_param_comms", shapes=[[[MB_ROWS, HIDDEN]]], **self._comm_args(way)):
                    self.runtime(t, "cudaEventRecord")
                    self.runtime(t, "cudaStreamWaitEvent")
                    with self.op(t, title, cat="user_annotation"):
                        t.now += self.cost(8_000)
        compute_so_far = self.last_on.get(COMPUTE_STREAM)
        with self.op(t, "nccl:coalesced", cat="user_annotation") as annotation:
            kernel = self.launch(t, SENDRECV, api="cuLaunchKernelEx", cat="cuda_driver")
        kernel.after = [compute_so_far] if compute_so_far is not None else []
        self.on_gpu.append((annotation, [kernel]))
        for way, message in ops:
            kernel.messages.append(message)
            if way == "send":
                message.send_kernel = kernel
            else:
                message.recv_kernel = kernel
        return kernel

    def _comm_args(self, way: str) -> dict[str, Any]:
        """``record_param_comms``' args, the keys the real NCCL trace's have (a torch of the
        per-op titles' era: no ``Rank``/``Dst Rank``/``Src Rank`` yet)."""
        return {
            "Collective name": way,
            "dtype": "Float",
            "In msg nelems": MB_ROWS * HIDDEN,
            "Out msg nelems": MB_ROWS * HIDDEN,
            "In split size": "[]",
            "Out split size": "[]",
            "Global rank start": 0,
            "Global rank stride": 1,
            "Group size": self.v.p,
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(self.v.p))),
        }

    def wait(self, kernel: _Kernel | None) -> None:
        """``work.wait()``: the compute stream waits for the kernel; the host goes on."""
        if kernel is not None:
            self.runtime(self.main, "cudaStreamWaitEvent")
            self.waits.append(kernel)

    # --- one training step -----------------------------------------------------------------
    def begin_step(self, step: int, wait_for: _Kernel | None, message: MessageOf) -> None:
        """The user's loop up to the optimizer step (the ProfilerStep stays open): wait for an
        earlier step's event, ``zero_grad``, ``schedule.step``, ``optimizer.step``."""
        t = self.main
        self.step = step
        self.grads_seen = set()  # zero_grad(set_to_none=True), and the stage clears its buffers' grads
        t.now = max(t.now, self.engine.now) + self.cost(40_000)
        self.mark = self.begin(t, f"ProfilerStep#{FIRST_STEP + step}", "user_annotation")
        if wait_for is not None:
            self.synchronize(wait_for)
        with self.op(t, "Optimizer.zero_grad#SGD.zero_grad", "user_annotation"):
            pass
        self.schedule_step(message)
        with self.op(t, "Optimizer.step#SGD.step", "user_annotation") as annotation:
            params = [[HIDDEN, HIDDEN], [HIDDEN]] * self.v.layers
            with self.op(t, "aten::_foreach_add_", shapes=[params, params, []], concrete=["", "", "-0.001"]):
                done = self.launch(t, FOREACH_ADD)
        self.on_gpu.append((annotation, [done]))
        self.runtime(t, "cudaEventRecord")  # the user's event: step done on the device
        self.step_done.append(done)

    def end_step(self, synchronised: bool) -> None:
        if synchronised:
            self.synchronize(self.step_done[-1])
        self.end(self.main, self.mark)
        self.on_gpu.append((self.mark, [k for k in self.kernels if k.step == self.step]))

    def synchronize(self, done: _Kernel) -> None:
        """``event.synchronize()``: the host blocks until the device ran ``done``."""
        event = self.runtime(self.main, "cudaEventSynchronize")
        assert done.end_ns is not None, "a step's device work is simulated before the host waits for it"
        event["end"] = self.main.now = max(event["end"], done.end_ns + self.cost(6_000))

    def schedule_step(self, message: MessageOf) -> None:
        """``Schedule1F1B.step``: split the batch, then ``_step_microbatches`` as schedules.py has it."""
        v, r, t = self.v, self.rank, self.main
        first, last = r == 0, r == v.p - 1
        if first or last:  # the input batch (first stage), the targets (last stage)
            composite = self.seq if v.numbered_composites else None
            with self.op(t, "aten::tensor_split", seq=composite, shapes=[[v.m * MB_ROWS, HIDDEN], [], []]):
                for _ in range(v.m):
                    self.leaf(t, "aten::slice", 1_500, seq=self.seq, shapes=[[v.m * MB_ROWS, HIDDEN], [], [], [], []])

        def recv_f(mb: int) -> list[tuple[str, _Message]]:
            return [] if first else [("recv", message(self.step, "F", mb, r - 1, r))]

        def recv_b(mb: int) -> list[tuple[str, _Message]]:
            return [] if last else [("recv", message(self.step, "B", mb, r + 1, r))]

        def send_b(mb: int) -> list[tuple[str, _Message]]:
            return [] if first else [("send", message(self.step, "B", mb, r, r - 1))]

        def fwd_send_ops(mb: int) -> list[tuple[str, _Message]]:
            if last:
                return []
            with self.op(t, "aten::detach", seq=self.seq):
                self.leaf(t, "detach", 1_500)
            return [("send", message(self.step, "F", mb, r, r + 1))]

        warmup = min(v.m, v.p - r)
        saved: dict[int, list[_Node]] = {}
        fwd = bwd = 0
        send_work: _Kernel | None = None
        fwd_sends: list[tuple[str, _Message]] = []
        for _ in range(warmup):
            self.wait(self.batch(recv_f(fwd)))
            saved[fwd] = self.stage_forward(fwd)
            self.wait(send_work)
            fwd_sends = fwd_send_ops(fwd)
            if fwd != warmup - 1:
                send_work = self.batch(fwd_sends)
            if last:
                self.loss(saved[fwd])
            fwd += 1
        while True:
            self.wait(self.batch(fwd_sends + recv_b(bwd)))
            self.stage_backward(saved.pop(bwd), bwd)
            bwd_sends = send_b(bwd)
            bwd += 1
            if fwd == v.m:
                break
            self.wait(self.batch(bwd_sends + recv_f(fwd)))
            saved[fwd] = self.stage_forward(fwd)
            if last:
                self.loss(saved[fwd])
            fwd_sends = fwd_send_ops(fwd)
            fwd += 1
        send_work = self.batch(bwd_sends)
        while bwd < v.m:
            self.wait(self.batch(recv_b(bwd)))
            self.stage_backward(saved.pop(bwd), bwd)
            self.wait(send_work)
            send_work = self.batch(send_b(bwd))
            bwd += 1
        self.wait(send_work)
        for dims in [[HIDDEN, HIDDEN], [HIDDEN]] * v.layers:  # scale_grads
            with self.op(t, "aten::div_", seq=self.seq, shapes=[dims, []], concrete=["", str(v.m)]):
                self.launch(t, SCALE)

    def stage_forward(self, mb: int) -> list[_Node]:
        self.actions.append((self.step, "F", mb))
        if not self.v.wrapped_forward:
            return self.forward(mb)
        with self.op(self.main, "stage_forward", "user_annotation"):
            return self.forward(mb)

    def stage_backward(self, nodes: list[_Node], mb: int) -> None:
        self.actions.append((self.step, "B", mb))
        self.backward(nodes, mb)


# --- the devices -----------------------------------------------------------------------------
def _simulate(ranks: list[_Rank], step: int) -> None:
    """Start and end of every kernel of the step on every GPU: a stream runs its kernels in
    launch order, a kernel starts after its launch and the events it waits for; a SendRecv
    kernel's message moves once both its kernels run, and the kernel ends with its last."""
    todo = [k for rank in ranks for k in rank.kernels if k.step == step]
    while todo:
        known = sum(k.start_ns is not None for k in todo)
        for k in todo:
            if k.start_ns is None:
                before = [d for d in [k.previous, *k.after] if d is not None]
                if all(d.end_ns is not None for d in before):
                    k.start_ns = max([k.launch_ns + LAUNCH_LATENCY_NS] + [d.span[1] for d in before])
            if k.end_ns is None:
                k.end_ns = _end_of(k)
        left = [k for k in todo if k.end_ns is None]
        if len(left) == len(todo) and sum(k.start_ns is not None for k in left) == known:
            raise RuntimeError(f"step {step}: the generated schedule deadlocks")
        todo = left


def _end_of(k: _Kernel) -> int | None:
    """When the kernel ends, or None while that is not known yet."""
    if k.start_ns is None:
        return None
    if not k.is_comm:
        return k.start_ns + k.dur_ns
    ends = []
    for m in k.messages:
        send, recv = m.send_kernel, m.recv_kernel
        if send is None or recv is None or send.start_ns is None or recv.start_ns is None:
            return None
        m.start_ns = max(send.start_ns, recv.start_ns) + NCCL_SETUP_NS
        m.end_ns = m.start_ns + int(ACTIVATION_BYTES / NCCL_BYTES_PER_NS)
        ends.append(m.end_ns)
    return max(ends) + NCCL_TAIL_NS


# --- the truth -------------------------------------------------------------------------------
def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _clipped(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def _bubbles(ranks: list[_Rank], steps: int) -> list[dict[str, Any]]:
    """Per step and rank: the device window, busy and idle (tests/device_reference.py's rules)."""
    rows: list[dict[str, Any]] = []
    previous_end: int | None = None
    compute = {r.rank: [k for k in r.kernels if not k.is_comm] for r in ranks}
    for step in range(steps):
        of_step = {rank: [k.span for k in ks if k.step == step] for rank, ks in compute.items()}
        lo = min(s for spans in of_step.values() for s, _ in spans)
        hi = max(e for spans in of_step.values() for _, e in spans)
        if previous_end is not None:
            lo = min(max(lo, previous_end), hi)
        previous_end = hi if previous_end is None else max(hi, previous_end)
        for rank, ks in compute.items():
            idle = (hi - lo) - _union_ns(_clipped([k.span for k in ks], lo, hi))
            busy = _union_ns(of_step[rank])
            window = busy + idle
            rows.append(
                {"rank": rank, "step": FIRST_STEP + step, "window_ns": window, "busy_ns": busy, "idle_ns": idle}
                | {"bubble_ratio": idle / window, "window_start_ns": lo, "window_end_ns": hi}
            )
    return rows


def _truth(v: Variant, ranks: list[_Rank], messages: list[_Message]) -> Event:
    rows = _bubbles(ranks, v.steps)
    per_rank = []
    for rank in range(v.p):
        mine = [row for row in rows if row["rank"] == rank]
        window, idle = sum(r["window_ns"] for r in mine), sum(r["idle_ns"] for r in mine)
        per_rank.append({"rank": rank, "window_ns": window, "idle_ns": idle, "bubble_ratio": idle / window})
    return {
        "schedule": ("1F1B", v.p, 1, v.m),
        "steps": [FIRST_STEP + s for s in range(v.steps)],
        "bubbles": rows,
        "ranks": per_rank,
        "actions": [
            {"rank": r.rank, "step": FIRST_STEP + step, "stage": r.rank, "kind": kind, "microbatch": mb}
            for r in ranks
            for step, kind, mb in r.actions
        ],
        "messages": [_message_truth(m) for m in messages],
    }


def _message_truth(m: _Message) -> dict[str, Any]:
    assert m.send_kernel is not None and m.recv_kernel is not None and m.start_ns is not None and m.end_ns is not None
    (send_start, send_end), (recv_start, recv_end) = m.send_kernel.span, m.recv_kernel.span
    return {
        "step": FIRST_STEP + m.step,
        "src_rank": m.src,
        "dst_rank": m.dst,
        "kind": m.kind,
        "microbatch": m.microbatch,
        "send_start_ns": send_start,
        "send_end_ns": send_end,
        "recv_start_ns": recv_start,
        "recv_end_ns": recv_end,
        "transfer_ns": m.end_ns - m.start_ns,
    }


# --- the files -------------------------------------------------------------------------------
def _ts(ns: int) -> float:
    return round(ns / 1000, 3)


def _kernel_rows(rank: _Rank) -> list[Event]:
    rows = []
    for k in rank.kernels:
        args = {
            "External id": k.external_id,
            "queued": 0,
            "device": rank.rank,
            "context": 1,
            "stream": k.stream,
            "correlation": k.correlation,
            "registers per thread": 96 if k.is_comm else 32,
            "shared memory": 0,
            "blocks per SM": 0.03 if k.is_comm else 1.5,
            "warps per SM": 0.5 if k.is_comm else 12.0,
            "grid": [2, 1, 1] if k.is_comm else [256, 1, 1],
            "block": [640, 1, 1] if k.is_comm else [128, 1, 1],
            "est. achieved occupancy %": 1 if k.is_comm else 25,
        }
        start, dur = _ts(k.span[0]), _ts(k.span[1] - k.span[0])
        rows.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": k.name,
                "pid": rank.rank,
                "tid": k.stream,
                "ts": start,
                "dur": dur,
                "args": args,
            }
        )
        rows.append(
            {
                "ph": "f",
                "id": k.correlation,
                "pid": rank.rank,
                "tid": k.stream,
                "ts": start,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
    for annotation, kernels in rank.on_gpu:
        if kernels:
            lo, hi = min(k.span[0] for k in kernels), max(k.span[1] for k in kernels)
            stream = kernels[0].stream
            row = {"ph": "X", "cat": "gpu_user_annotation", "name": annotation["name"], "pid": rank.rank, "tid": stream}
            rows.append(
                row | {"ts": _ts(lo), "dur": _ts(hi - lo), "args": {"External id": annotation["args"]["External id"]}}
            )
    return rows


def _metadata(rank: _Rank) -> list[Event]:
    def meta(kind: str, pid: int, tid: int, **args: Any) -> Event:
        return {"name": kind, "ph": "M", "ts": _ts(ORIGIN_NS - 5_000), "pid": pid, "tid": tid, "args": args}

    main, engine = rank.main.tid, rank.engine.tid
    return [
        meta("process_name", rank.pid, 0, name="python3.11"),
        meta("process_labels", rank.pid, 0, labels="CPU"),
        meta("process_sort_index", rank.pid, 0, sort_index=rank.pid),
        meta("process_name", rank.rank, 0, name="python3.11"),
        meta("process_labels", rank.rank, 0, labels=f"GPU {rank.rank}"),
        meta("process_sort_index", rank.rank, 0, sort_index=16_777_216 + rank.rank),
        meta("thread_name", rank.rank, COMPUTE_STREAM, name=f"stream {COMPUTE_STREAM} "),
        meta("thread_name", rank.rank, NCCL_STREAM, name=f"stream {NCCL_STREAM} "),
        meta("thread_name", rank.pid, main, name=f"thread {main} (pt_main_thread)"),
        meta("thread_name", rank.pid, engine, name=f"thread {engine} (pt_main_thread)"),
        meta("thread_name", rank.pid, engine, name=f"thread {engine} (pt_autograd_0)"),
    ]


def _write(v: Variant, rank: _Rank, folder: Path) -> None:
    host = []
    for e in rank.events:
        row = {k: e[k] for k in ("ph", "cat", "name", "pid", "tid")}
        host.append(row | {"ts": _ts(e["start"]), "dur": _ts(e["end"] - e["start"]), "args": e["args"]})
    flows = []
    for f in rank.flows:
        cat = f.get("cat", "ac2g")
        row = {
            "ph": f["ph"],
            "id": f["id"],
            "pid": f["pid"],
            "tid": f["tid"],
            "ts": _ts(f["ts"]),
            "cat": cat,
            "name": cat,
        }
        flows.append(row | ({"bp": "e"} if f["ph"] == "f" else {}))
    events = sorted(host + _kernel_rows(rank), key=lambda e: (e["ts"], -e.get("dur", 0)))
    first = min(e["ts"] for e in events)
    last = max(e["ts"] + e.get("dur", 0) for e in events)
    span = {"ph": "X", "cat": "Trace", "ts": first, "dur": round(last - first, 3), "pid": "Spans"}
    span |= {"tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}}
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": r, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0} for r in range(v.p)
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank.rank,
            "world_size": v.p,
            "pg_count": 1,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": v.p,
                    "ranks": list(range(v.p)),
                }
            ],
            "nccl_version": "2.21.5",
        },
        "traceName": f"{v.name}/rank{rank.rank}.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
        "traceEvents": _metadata(rank) + events + flows + [span],
    }
    if v.record_shapes:
        doc["record_shapes"] = 1
    with gzip.open(folder / f"rank{rank.rank}.json.gz", "wt") as out:
        json.dump(doc, out)


def generate(variant: Variant | str, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Write the variant's rank files into ``out_dir/<variant name>``; return that folder and
    the truth (see the module doc)."""
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    assert v.name.startswith("generated_"), "a generated run says so in its name"
    rng = random.Random(v.seed)
    ranks = [_Rank(v, r, rng) for r in range(v.p)]
    messages: dict[tuple[int, str, int, int, int], _Message] = {}

    def message(step: int, kind: str, mb: int, src: int, dst: int) -> _Message:
        return messages.setdefault((step, kind, mb, src, dst), _Message(src, dst, step, kind, mb))

    for step in range(v.steps):
        for rank in ranks:
            lag = v.host_lag
            rank.begin_step(step, rank.step_done[step - lag] if lag and step >= lag else None, message)
        _simulate(ranks, step)
        for rank in ranks:
            rank.end_step(synchronised=v.host_lag == 0)
    folder = out_dir / v.name
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        _write(v, rank, folder)
    return folder, _truth(v, ranks, list(messages.values()))


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp")
    for name in VARIANTS:
        print(generate(name, target)[0])
