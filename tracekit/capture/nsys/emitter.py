"""NVTX ranges as ``emit_nvtx(record_shapes=True)`` writes them, for a CPU-only torch build.

Runs inside each rank (imports torch and nvtx only when used)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from torch import Tensor
    from torch._ops import OpOverload
    from torch.autograd.profiler import record_function

# record_function's own ops: its enter/exit, not work (Kineto does not show them either)
_UNTRACED_NAMESPACES = ("profiler::",)
_GLOO_LABELS = {"c10d::send": "gloo:send", "c10d::recv_": "gloo:recv", "c10d::recv_any_source_": "gloo:recv"}


class NvtxOpEmitter:
    """What ``emit_nvtx(record_shapes=True)`` records, for CPU-only torch builds.

    torch's CPU wheels have no NVTX, so emit_nvtx raises; this writes the same range
    texts from Python: ops through a TorchDispatchMode (the op as dispatched below
    autograd: ``aten::linear`` shows as its ``aten::t`` and ``aten::addmm``), autograd
    Functions by patching ``Function.apply``, backward nodes by hooks installed when
    ``torch.autograd.backward``/``grad`` run, ``record_function`` labels by patching it,
    and gloo sends/receives as start/end ranges from post to ``wait()``.
    """

    def __init__(self) -> None:
        import nvtx
        import torch

        # modules kept on the emitter so its hot path (every op) does no import
        self._nvtx: ModuleType = nvtx
        self._torch: ModuleType = torch
        self._op_id = 0
        self._mode: Any = None  # a TorchDispatchMode (torch leaves its methods unannotated)
        self.pending_range: object = None  # the gloo range started inside the last c10d send/recv
        self._patches: list[tuple[object, str, object]] = []

    # -- text --------------------------------------------------------------------------
    def _next_id(self) -> int:
        self._op_id += 1
        return self._op_id

    def _text(self, name: str, seq: int, inputs: Sequence[object] = ()) -> str:
        text = name
        if seq >= 0:
            text += f", seq = {seq}"
        text += f", op_id = {self._next_id()}"
        shapes = [self._shape(x) for x in inputs]
        if shapes:
            text += ", sizes = [" + ", ".join(shapes) + "]"
        return text

    def _shape(self, value: object) -> str:
        if isinstance(value, self._torch.Tensor):
            return "[" + ", ".join(str(d) for d in value.shape) + "]"
        return "[]"

    def push(self, text: str) -> None:
        self._nvtx.push_range(text)

    def pop(self) -> None:
        self._nvtx.pop_range()

    def _seq_now(self, made_node: bool) -> int:
        if not self._torch.is_grad_enabled():
            return -1
        peek: int = self._torch._C._autograd._get_sequence_nr()
        return peek - 1 if made_node else peek

    # -- install -----------------------------------------------------------------------
    def __enter__(self) -> NvtxOpEmitter:
        torch = self._torch
        from torch.utils._python_dispatch import TorchDispatchMode

        emitter = self

        class _OpRanges(TorchDispatchMode):
            def __init__(self) -> None:  # TorchDispatchMode's own __init__ is unannotated
                TorchDispatchMode.__init__(self)

            def __torch_dispatch__(
                self,
                func: OpOverload,
                types: Sequence[type],
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                if func._schema.name.startswith(_UNTRACED_NAMESPACES):
                    return func(*args, **(kwargs or {}))
                flat = list(args) + list((kwargs or {}).values())
                made_node = any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat)
                name = func._schema.name
                emitter.push(emitter._text(name, emitter._seq_now(made_node), args))
                try:
                    out = func(*args, **(kwargs or {}))
                    if name in _GLOO_LABELS:
                        # ProcessGroupGloo starts its own RecordFunction inside the op
                        tensors = args[0] if args and isinstance(args[0], (list, tuple)) else args[:1]
                        emitter.pending_range = emitter._nvtx.start_range(
                            emitter._text(_GLOO_LABELS[name], -1, tensors)
                        )
                    return out
                finally:
                    emitter.pop()

        self._patch_record_function()
        self._patch_function_apply()
        self._patch_backward()
        self._patch_p2p()
        self._mode = _OpRanges()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        for owner, attr, original in reversed(self._patches):
            setattr(owner, attr, original)
        self._patches.clear()
        return False

    def _set(self, owner: object, attr: str, value: object) -> None:
        # a class's own entry as stored (a classmethod itself, not the method bound to the class)
        own = vars(owner) if isinstance(owner, type) else {}
        self._patches.append((owner, attr, own[attr] if attr in own else getattr(owner, attr)))
        setattr(owner, attr, value)

    def _patch_record_function(self) -> None:
        from torch.autograd.profiler import record_function

        # torch leaves record_function's __enter__ (returns self) and __exit__ unannotated
        enter = cast("Callable[[record_function], record_function]", record_function.__enter__)
        leave = cast("Callable[..., None]", record_function.__exit__)
        emitter = self

        def __enter__(rf: record_function) -> record_function:
            emitter.push(emitter._text(rf.name, -1))
            return enter(rf)

        def __exit__(rf: record_function, *exc: Any) -> None:
            try:
                return leave(rf, *exc)
            finally:
                emitter.pop()

        self._set(record_function, "__enter__", __enter__)
        self._set(record_function, "__exit__", __exit__)

    def _patch_function_apply(self) -> None:
        from torch.autograd.function import Function

        apply, emitter = Function.__dict__["apply"].__func__, self

        def traced(cls: type[Function], *args: Any, **kwargs: Any) -> Any:
            emitter.push(emitter._text(cls.__name__, emitter._seq_now(False), args))
            try:
                return apply(cls, *args, **kwargs)
            finally:
                emitter.pop()

        self._set(Function, "apply", classmethod(traced))

    def _patch_backward(self) -> None:
        torch, emitter = self._torch, self
        backward, grad = torch.autograd.backward, torch.autograd.grad

        def hooked_backward(tensors: Any, *args: Any, **kwargs: Any) -> object:
            emitter._hook_graph(tensors)
            return backward(tensors, *args, **kwargs)

        def hooked_grad(outputs: Any, *args: Any, **kwargs: Any) -> object:
            emitter._hook_graph(outputs)
            return grad(outputs, *args, **kwargs)

        self._set(torch.autograd, "backward", hooked_backward)
        self._set(torch.autograd, "grad", hooked_grad)

    def _hook_graph(self, roots: Any) -> None:
        """Give every node reachable from ``roots`` a range: autograd's evaluate_function."""
        torch = self._torch
        if isinstance(roots, (torch.Tensor, torch.autograd.graph.GradientEdge)):
            roots = [roots]
        # autograd's C++ nodes; torch's Node ABC types ``metadata`` as a method, a dict at run time
        stack: list[Any] = []
        for root in roots:
            node = root.grad_fn if isinstance(root, torch.Tensor) else getattr(root, "node", None)
            if node is not None:
                stack.append(node)
        while stack:
            node = stack.pop()
            if node.metadata.get("_tracekit_nvtx"):
                continue
            node.metadata["_tracekit_nvtx"] = True
            name = node.name()
            seq = node._sequence_nr()
            seq = seq if 0 <= seq < 2**62 and "AccumulateGrad" not in name else -1
            node.register_prehook(self._node_enter(name, seq))
            node.register_hook(self._node_exit)
            stack.extend(n for n, _ in node.next_functions if n is not None)

    def _node_enter(self, name: str, seq: int) -> Callable[[tuple[Tensor | None, ...]], None]:
        def enter(grad_outputs: tuple[Tensor | None, ...]) -> None:
            self.push(self._text(f"autograd::engine::evaluate_function: {name}", seq))
            self.push(self._text(name, seq, grad_outputs))

        return enter

    def _node_exit(self, grad_inputs: tuple[Tensor | None, ...], grad_outputs: tuple[Tensor | None, ...]) -> None:
        self.pop()
        self.pop()

    def _patch_p2p(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        emitter = self

        def traced(post: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                emitter.pending_range = None
                work = post(*args, **kwargs)
                range_id, emitter.pending_range = emitter.pending_range, None
                if range_id is None:
                    return work
                return _EndOnWait(work, lambda: emitter._nvtx.end_range(range_id))

            call.__wrapped__ = post  # type: ignore[attr-defined]  # functools.wraps' marker, set by hand
            return call

        isend, irecv = traced(c10d.isend), traced(c10d.irecv)
        # batch_isend_irecv and P2POp compare ops with c10d's globals: patch both names
        for owner in (c10d, dist):
            self._set(owner, "isend", isend)
            self._set(owner, "irecv", irecv)


class _EndOnWait:
    """A posted send/recv whose NVTX range ends when ``wait()`` returns."""

    def __init__(self, work: Any, end: Callable[[], None] | None) -> None:
        self._work, self._end = work, end

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return self._work.wait(*args, **kwargs) if self._work is not None else True
        finally:
            if self._end is not None:
                self._end()
                self._end = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._work, attr)


def emitter_for_this_torch() -> tuple[AbstractContextManager[object], str]:
    import torch

    if torch.cuda.is_available():
        how = "torch.autograd.profiler.emit_nvtx(record_shapes=True)"
        return torch.autograd.profiler.emit_nvtx(record_shapes=True), how
    return NvtxOpEmitter(), (
        "tracekit NvtxOpEmitter: emit_nvtx's range texts written from Python "
        "(this torch has no CUDA, so emit_nvtx cannot run)"
    )
