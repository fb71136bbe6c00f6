"""Event names the stages agree on (plain constants: parser workers import this too)."""

# Communication and pipeline-label ops: never compute, kept whole in every working set.
COMM_PREFIXES = ("c10d::", "gloo:", "record_param_comms", "nccl:", "tracekit:p2p", "PP:")
# The communication libraries' own ranges (gloo:recv spans posting to the wait's return):
# never a pipeline label, whatever the label rules say.
LIBRARY_RANGES = ("c10d::", "gloo:", "record_param_comms", "nccl:", "tracekit:p2p")
# Point-to-point ops as the event table names them (NCCL's record_param_comms renamed by
# collective at parse time).
SEND_NAMES = ("c10d::send", "record_param_comms:send")
RECV_NAMES = ("c10d::recv_", "c10d::recv_any_source_", "record_param_comms:recv")
# torch.profiler's step markers: ProfilerStep#N.
STEP_MARK_PREFIX = "ProfilerStep#"
