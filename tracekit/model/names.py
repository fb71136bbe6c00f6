"""Event names the stages agree on (plain constants: parser workers import this too)."""

import re

# Communication and pipeline-label ops: never compute, kept whole in every working set.
COMM_PREFIXES = ("c10d::", "gloo:", "record_param_comms", "nccl:", "tracekit:p2p", "PP:")
# The communication libraries' own ranges (gloo:recv spans posting to the wait's return):
# never a pipeline label, whatever the label rules say.
LIBRARY_RANGES = ("c10d::", "gloo:", "record_param_comms", "nccl:", "tracekit:p2p")
# Point-to-point ops as the event table names them (NCCL's record_param_comms renamed by
# collective at parse time).
SEND_NAMES = ("c10d::send", "record_param_comms:send")
RECV_NAMES = ("c10d::recv_", "c10d::recv_any_source_", "record_param_comms:recv")
# Megatron's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py): autograd
# Functions whose apply (and backward node, "<name>Backward") holds one TP collective and its
# wait: _ReduceFromModelParallelRegion, _CopyToModelParallelRegionBackward,
# _GatherFromSequenceParallelRegion, _ReduceScatterToSequenceParallelRegion, ...
TP_REGION = re.compile(r"^_[A-Za-z]+(?:Model|Sequence|Tensor)ParallelRegion(?:Backward)?$")
# gloo's worker-thread range of a collective's work (ProcessGroupGloo; not its gloo:send /
# gloo:recv): when a posted collective was done.
GLOO_COLLECTIVE = re.compile(
    r"^gloo:(?:all_reduce|allreduce|all_gather|allgather|reduce_scatter|all_to_all|alltoall|broadcast|reduce)"
)
# torch.profiler's step markers: ProfilerStep#N.
STEP_MARK_PREFIX = "ProfilerStep#"

# torch.profiler's with_stack writes a python_function event for every Python call (several a
# CPU op: the module's frames, _call_impl, forward, the builtin that runs the op). The ones
# read as labels are the frames of a framework's action entry points, which name every compute
# action: Megatron's forward_step and backward_step, in megatron/schedules.py (Megatron-LM
# before 2023-03) or megatron/core/pipeline_parallel/schedules.py (Megatron-core), both
# schedules, interleaved or not (torch trims the site-packages or sys.path prefix of a file;
# any other is allowed). A training script's own forward_step (pretrain_gpt.py) is not one.
FRAME_CATEGORY = "python_function"
_MEGATRON_SCHEDULES = r"(?:^|/)megatron/(?:core/pipeline_parallel/)?schedules\.py\(\d+\): "
MEGATRON_FORWARD_FRAME = _MEGATRON_SCHEDULES + r"forward_step\Z"
MEGATRON_BACKWARD_FRAME = _MEGATRON_SCHEDULES + r"backward_step\Z"
_ACTION_FRAME = re.compile(f"{MEGATRON_FORWARD_FRAME}|{MEGATRON_BACKWARD_FRAME}")
# The frames of nn.Module calls are kept too, no label: ``nn.Module: <Class>_<k>`` (torch
# numbers each class's instances per process), the model's own names for its layers
# (tracekit.analyze.layers reads them).
MODULE_FRAME = re.compile(r"^nn\.Module: (?P<cls>.+)_(?P<index>\d+)\Z")
# How every kept frame's name ends (an action frame's, a module frame's digit): the native
# scanner drops a frame whose name ends otherwise on its last bytes, without reading the name
# (thousands of distinct calls a trace).
ACTION_FRAME_ENDINGS = ("): forward_step", "): backward_step")
KEPT_FRAME_ENDINGS = ACTION_FRAME_ENDINGS + tuple("0123456789")


def is_action_frame(name: str) -> bool:
    """Whether a python_function event of this name names an action (see above)."""
    return name.endswith(ACTION_FRAME_ENDINGS) and _ACTION_FRAME.search(name) is not None


def is_kept_frame(name: str) -> bool:
    """Whether a python_function event of this name is a frame ingest keeps: an action's or
    an nn.Module call's (see above)."""
    return is_action_frame(name) or MODULE_FRAME.match(name) is not None
