"""GENERATED GPU pipeline traces with known ground truth, for unit tests. Not real traces.

A small simulator of a pipeline-parallel training job on GPUs (one rank per GPU, NCCL P2P)
and a writer of one Kineto (PyTorch profiler) JSON file per rank, ``rank{R}.json.gz``, in a
folder named ``generated_<name>``. Nothing here was captured on a GPU: every number comes from
the simulation, and :func:`generate` returns (and writes as ``generated_<name>.truth.json``
beside the folder) what the simulation knows, so tests can hold tracekit to it.

What is simulated, per rank:

- The host walks the schedule's action order and launches each action's kernels; each launch
  costs ``launch_ns`` of host time (the op span), the ``cudaLaunchKernel`` sits inside it.
  Forward ops run on the main thread; backward ops on the autograd device thread
  (``autograd::engine::evaluate_function: ...Backward0``, as in real GPU traces, where the
  engine runs CUDA backward on ``pt_autograd_<device>``), with the forward's "Sequence number".
- The compute stream runs kernels in launch order: start = max(launch end + latency, previous
  kernel end on the stream, data dependency). A forward on stage s > 0 waits for the receive
  of its activations, a backward on its gradient (``cudaStreamWaitEvent`` on the recv's end).
- P2P: after a producer action the host launches a send, before a consumer action a recv
  (``c10d::send`` / ``c10d::recv_`` > ``record_param_comms`` > ``nccl:send a->b`` /
  ``nccl:recv b<-a`` > ``cudaLaunchKernel`` of ``ncclDevKernel_SendRecv``). As in
  ProcessGroupNCCL's syncStreams, the NCCL stream first waits for everything already launched
  on the compute stream. A SendRecv kernel starts when its stream lets it, spins until its
  peer's kernel has started, then both transfer: both end at
  max(send start, recv start) + transfer_ns(link).
- Step end: optimizer kernels (``Optimizer.step#SGD.step``) after the last action; with
  ``host_sync`` a ``cudaDeviceSynchronize`` ends the step. Without it the host runs ahead of
  the device: at the start of step N it only waits (``cudaEventSynchronize``) for the device
  to finish step N-2, so it is up to about one step ahead.

Guesses and simplifications (not read off a real multi-GPU pipeline trace; there is none here):

- By default, one NCCL stream per peer AND direction and every SendRecv kernel one send or one
  recv (a simplification). With ``fused_p2p`` (scenarios ``fused_*``), what torch's native
  ``Schedule1F1B`` does on NCCL, read off torch's source (pipelining/schedules.py,
  distributed_c10d.py ``batch_isend_irecv`` / ``_coalescing_manager``, ProcessGroupNCCL
  ``pointToPoint`` / ``endCoalescing``): every P2P op goes through ``batch_isend_irecv``; the
  last warmup forward's send and the 1B1F phase's sends are held and posted with the next
  action's recv (``fwd_send_bwd_recv``, ``bwd_send_fwd_recv``: one peer, a send and a recv),
  the others alone. Each op's ``c10d::send`` / ``c10d::recv_`` > ``record_param_comms`` and
  syncStreams happen as usual but launch nothing and open no ``nccl:send``/``nccl:recv`` range;
  the group's end, a ``nccl:coalesced`` range, launches ONE SendRecv kernel on the process
  group's NCCL stream (batch P2P takes the group's communicator, "like a collective", so all
  of a rank's batches share one stream; posted one by one on it, 1F1B deadlocks, which is why
  torch fuses). The compute stream waits on the group (``_wait_batch_p2p``), on a send posted
  alone after the next action, and on the last send before the optimizer. The fused kernel
  starts when its stream lets it; each direction moves once the peer's kernel of the matching
  group has started, taking that link's transfer; the kernel ends when all are done. Truth per
  message is still kernel-level (wait = later start - earlier start, transfer = min(ends) -
  later start): both messages of a fused kernel get its times, so a message on a fast link
  fused with one on a slow link shows the slow transfer (no trace says when each direction's
  data landed). Not modelled: whether newer torch also records a ``record_param_comms`` named
  "coalesced" at the group end; the fused kernel carries no comm metadata args.
- **Megatron-core** (``framework="megatron"``, scenarios ``megatron_*``; read off NVIDIA/Megatron-LM
  at d98e8a64dd, ``megatron/core/pipeline_parallel/``): no labels of any kind; the schedule's
  loops and their p2p_communicator calls as :func:`megatron_sequence` says (schedules.py
  ``forward_backward_pipelining_without_interleaving`` ~2147-2475 and ``..._with_interleaving``
  ~1019-2070), each call's ops in ``_batched_p2p_ops``' order (p2p_communication.py 22-57:
  send_prev, recv_prev, send_next, recv_next). With the default config (model_parallel_config.py
  385-395: batch_p2p_comm=True, batch_p2p_sync=True, ``megatron_p2p="batch_sync"``) a call is one
  batch_isend_irecv group, as above: per op ``c10d::send`` / ``c10d::recv_`` >
  ``record_param_comms``, no ``nccl:send``/``nccl:recv`` title, one ``nccl:coalesced`` range
  launching ONE fused SendRecv kernel on the group's stream; then ``req.wait()`` (the compute
  stream waits) and ``torch.cuda.synchronize()`` (``_communicate`` 420-424: a
  ``cudaDeviceSynchronize`` that blocks the host until its device has run everything launched:
  the ranks' hosts are simulated together for it). ``megatron_p2p="batch"`` leaves out the
  synchronize; ``"overlap"`` (overlap_p2p_comm, interleaved only) issues isend/irecv one by one
  (``_p2p_ops`` 60-134, even ranks sending first), each a plain op with its own title and kernel,
  a receive waited on before the action that needs it and the sends at the next call (when
  Megatron waits on its send handles exactly is simplified so). The ground truth gives each
  message its own direction's transfer (``message_transfer_ns``) beside the kernel-level figure.
- **Peer metadata** (scenarios ``megatron_group_ranks``, ``wrong_peer_metadata``): the peers
  in ``nccl:send a->b`` titles, ``record_param_comms``' ``Rank`` / ``Dst Rank`` / ``Src Rank``
  and ``c10d::send``'s ``Concrete Inputs`` are ranks of the op's process group
  (distributed_c10d.py canonicalises ``dst`` to the group's rank; ``Process Group Ranks`` and
  pg_config map them to the job's). ``rank_order`` lays pipeline position i on the job's rank
  ``rank_order[i]`` (files, distributedInfo, the truth in job ranks) with a
  ``pipeline_model_parallel_group`` in pg_config. ``p2p_comm_ranks`` writes, as pytorch#153819
  reports for Megatron runs, the ranks of the two-rank communicator ProcessGroupNCCL runs a
  P2P pair on (the lower rank 0: ``nccl:recv 1<-0`` where ``3<-1`` was meant);
  ``record_shapes=False`` leaves out ``Concrete Inputs`` (the one field that stays right).
- With ``peer_streams`` (Megatron's ``_communicate`` with ``batch_p2p_comm=False``, read off
  Megatron-LM's ``megatron/core/pipeline_parallel/p2p_communication.py`` ``_communicate`` /
  ``_p2p_ops`` and ProcessGroupNCCL ``pointToPoint``, which keys a single P2P op's
  communicator by ``getKeySendRecv(rank, peer)``): every op a plain ``isend`` / ``irecv``
  with its own SendRecv kernel on the stream of its rank PAIR: a rank's sends to and
  receives from one peer share a stream, and a send queues behind a receive from that peer
  that is still spinning. The host posts as Megatron does: after an action, its send together
  with the next action's receive when that action is of the other kind
  (``send_forward_recv_backward``, ``send_backward_recv_forward``), else alone; ops with the
  next rank send first and ops with the previous rank receive first (``_p2p_ops``' order on
  even and odd ranks alike for such pairs), which is what keeps the paired streams from
  deadlocking; the compute stream waits for every op of the call (``req.wait()``). 1F1B
  only. Not modelled: at p=2 Megatron posts one direction on the WORLD group (another
  communicator, so another stream).
- ``record_param_comms`` args follow torch's ParamCommsUtils / profiler util keys
  ("Collective name", "In/Out msg nelems", "dtype", "Group size", "Process Group Ranks",
  "Rank", "Dst Rank" / "Src Rank", "Seq"); the NCCL kernel carries the same metadata, as the
  real NCCL kernels in ``shared/real-traces/kineto-gpu`` do. "Seq" counts P2P calls per rank.
- ``c10d::send`` / ``c10d::recv_`` carry "Input Dims" / "Concrete Inputs" as with
  ``record_shapes=True`` (peer = group rank, tag 0), like the CPU gloo sample traces.
- The main thread records nothing while the autograd thread runs a backward (the engine's
  caller only waits); the ``PP:`` label, when labelled, spans the whole backward.
- No ``gpu_user_annotation`` for ``PP:`` labels (whether Kineto gives one to a label whose
  kernels are launched from another thread is not known here); one for each ``nccl:`` range
  and ``Optimizer.step``, as in the real NCCL trace.
- Device index = rank (one node, one GPU per rank); host pid/tid values are made up.

Schema (field names, cats, args keys, pid/tid conventions, ac2g flows) copied from
``shared/real-traces/kineto-gpu/hta_nccl_parser_config_nccl_data.json.gz``; no ``host_name``
(the real GPU traces have none).

ROCm naming (``rocm=True``, scenarios ``rocm_*``; tracekit issue #29). The simulation is the
same, to the nanosecond; only what the files call things changes, each from a source:

- Kineto writes HIP runtime calls as ``ActivityType::CUDA_RUNTIME`` (pytorch/kineto@114171df
  ``libkineto/src/RocprofActivity.h:149``; before roctracer's removal, @094d3c1d
  ``libkineto/src/RoctracerActivity.h:154``), i.e. cat ``cuda_runtime``
  (``libkineto/include/ActivityType.h:89``), and starts an ``ac2g`` flow at hipLaunchKernel,
  hipExtLaunchKernel, hipModuleLaunchKernel, hipExtModuleLaunchKernel (and, in rocprofiler's
  version, hipGraphLaunch) (``RocprofActivity_inl.h:186-198``; ``RoctracerActivity_inl.h:143-147``).
- A launch's args are roctracer's: ``kernel`` (its name), ``cid`` (not CUPTI's ``cbid``),
  ``correlation``, ``grid``, ``block``, ``shared memory`` (``RoctracerActivity_inl.h:157-200``),
  and ``stream`` as a handle (``"0x0"`` in the real trace; made up here); any other call: ``cid``
  and ``correlation``. A kernel's args: ``device``, ``stream`` (the HSA queue, also its tid),
  ``correlation``, ``kind: "Dispatch Kernel"`` (``RoctracerActivity_inl.h:44, 103-135``,
  ``RoctracerActivity.h:113``), no grid/block (a thread-local cache the real trace never hits);
  a kernel launched under ``record_param_comms`` gets the comm metadata on any GPU
  (``libkineto/src/output_json.cpp:900-904``).
- ``cid`` values are ROCm/clr@006d80ed ``hipamd/include/hip/amd_detail/hip_prof_str.h``'s
  ``hip_api_id_t``: hipDeviceSynchronize 48 (line 73), hipEventRecord 59 (84),
  hipEventSynchronize 60 (85), hipExtLaunchKernel 62 (87), hipExtModuleLaunchKernel 65 (90),
  hipLaunchKernel 107 (132), hipStreamWaitEvent 200 (225); the real MI250 trace's cids for
  the calls it holds agree.
- RCCL runs every op, P2P or collective, in one kernel. ROCm/rccl ``release/rocm-rel-6.2``
  (612add2b): ``src/device/common.cu:20`` defines ``ncclDevKernel_Generic(ncclDevComm*,
  channelMasks, ncclWork*)``; ``src/enqueue.cc:38-40`` makes it the only kernel, taken by the
  collective plans (lines 349, 456, 540) and ``scheduleP2pTasksToPlan`` (921) alike, and launched
  by ``hipExtLaunchKernel`` (1393; ``cudaLaunchKernel``, hipified to hipLaunchKernel, when a plan
  spans several streams, 1445). Its name elsewhere: ``rccl_main_kernel`` (rocm-rel-6.1,
  ``src/collectives/device/common.h:366``), ``ncclDevKernel_Generic_4`` (rocm-rel-6.3.0.1,
  ``src/device/common.cu:23``), ``ncclDevKernel_Generic_1/_2/_4(ncclDevKernelArgs4K)``
  (ROCm/rccl@2a59f8dd ``src/device/common.cu:20-28``). ROCm 6.2 ships RCCL 2.20.5
  (``CHANGELOG.md:14``): the ``nccl_version`` written.
- torch builds ProcessGroupNCCL against RCCL through hipify, which leaves string literals
  alone: the ``nccl:send a->b`` titles (``ProcessGroupNCCL::send`` > ``pointToPoint(...,
  c10::str("nccl:send ", rank_, "->", dstRank))``, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp),
  ``record_param_comms``, ``c10d::send`` are as on CUDA; the CUDA calls it makes become HIP's
  (hipEventRecord, hipStreamWaitEvent; the real trace's hipDeviceSynchronize). Compute kernels
  keep torch's names, GEMMs are Tensile's ``Cijk_...`` launched by hipExtModuleLaunchKernel,
  and deviceProperties are the MI250's, all as in
  ``shared/real-traces/kineto-gpu/hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz``.
- Clocks: roctracer stamps the device in CLOCK_MONOTONIC and Kineto shifts it into the host's
  clock by one offset when it writes (``RoctracerActivityApi.cpp:91-105, 131-136``): one time
  base per file, as on CUDA (in the real MI250 trace every kernel starts 5.5-8.2 us after its
  launch ends). Not modelled: that offset's error; HSA queue ids (the CUDA streams' numbers are
  kept); RCCL's multi-stream launch (hipLaunchKernel); graphs. No real multi-GPU ROCm trace was
  in reach: the per-peer streams and spin-then-transfer kernels are the CUDA model's guesses.

3-D parallel jobs (``tp``, ``dp``, ``recompute``, ``pg_metadata``; ``SCENARIOS_3D``, tracekit
issue #31). Read off NVIDIA/Megatron-LM at d98e8a64dd (paths under ``megatron/core/``) and the
torch 2.13.0 wheel's Python sources (``torch/...`` lines below are that wheel's); C++ lines of
pytorch/pytorch are named by function, the snapshot being too large to bring here.

- **Layout**: ``tp * dp`` pipelines ("pipes", pipe = tp_rank + tp * dp_rank), each the plain
  simulation's pipeline; global rank = tp_rank + tp * dp_rank + tp * dp * pp_rank, Megatron's
  default order "tp-cp-ep-dp-pp" (``parallel_state.py:617``) with cp = ep = 1, groups as
  ``RankGenerator.get_ranks`` / ``generate_masked_orthogonal_rank_groups`` make them
  (``parallel_state.py:269-330, 534-549``; :func:`_masked_groups`, checked against Megatron's
  function when written). P2P runs between the same pipe's adjacent stages on the pipeline
  group (peers in titles and args are its group ranks = stage positions); files, devices,
  distributedInfo and the truth name global ranks. ``rank_launch_ns`` / ``stage_factor`` are
  per position (every pipe); ``clock_offset_ns`` per global rank.
- **Tensor parallelism**: ``tensor_parallel/mappings.py`` ``_reduce`` (22-37) all-reduces on
  the TP group, synchronously, in the forward of ``_ReduceFromModelParallelRegion`` (221-235;
  RowParallelLinear's output, ``layers.py:1566``) and the backward of ``_CopyToModelParallelRegion``
  (201-218; ColumnParallelLinear's input grad, ``layers.py:1225``). With tp > 1 each 4 forward ops
  are column linear, gelu, row linear, gelu: one all-reduce after the row linear in F (a
  ``_ReduceFromModelParallelRegion`` cpu_op, the Function's apply as THPFunction_apply records it
  under its class name, ``torch/csrc/autograd/python_function.cpp``) and one after the column
  linear's node in B (``autograd::engine::evaluate_function: _CopyToModelParallelRegionBackward``;
  a Function's node is its class name + "Backward", ``torch/autograd/function.py:357``). Each:
  ``c10d::allreduce_`` > ``record_param_comms`` ("Collective name": "allreduce", "dtype":
  "BFloat16", the TP group's "Process Group Name" / "Description" / "Ranks", "Rank" = group rank,
  "Seq") > syncStreams > ``nccl:all_reduce`` > ``TP_ALLREDUCE_KERNEL`` on the TP communicator's
  stream (``TP_STREAM``); the compute stream then waits for it (work.wait()). A collective's
  kernel spins until every member's has started, then all end together after ``tp_allreduce_ns``.
  TP and P2P kernels are on different streams and may overlap. Not modelled: sequence
  parallelism (all-gather / reduce-scatter), the forward identity ``_CopyToModelParallelRegion``
  and ``_ReduceFromModelParallelRegionBackward`` nodes, comm-GEMM overlap. The kernel's name is
  the signature tracekit's issue gives (NCCL <= 2.18's); the P2P kernel keeps NCCL 2.19+'s.
- **Data parallelism** (``overlap_grad_reduce``): grad sync is enabled for the last microbatch
  only (``pipeline_parallel/schedules.py`` 2434, 2461, 2478 ``enable_grad_sync()``); the grad
  accumulator's hook (``distributed/distributed_data_parallel.py:473``, ``_make_backward_post_hook``
  553-582) calls ``register_grad_ready`` (``distributed/param_and_grad_buffer.py:863-884``, last
  microbatch only), and a bucket's last grad starts ``start_grad_sync`` (600-): an async
  ``all_reduce`` on the data-parallel group (700-703, 730-731). Here: ``dp_buckets`` buckets per
  stage, one after each ``kernels_f / dp_buckets`` backward nodes of the stage's last microbatch,
  launched inside ``autograd::engine::evaluate_function: torch::autograd::AccumulateGrad`` on
  the autograd thread (``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce`` >
  ``DP_ALLREDUCE_KERNEL`` on ``DP_STREAM``), not waited on; ``finalize_model_grads``
  (``distributed/finalize_model_grads.py:640``) > ``finish_grad_sync`` waits on each (787-829)
  before the optimizer: the compute stream waits. With Megatron's default batch_p2p_sync the
  ``torch.cuda.synchronize()`` after a P2P call also waits for a bucket in flight. Not modelled:
  ``_coalescing_manager`` around a bucket group (one bucket a group here), reduce-scatter with
  the distributed optimizer, the grad-norm all-reduce. ``replica_slowdown`` {replica: factor}
  makes a replica's machine slower: its kernels and its host's launches take factor times as long.
- **Recomputation** (``recompute``): Megatron's ``CheckpointFunction``
  (``tensor_parallel/random.py:591-672``): the forward runs the layers under ``torch.no_grad()``
  (616-617) inside a ``CheckpointFunction`` cpu_op (its ops without sequence numbers); the
  backward, ``autograd::engine::evaluate_function: CheckpointFunctionBackward``, first re-runs
  the forward's ops and kernels under ``enable_grad`` (658-659; TP all-reduces included), then
  ``torch.autograd.backward`` (668) runs the inner graph reentrantly: nested evaluate_function
  ranges on the same thread. torch's non-reentrant ``torch.utils.checkpoint`` (not generated)
  names nothing of its own: its saved-tensor hooks (``_checkpoint_hook``,
  ``torch/utils/checkpoint.py:1153-1200``; the frame set up at 1558-1704) re-run the forward
  (``recompute_fn``) from the unpack hook of the first backward node that needs a saved tensor,
  so the forward's aten ops appear nested in that node's evaluate_function range.
- **Process groups** (``pg_metadata``): distributedInfo as ``torch/profiler/profiler.py``
  ``_get_distributed_info`` (554-572) writes it: pg_count = every group created
  (``get_pg_count``, ``torch/distributed/distributed_c10d.py:1555-1560``), pg_config the rank's
  groups (``_get_all_pg_configs`` over pg_map, 1546-1552; ``_get_pg_config`` 1531-1543), names
  counted over every new_group call (``_process_group_name`` 5486-5494); Megatron's groups in
  creation order with their ``group_desc`` (:func:`process_groups`). ``pg_metadata=False`` leaves
  out pg_count, pg_config and every "Process Group *" arg: the layout from traffic alone.
- **Contention** (``tp_p2p_contention``, ``CONTENDED_SCENARIO``; a model, not read off any
  source): a TP all-reduce and a pipeline P2P transfer of the same rank run on different
  streams, being ops of two process groups (Megatron's ``parallel_state.py:1169`` and ``1250``
  create TENSOR_MODEL_PARALLEL_GROUP and PIPELINE_MODEL_PARALLEL_GROUP apart; ProcessGroupNCCL's
  ``getNCCLComm`` gives each communicator its own stream), but move their data over the same
  hardware, NVLink within a node, the NICs and the network between nodes, so each gets less
  bandwidth while both run. Modelled as: a
  transfer that a TP all-reduce kernel of either end's rank (spinning or moving data) overlaps
  takes ``tp_p2p_contention`` times its link's time, the whole transfer, not only the
  overlapped part. Decided once per message when its transfer starts, from what the kernels
  resolved by then say (the simulation resolves kernels as they become runnable, not in time
  order): an all-reduce that starts during the transfer but is resolved after it is missed,
  and one still waiting for a member not yet resolved counts as running though it may end
  before the transfer starts. So a few transfers differ from the rule (in CONTENDED_SCENARIO
  12 of 448 overlap an all-reduce unslowed, 4 are slowed by one that ended before); the
  truth classes transfers by the kernels' final times, as a trace reader sees them. No effect
  on the all-reduce. The default, 1.0, is the plain model. Deterministic: the seed still
  draws only the kernels' jitter.

Activation memory (``record_shapes``, the truth's ``activation_memory`` with ``recompute``;
a model of what autograd keeps, not a measurement): each forward op records its inputs'
shapes as ``record_shapes=True`` does ("Input Dims" / "Input type": :func:`_forward_shapes`,
an MLP on MESSAGE_SHAPE's rows x H float activations) and keeps its first input, the
activation, for its backward (a linear its input for the weight gradient, its weight being a
parameter; a gelu its input). Without recomputation a microbatch in flight keeps all of them;
with it only the CheckpointFunction's input (``tensor_parallel/random.py:628``
``ctx.save_for_backward(*args)``), and a backward first rebuilds its microbatch's activations
(one microbatch at a time: held x kept + the rebuilt ones). Per rank, walking its actions in
the order its kernels ran: ``in_flight`` (most microbatches held), ``kept_per_microbatch_bytes``,
``activations_per_microbatch_bytes``, ``peak_recompute_on_bytes``, ``peak_recompute_off_bytes``.
Transients inside an action (a forward's temporaries under no_grad, gradients) are not modelled.

Truth of a 3-D job (keys beside the plain ones, which keep their meaning: ``busy_ns`` /
``bubble_ratio`` count compute and optimizer kernels only). The step window is the first to
last action kernel (compute or TP all-reduce) of any rank. Per ``per_step`` row (and summed in
``ranks``): ``tp_rank``, ``dp_rank``, ``pp_rank``; ``busy_with_tp_ns`` / ``bubble_ratio_with_tp``
(busy counting TP all-reduce kernels too); ``tp_allreduce_ns`` / ``tp_allreduce_count`` (the
rank's TP kernels, summed durations); ``dp_grad_ns`` / ``dp_grad_count`` (bucket all-reduce
kernels, summed durations, spin included), ``dp_grad_overlapped_ns`` (inside the window, i.e.
while the pipeline drains) and ``dp_grad_exposed_ns`` (after it); ``step_end_ns`` (the rank's
kernel time after the window: exposed buckets, optimizer); ``recompute_ns`` (re-run forward
kernels in the window) and ``recompute_share`` (of ``busy_ns``). ``ranks`` rows add
``overhead_share_of_idle`` (``host_wait_ns`` / idle: idle with the rank's own host late; not
tracekit's overhead, which charges a late host where its delay propagates: compare that with
:func:`cause_shares`, each cause's Shapley value over re-simulations with it switched off). Top level:
``layout`` (world_size, dims {pp, tp, dp}, order "tp-dp-pp", megatron_order, the one-line
``line``, ``groups`` {tp, dp, pp: lists of ranks}, ``process_groups`` (every group with its
pg_name, pg_desc, backend_config, pg_size, ranks, role), pg_metadata); ``stages`` (per pp rank:
ranks, recompute_ns, busy_ns, recompute_share); ``replicas`` (per dp rank: ranks, slowdown,
action_busy_ns); ``slow_replica`` (the replica made slower, or None). With tp > 1,
``shared_links``: per rank the time its TP all-reduce kernels and its P2P kernels overlap
(``overlap_ns``), the transfers (each message's ``transfer_ns``, ending at ``recv_end_ns``)
that a TP all-reduce kernel of either end overlaps and the rest, with their medians
(``median_transfer_overlapped_ns``, ``median_transfer_alone_ns``), ``contention_factor`` and
``n_transfers_slowed``; a message's ``message_transfer_ns`` is what contention left it.

Run ``python tests/gpu_tracegen.py --scenario slow_link --out /tmp/x`` to write one by hand, or
``python tests/gpu_tracegen.py --tp 2 --dp 2 --pp 4 --slow-replica 1 /tmp/x`` for a 3-D job.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

COMPUTE_STREAM = 7
FUSED_STREAM = 17  # the process group's NCCL stream, where every batched P2P kernel of a rank runs
LAUNCH_LATENCY_NS = 2_000  # cudaLaunchKernel end -> earliest kernel start
P2P_HOST_NS = 30_000  # host time of one c10d::send / c10d::recv_ call
OPTIMIZER_KERNELS = 3
OPTIMIZER_KERNEL_NS = 10_000
FIRST_STEP = 2  # ProfilerStep numbering as with schedule(wait=1, warmup=1, ...)
STEP_GAP_NS = 20_000  # host time between one ProfilerStep and the next
ORIGIN_NS = 5_000_000_000  # trace ts origin (ns); ts = (ORIGIN_NS + t + offset) / 1000 us
BASE_TIME_NS = 1_790_000_000_000_000_000
MESSAGE_SHAPE = [8, 1024]  # activations / gradients, float32
NCCL_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
# RCCL (ROCm 6.2) runs every op, P2P or collective, in this one kernel (module doc).
RCCL_KERNEL = "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"
# 3-D jobs (module doc, "3-D parallel jobs"): each collective on its process group's NCCL stream
TP_STREAM = 13  # the tensor-parallel group's communicator
DP_STREAM = 15  # the data-parallel group's communicator
TP_ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
DP_ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_SIMPLE(ncclDevComm*, unsigned long, ncclWork*)"
TP_NELEMS = 4096 * 1024  # one layer's activations (sequence x hidden), bf16
DP_BUCKET_NELEMS = 40_000_000  # Megatron's default bucket_size (distributed_data_parallel.py:134)
MEGATRON_ORDER = "tp-cp-ep-dp-pp"  # initialize_model_parallel's default order (parallel_state.py:617)
_GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_kernel__5x_cublas"
# A Tensile GEMM as the real MI250 trace names it (launched through hipExtModuleLaunchKernel).
_TENSILE_GEMM = (
    "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_"
    "EPS0_GRVWA2_GRVWB2_GSUAMB_ISA90a_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA8_LPB8_LPM0_LRVW4_LWPMn1_MIAV0_"
    "MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_"
    "SSO0_SVW1_TLDS1_USFGROn1_VSn1_VWA1_VWB1_WSGRA1_WSGRB1_WS64_WG64_4_1"
)
_GELU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
    "{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl"
    "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
    "{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
)
_GELU_BWD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl"
    "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
    "{lambda()#2}::operator()() const::{lambda(float, float)#1}, at::detail::Array<char*, 3> >"
    "(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
    "::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
    "{lambda(float, float)#1}, at::detail::Array<char*, 3>)"
)
_OPTIM_KERNEL = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
    "<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::"
    "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
    "std::plus<float>, float)"
)


@dataclass(frozen=True)
class Platform:
    """What one GPU stack's Kineto trace names: each host API call by role (name, callback
    id), the key the callback id goes under, the comm library's kernel, the GEMM kernel, the
    device and the comm library's version (module doc)."""

    calls: dict[str, tuple[str, int]]
    callback_key: str
    comm_kernel: str
    gemm_kernel: str
    device: dict
    comm_version: str

    @property
    def rocm(self) -> bool:
        return self.callback_key == "cid"


CUDA = Platform(
    calls={
        "launch": ("cudaLaunchKernel", 211),
        "gemm_launch": ("cudaLaunchKernel", 211),
        "comm_launch": ("cudaLaunchKernel", 211),
        "event_record": ("cudaEventRecord", 135),
        "stream_wait": ("cudaStreamWaitEvent", 147),
        "device_sync": ("cudaDeviceSynchronize", 165),
        "event_sync": ("cudaEventSynchronize", 137),
    },
    callback_key="cbid",
    comm_kernel=NCCL_KERNEL,
    gemm_kernel=_GEMM,
    device={
        "name": "NVIDIA H100 80GB HBM3 (generated)",
        "totalGlobalMem": 85_024_112_640,
        "computeMajor": 9,
        "computeMinor": 0,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "warpSize": 32,
        "sharedMemPerBlock": 49152,
        "numSms": 132,
        "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472,
    },
    comm_version="2.21.5",
)
# Callback ids: ROCm/clr hip_prof_str.h's hip_api_id_t (module doc), as the real MI250 trace has them.
ROCM = Platform(
    calls={
        "launch": ("hipLaunchKernel", 107),
        "gemm_launch": ("hipExtModuleLaunchKernel", 65),
        "comm_launch": ("hipExtLaunchKernel", 62),
        "event_record": ("hipEventRecord", 59),
        "stream_wait": ("hipStreamWaitEvent", 200),
        "device_sync": ("hipDeviceSynchronize", 48),
        "event_sync": ("hipEventSynchronize", 60),
    },
    callback_key="cid",
    comm_kernel=RCCL_KERNEL,
    gemm_kernel=_TENSILE_GEMM,
    device={  # the real MI250 trace's deviceProperties
        "name": "AMD Radeon Graphics (generated)",
        "totalGlobalMem": 68_702_699_520,
        "computeMajor": 9,
        "computeMinor": 0,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "warpSize": 64,
        "sharedMemPerBlock": 65536,
        "numSms": 104,
        "maxSharedMemoryPerMultiProcessor": 65536,
    },
    comm_version="2.20.5",  # RCCL 2.20.5 shipped with ROCm 6.2 (its CHANGELOG)
)


@dataclass(frozen=True)
class Scenario:
    """One generated pipeline job. Times in ns. ``v`` is 2 for Interleaved1F1B, else 1."""

    name: str
    schedule: str = "1F1B"  # "1F1B", "GPipe" or "Interleaved1F1B"
    p: int = 4
    m: int = 8
    steps: int = 2
    v: int = 1
    kernels_f: int = 4
    kernels_b: int = 8  # a multiple of kernels_f: each backward op launches kernels_b // kernels_f
    kernel_ns: int = 50_000
    stage_factor: dict[int, float] = field(default_factory=dict)  # slow stage: stage -> factor
    transfer_ns: int = 10_000
    link_transfer_ns: dict[tuple[int, int], int] = field(default_factory=dict)  # (src, dst) -> ns
    launch_ns: int = 5_000  # host cost of one kernel launch
    rank_launch_ns: dict[int, int] = field(default_factory=dict)  # launch-bound rank -> ns
    host_sync: bool = True
    # False: a host that costs nothing (launches, P2P calls, launch latency, synchronize
    # returns, hand-offs: the "overhead" a counterfactual of :func:`cause_shares` removes)
    host_costs: bool = True
    clock_offset_ns: dict[int, int] = field(default_factory=dict)  # rank -> ns added to its ts
    labelled: bool = True
    fused_p2p: bool = False  # torch's Schedule1F1B: batch_isend_irecv groups, one fused kernel each
    # Megatron-core's schedules and their P2P (module doc, "Megatron-core"): "torch" or "megatron"
    framework: str = "torch"
    # megatron: "batch_sync" (batch_p2p_comm and batch_p2p_sync, the default config), "batch"
    # (batch_p2p_sync=False), "overlap" (overlap_p2p_comm: separate isend/irecv, waited later)
    megatron_p2p: str = "batch_sync"
    # Peers as the metadata says them (module doc, "Peer metadata"): the global rank of each
    # pipeline position (None: position = global rank); record_shapes=False leaves the c10d
    # ops without "Concrete Inputs"; p2p_comm_ranks writes titles and record_param_comms ranks
    # as the two-rank P2P communicator's (pytorch#153819)
    rank_order: tuple[int, ...] | None = None
    record_shapes: bool = True
    p2p_comm_ranks: bool = False
    rocm: bool = False  # ROCm's names: HIP runtime calls, RCCL's one generic kernel, roctracer's args
    peer_streams: bool = False  # Megatron's unbatched isend/irecv: one NCCL stream per peer pair
    # 3-D parallel jobs (module doc, "3-D parallel jobs"): tp ranks per stage, dp replicas of the
    # whole pipeline, Megatron's rank order tp-dp-pp
    tp: int = 1
    dp: int = 1
    tp_allreduce_ns: int = 40_000  # transfer time of one TP all-reduce (after the last peer arrives)
    dp_allreduce_ns: int = 300_000  # transfer time of one gradient bucket's all-reduce
    dp_buckets: int = 2  # gradient buckets per stage (kernels_f must be a multiple)
    replica_slowdown: dict[int, float] = field(default_factory=dict)  # dp replica -> factor (>1: slower)
    recompute: bool = False  # Megatron's CheckpointFunction around each stage's layers
    # TP and PP on the same links (module doc, "Contention"): a P2P transfer that a TP
    # all-reduce kernel of either end's rank overlaps takes this many times its link's time
    tp_p2p_contention: float = 1.0
    pg_metadata: bool = True  # False: no pg_config, no Process Group fields (traffic alone)
    jitter: float = 0.05  # kernel durations vary by up to this fraction (seeded)
    seed: int = 0

    def __post_init__(self):
        if self.steps < 2:
            raise ValueError("steps must be >= 2")
        if self.kernels_b % self.kernels_f:
            raise ValueError("kernels_b must be a multiple of kernels_f")
        if self.schedule == "Interleaved1F1B" and (self.v < 2 or self.m % self.p):
            raise ValueError("Interleaved1F1B needs v >= 2 and m a multiple of p")
        if self.schedule != "Interleaved1F1B" and self.v != 1:
            raise ValueError(f"{self.schedule} has v = 1")
        if not self.labelled and self.schedule == "GPipe":
            raise ValueError("unlabelled traces model Schedule1F1B and Megatron-style interleaving only")
        if self.fused_p2p and self.schedule != "1F1B":
            # GPipe posts every op in a batch of its own; only Schedule1F1B fuses a send and a recv.
            raise ValueError("fused_p2p models torch's Schedule1F1B only")
        if self.rank_order is not None and sorted(self.rank_order) != list(range(self.p)):
            raise ValueError("rank_order must be a permutation of the ranks 0..p-1")
        if self.framework not in ("torch", "megatron"):
            raise ValueError(f"unknown framework {self.framework!r}")
        if self.framework == "megatron":
            if self.labelled or self.fused_p2p or self.schedule == "GPipe":
                raise ValueError("Megatron-core writes no labels and has its own P2P: 1F1B or Interleaved1F1B")
            if self.megatron_p2p not in ("batch_sync", "batch", "overlap"):
                raise ValueError(f"unknown megatron_p2p {self.megatron_p2p!r}")
            if self.megatron_p2p == "overlap" and self.schedule != "Interleaved1F1B":
                raise ValueError("overlap_p2p_comm is the interleaved schedule's")
        if self.peer_streams and (self.fused_p2p or self.schedule != "1F1B"):
            raise ValueError("peer_streams models Megatron's unbatched 1F1B only")
        if self.tp < 1 or self.dp < 1:
            raise ValueError("tp and dp must be >= 1")
        if self.multi_dim and (self.rank_order is not None or self.p2p_comm_ranks or self.rocm):
            raise ValueError("3-D jobs use Megatron's rank order on CUDA: no rank_order, p2p_comm_ranks or rocm")
        if self.tp_p2p_contention < 1.0 or (self.tp_p2p_contention != 1.0 and self.tp < 2):
            raise ValueError("tp_p2p_contention is a slowdown (>= 1) of a job with tp > 1")
        if self.tp > 1 and self.kernels_f % 4:
            raise ValueError("tp needs kernels_f a multiple of 4 (column linear, gelu, row linear, gelu)")
        if self.dp > 1 and self.kernels_f % self.dp_buckets:
            raise ValueError("dp needs kernels_f a multiple of dp_buckets")
        if any(not 0 <= r < self.dp for r in self.replica_slowdown):
            raise ValueError("replica_slowdown names a replica outside 0..dp-1")

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    @property
    def platform(self) -> Platform:
        return ROCM if self.rocm else CUDA

    @property
    def multi_dim(self) -> bool:
        """A 3-D job's generator features are on (the truth then has the 3-D keys)."""
        return self.tp > 1 or self.dp > 1 or self.recompute or not self.pg_metadata

    @property
    def n_pipes(self) -> int:
        """Pipeline instances: one per (tp rank, dp rank); pipe = tp_rank + tp * dp_rank."""
        return self.tp * self.dp

    @property
    def world_size(self) -> int:
        return self.p * self.n_pipes

    def rank_of(self, stage: int) -> int:
        return stage % self.p  # "loop" placement

    def global_rank(self, position: int, pipe: int = 0) -> int:
        """The job's rank of a pipeline position (the pipeline group's rank) in pipeline instance
        ``pipe``: Megatron's order tp-dp-pp, tp_rank + tp * dp_rank + tp * dp * pp_rank
        (parallel_state.py:269-330, generate_masked_orthogonal_rank_groups' equation (1))."""
        if self.rank_order is not None:
            return self.rank_order[position]
        return pipe + self.n_pipes * position

    def launch_cost(self, rank: int, pipe: int = 0) -> int:
        if not self.host_costs:
            return 0
        cost = self.rank_launch_ns.get(rank, self.launch_ns)
        slow = self.replica_slowdown.get(pipe // self.tp, 1.0)
        return cost if slow == 1.0 else round(cost * slow)

    def transfer(self, src: int, dst: int) -> int:
        return self.link_transfer_ns.get((src, dst), self.transfer_ns)

    def injected(self) -> dict:
        """The cause this scenario injects and who is to blame."""
        if self.stage_factor:
            return {"cause": "imbalance", "stage": max(self.stage_factor, key=self.stage_factor.get)}
        if self.link_transfer_ns:
            src, dst = max(self.link_transfer_ns, key=self.link_transfer_ns.get)
            return {"cause": "comm", "link": [src, dst]}
        if self.rank_launch_ns:
            return {"cause": "overhead", "rank": max(self.rank_launch_ns, key=self.rank_launch_ns.get)}
        return {"cause": "fill_drain"}


Action = tuple[int, str, int]  # (stage, "F" | "B", microbatch)


def schedule_order(sc: Scenario, rank: int) -> list[Action]:
    """The actions rank ``rank`` runs in one step, in order."""
    p, m = sc.p, sc.m
    if sc.schedule == "GPipe":
        return [(rank, "F", mb) for mb in range(m)] + [(rank, "B", mb) for mb in range(m)]
    if sc.schedule == "1F1B":
        warmup = min(p - 1 - rank, m)
        order: list[Action] = [(rank, "F", mb) for mb in range(warmup)]
        for i in range(m - warmup):
            order += [(rank, "F", warmup + i), (rank, "B", i)]
        return order + [(rank, "B", mb) for mb in range(m - warmup, m)]
    if sc.schedule == "Interleaved1F1B":
        # Megatron-style interleaving: microbatches in groups of p, chunk by chunk.
        total = m * sc.v
        warmup = min((sc.v - 1) * p + 2 * (p - 1 - rank), total)

        def unit(k: int, kind: str) -> Action:
            chunk = (k // p) % sc.v
            if kind == "B":
                chunk = sc.v - 1 - chunk
            return (chunk * p + rank, kind, (k // (p * sc.v)) * p + k % p)

        order = [unit(k, "F") for k in range(warmup)]
        for i in range(total - warmup):
            order += [unit(warmup + i, "F"), unit(i, "B")]
        return order + [unit(k, "B") for k in range(total - warmup, total)]
    raise ValueError(f"unknown schedule {sc.schedule!r}")


# One P2P op of a Megatron communication call: (direction, peer rank, message without its step),
# message = (kind of the producing action, producing stage, microbatch), as Kernel.ops has it.
MegatronOp = tuple[str, int, tuple[str, int, int]]
# _batched_p2p_ops appends its ops in this order (p2p_communication.py lines 33-52).
_BATCH_ORDER = ("send_prev", "recv_prev", "send_next", "recv_next")


def _overlap_position(op: tuple[str, int, tuple], rank: int) -> int:
    """Where ``_p2p_ops`` issues an op: even ranks send_next, recv_prev, send_prev, recv_next;
    odd ranks recv_prev, send_next, recv_next, send_prev (p2p_communication.py lines 84-133)."""
    direction, _, message = op
    forward = message[1] == "F"
    slot = (
        ("send_next" if forward else "send_prev") if direction == "send" else ("recv_prev" if forward else "recv_next")
    )
    even = ("send_next", "recv_prev", "send_prev", "recv_next")
    odd = ("recv_prev", "send_next", "recv_next", "send_prev")
    return (even if rank % 2 == 0 else odd).index(slot)


def megatron_sequence(sc: Scenario, rank: int) -> list[tuple[str, object]]:
    """What Megatron-core's schedule on ``rank`` does in one step, in order: ("action", Action)
    and ("comm", [MegatronOp, ...]) items, one comm item per p2p_communicator call (one
    batch_isend_irecv group, ops in _BATCH_ORDER; a call whose ops all fall away, such as a
    first stage's recv_forward, is no item).

    Without interleaving (schedules.py forward_backward_pipelining_without_interleaving, lines
    ~2334-2475 at NVIDIA/Megatron-LM d98e8a64dd): warmup forwards each between a
    recv_forward and a send_forward; then recv_forward, and per steady microbatch forward,
    send_forward_recv_backward, backward, send_backward_recv_forward (send_backward for the
    last); cooldown backwards each between a recv_backward and a send_backward.
    With interleaving (forward_backward_pipelining_with_interleaving, lines ~1543-2070): a
    recv_forward before the first forward, then after each unit (a warmup forward, a steady
    forward + backward, a cooldown backward) one call that sends the unit's outputs and
    receives the next unit's inputs (send_forward_recv_forward, ..._backward_recv_forward_backward,
    send_backward_recv_backward), as the CPU captures of Megatron-core 0.16.1 in
    sample_traces/megatron_interleaved show it (rank 1: R0 F1.0 R0 S2 F1.1 ... F1.4 B5.0 S0 R0 S2 R2)."""
    n_stages = sc.n_stages

    def output(action: Action) -> list[tuple[str, MegatronOp]]:
        stage, kind, mb = action
        target = stage + 1 if kind == "F" else stage - 1
        if not 0 <= target < n_stages:
            return []
        slot = "send_next" if kind == "F" else "send_prev"
        return [(slot, ("send", sc.rank_of(target), (kind, stage, mb)))]

    def inputs(action: Action) -> list[tuple[str, MegatronOp]]:
        stage, kind, mb = action
        source = stage - 1 if kind == "F" else stage + 1
        if not 0 <= source < n_stages:
            return []
        slot = "recv_prev" if kind == "F" else "recv_next"
        return [(slot, ("recv", sc.rank_of(source), (kind, source, mb)))]

    def comm(slots: list[tuple[str, MegatronOp]]) -> list[tuple[str, object]]:
        ops = [op for _, op in sorted(slots, key=lambda s: _BATCH_ORDER.index(s[0]))]
        return [("comm", ops)] if ops else []

    order = schedule_order(sc, rank)
    items: list[tuple[str, object]] = []
    if sc.schedule == "1F1B":
        forwards = [a for a in order if a[1] == "F"]
        backwards = [a for a in order if a[1] == "B"]
        warmup = min(sc.p - 1 - rank, sc.m)
        for f in forwards[:warmup]:
            items += comm(inputs(f)) + [("action", f)] + comm(output(f))
        remaining = sc.m - warmup
        if remaining:
            items += comm(inputs(forwards[warmup]))
        for i in range(remaining):
            f, b = forwards[warmup + i], backwards[i]
            items += [("action", f)] + comm(output(f) + inputs(b)) + [("action", b)]
            following = inputs(forwards[warmup + i + 1]) if i + 1 < remaining else []
            items += comm(output(b) + following)
        for b in backwards[remaining:]:
            items += comm(inputs(b)) + [("action", b)] + comm(output(b))
        return items
    # interleaved: units of the schedule's order, as Megatron's loops run them
    total = sc.m * sc.v
    warmup = min((sc.v - 1) * sc.p + 2 * (sc.p - 1 - rank), total)
    units = [order[k : k + 1] for k in range(warmup)]
    steady = order[warmup : warmup + 2 * (total - warmup)]
    units += [steady[k : k + 2] for k in range(0, len(steady), 2)]
    units += [order[k : k + 1] for k in range(warmup + len(steady), len(order))]
    items += comm(inputs(units[0][0]))
    for j, unit in enumerate(units):
        items += [("action", a) for a in unit]
        following = units[j + 1] if j + 1 < len(units) else []
        items += comm([slot for a in unit for slot in output(a)] + [slot for a in following for slot in inputs(a)])
    return items


@dataclass
class Kernel:
    """One device kernel and the launch that queued it (host times, ns, reference clock)."""

    rank: int
    stream: int
    name: str
    kind: str  # "compute", "optimizer", or COMM_KINDS: "send", "recv", "sendrecv" (fused)
    step: int
    dur_ns: int  # compute: its run time; P2P: its transfer time
    launch_start_ns: int
    launch_end_ns: int
    tid: int
    external_id: int
    correlation: int
    action: Action | None = None
    deps: list[Kernel] = field(default_factory=list)  # kernels that must end before it starts
    # P2P: what the kernel moves, (direction, message, transfer_ns) per op, message = (step, kind,
    # sender stage, microbatch); one op for a plain send/recv, a group's ops for a fused kernel.
    ops: list[tuple[str, tuple, int]] = field(default_factory=list)
    args: dict = field(default_factory=dict)
    ready_ns: int | None = None  # P2P: when its stream let it start (it spins from here)
    start_ns: int | None = None
    end_ns: int | None = None
    pipe: int = 0  # the pipeline instance (tp_rank + tp * dp_rank) of its rank
    collective: tuple | None = None  # a collective's key, the same on every member of its group
    group_size: int = 1  # members a collective waits for
    recompute: bool = False  # a forward kernel re-run inside a backward (activation recomputation)
    # P2P: the transfer each message took where contention changed it (message -> ns); both
    # ends of a message take the first end's decision
    taken: dict[tuple, int] = field(default_factory=dict)


@dataclass
class _HostEvent:
    cat: str
    name: str
    tid: int
    start_ns: int
    end_ns: int
    args: dict


COMM_KINDS = ("send", "recv", "sendrecv")
COLLECTIVE_KINDS = ("tp_allreduce", "dp_allreduce")


def _roctracer_launch_args(kernel: str, stream: int, comm: bool) -> dict:
    """What roctracer adds to a kernel launch's args, as the real MI250 trace has them: the
    kernel's name, the stream as a handle, grid, block and shared memory."""
    return {
        "kernel": kernel,
        "stream": f"0x{0x7F3A_0000_0000 + 0x100 * stream:x}",  # a made-up hipStream_t
        "grid": [2, 1, 1] if comm else [512, 1, 1],
        "block": [256, 1, 1],
        "shared memory": 0,
    }


class _Rank:
    """One rank's host program: walks the schedule, records host events and launched kernels."""

    def __init__(self, sc: Scenario, rank: int, rng: random.Random, pipe: int = 0):
        self.sc, self.rank, self.rng = sc, rank, rng
        self.pipe = pipe  # rank = the pipeline position; pipe = tp_rank + tp * dp_rank
        self.world_rank = sc.global_rank(rank, pipe)
        self.groups = _rank_groups(sc, self.world_rank)  # role -> the process group it uses
        self.collective_calls: dict[str, int] = {}  # role -> collectives issued ("Seq", group key)
        self.grad_syncs: list[Kernel] = []  # bucket all-reduces launched, waited on before the optimizer
        self.pid = 4000 + 100 * (rank + sc.p * pipe)
        self.main_tid = self.pid  # Linux main thread: tid == pid
        self.autograd_tid = self.pid + 11
        self.events: list[_HostEvent] = []
        self.kernels: list[Kernel] = []
        self.flows: list[tuple[int, int, int]] = []  # fwdbwd: (id, forward ext id, backward ext id)
        self.next_external = 1
        self.next_correlation = 1
        self.next_sequence = 1
        self.p2p_calls = 0
        self.pending_sends: list[tuple[str, int, tuple]] = []  # fused, peer: sends held for the next call
        self.send_work: Kernel | None = None  # fused: a send posted alone, waited on later
        self.stream_waits: list[Kernel] = []  # P2P kernels the next compute kernel waits for
        self.t = 0
        self.last_compute: Kernel | None = None
        self.tp_waited: Kernel | None = None  # a TP all-reduce the compute stream waits for, no kernel after it yet
        self.forward_ops: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (stage, mb) -> [(seq, ext)]
        # (stage, microbatch, op index) -> the sequence number of its _CopyToModelParallelRegion node
        self.tp_copy_seq: dict[tuple[int, int, int], int] = {}
        self.step_spans: dict[int, tuple[int, int]] = {}
        self.host_compute: dict[int, list[tuple[int, int]]] = {}  # step -> top-level compute op spans

    # -- host events -------------------------------------------------------------------------

    def _host(self, ns: int) -> int:
        """Host time ``ns``, or none on a host that costs nothing (``Scenario.host_costs``)."""
        return ns if self.sc.host_costs else 0

    def _event(self, cat: str, name: str, tid: int, start: int, end: int, **args) -> int:
        ext = self.next_external
        self.next_external += 1
        self.events.append(_HostEvent(cat, name, tid, start, end, {"External id": ext, **args}))
        return ext

    def _runtime(self, call: str, tid: int, start: int, end: int, external_id: int, launch: dict | None = None) -> int:
        """One host API call, ``call`` a :class:`Platform` role; ``launch``: the args roctracer
        adds to a kernel launch (ROCm). Returns its correlation id."""
        platform = self.sc.platform
        name, callback = platform.calls[call]
        corr = self.next_correlation
        self.next_correlation += 1
        args = {"External id": external_id, platform.callback_key: callback, "correlation": corr, **(launch or {})}
        self.events.append(_HostEvent("cuda_runtime", name, tid, start, end, args))
        return corr

    def _launch(
        self,
        name: str,
        kind: str,
        stream: int,
        tid: int,
        start: int,
        end: int,
        external_id: int,
        step: int,
        dur_ns: int,
        **extra,
    ) -> Kernel:
        platform = self.sc.platform
        comm = kind in COMM_KINDS or kind in COLLECTIVE_KINDS
        call = "comm_launch" if comm else "gemm_launch" if name == platform.gemm_kernel else "launch"
        launch = _roctracer_launch_args(name, stream, comm) if platform.rocm else None
        corr = self._runtime(call, tid, start, end, external_id, launch)
        kernel = Kernel(
            self.rank, stream, name, kind, step, dur_ns, start, end, tid, external_id, corr, pipe=self.pipe, **extra
        )
        self.kernels.append(kernel)
        if kind in ("compute", "optimizer"):
            kernel.deps += self.stream_waits
            self.stream_waits = []
            self.last_compute = kernel
            self.tp_waited = None
        return kernel

    def _compute_deps(self) -> list[Kernel]:
        """What a P2P kernel waits for: syncStreams makes the NCCL stream wait for the compute
        stream as it stands, its last kernel and, after a TP all-reduce's work.wait(), that
        all-reduce (the gradient a backward sends is the all-reduced one)."""
        deps = [self.last_compute] if self.last_compute else []
        return deps + ([self.tp_waited] if self.tp_waited is not None else [])

    def _kernel_ns(self, stage: int) -> int:
        # a slow replica's kernels run slower too (x 1.0 leaves every other product as it was)
        factor = self.sc.stage_factor.get(stage, 1.0) * self.sc.replica_slowdown.get(self.pipe // self.sc.tp, 1.0)
        return round(self.sc.kernel_ns * factor * (1 + self.rng.uniform(-self.sc.jitter, self.sc.jitter)))

    # -- one step ----------------------------------------------------------------------------
    def run_step(self, step: int, wait_until_ns: int | None) -> None:
        """Launch one step's work; the host span ends in :meth:`end_step`."""
        step_start = self.t
        if wait_until_ns is not None:  # the host waits for the device two steps back
            end = max(self.t + 3_000, wait_until_ns + 3_000)
            self._runtime("event_sync", self.main_tid, self.t, end, 0)
            self.t = end + 2_000
        self.step_spans[step] = (step_start, -1)
        self.host_compute[step] = []
        order = schedule_order(self.sc, self.rank)
        for i, action in enumerate(order):
            self._action(step, action, order[i + 1] if i + 1 < len(order) else None)
        if self.send_work is not None:  # "Wait for the last backward send to finish"
            self._stream_wait(self.send_work)
            self.send_work = None
        self._finish_grad_sync()
        self._optimizer(step)

    def megatron_step(self, step: int, wait_until_ns: int | None):
        """Megatron-core's step (:func:`megatron_sequence`) as a generator: it yields the kernels
        the host waits for where it calls ``torch.cuda.synchronize()`` (p2p_communication.py
        ``_communicate``, lines 420-424: after every call with batch_p2p_comm and
        batch_p2p_sync, the default), and the simulation resumes it once they have run."""
        sc = self.sc
        step_start = self.t
        if wait_until_ns is not None:
            end = max(self.t + 3_000, wait_until_ns + 3_000)
            self._runtime("event_sync", self.main_tid, self.t, end, 0)
            self.t = end + 2_000
        self.step_spans[step] = (step_start, -1)
        self.host_compute[step] = []
        awaited: dict[tuple, Kernel] = {}  # overlap: recv kernels, waited on before their consumer
        sent: list[Kernel] = []  # overlap: send kernels, waited on at the next call
        for what, item in megatron_sequence(sc, self.rank):
            if what == "action":
                stage, kind, mb = item  # type: ignore[misc]
                source = stage - 1 if kind == "F" else stage + 1
                waited = awaited.pop((step, kind, source, mb), None)
                if waited is not None:  # wait_handles["recv_prev"].wait() before the forward
                    self._stream_wait(waited)
                (self._forward if kind == "F" else self._backward)(step, item)  # type: ignore[arg-type]
                continue
            ops = [(direction, peer, (step, *message)) for direction, peer, message in item]  # type: ignore[union-attr]
            if sc.megatron_p2p == "overlap":
                # _p2p_ops (lines 60-134): isend/irecv one by one, even ranks sending first
                for kernel in sent:
                    self._stream_wait(kernel)
                sent = []
                for direction, peer, message in sorted(ops, key=lambda op: _overlap_position(op, self.rank)):
                    kernel = self._p2p(step, direction, peer, message)
                    if direction == "recv":
                        awaited[message] = kernel
                    else:
                        sent.append(kernel)
                continue
            self._stream_wait(self._p2p_group(step, ops))  # req.wait(): the compute stream waits
            if sc.megatron_p2p == "batch_sync":
                yield from self._synchronize()
        for kernel in sent:
            self._stream_wait(kernel)
        self._finish_grad_sync()
        self._optimizer(step)

    def _synchronize(self):
        """``torch.cuda.synchronize()``: the host waits until every kernel it launched has run
        (yields them; resumed by the simulation once they have)."""
        start = self.t
        launched = list(self.kernels)
        yield launched
        end = max(
            start + self._host(3_000), max(k.end_ns for k in launched if k.end_ns is not None) + self._host(5_000)
        )
        self._runtime("device_sync", self.main_tid, start, end, 0)
        self.t = end

    def end_step(self, step: int, device_end_ns: int | None) -> None:
        if device_end_ns is not None:  # cudaDeviceSynchronize: until this rank's device is done
            end = max(self.t + self._host(3_000), device_end_ns + self._host(5_000))
            self._runtime("device_sync", self.main_tid, self.t, end, 0)
            self.t = end
        self.t += self._host(5_000)
        start, _ = self.step_spans[step]
        self.step_spans[step] = (start, self.t)
        self.events.append(
            _HostEvent(
                "user_annotation",
                f"ProfilerStep#{step}",
                self.main_tid,
                start,
                self.t,
                {"External id": self._take_external()},
            )
        )
        self.t += self._host(STEP_GAP_NS)

    def _take_external(self) -> int:
        ext = self.next_external
        self.next_external += 1
        return ext

    def _action(self, step: int, action: Action, next_action: Action | None) -> None:
        sc = self.sc
        stage, kind, mb = action
        label_start = self.t
        # A forward on stage s > 0 receives activations, a backward on stage < last gradients.
        source = stage - 1 if kind == "F" else stage + 1
        recv = ("recv", sc.rank_of(source), (step, kind, source, mb)) if 0 <= source < sc.n_stages else None
        target = stage + 1 if kind == "F" else stage - 1
        send = ("send", sc.rank_of(target), (step, kind, stage, mb)) if 0 <= target < sc.n_stages else None
        if sc.fused_p2p:
            self._fused_before(step, recv)
        elif sc.peer_streams:
            self._communicate(step, self.pending_sends + ([recv] if recv else []))
            self.pending_sends = []
        elif recv:
            # work.wait(): the compute stream waits for the recv kernel's end.
            self._stream_wait(self._p2p(step, *recv))
        if kind == "F":
            self._forward(step, action)
        else:
            self._backward(step, action)
        if sc.fused_p2p:
            self._fused_after(step, send, next_action)
        elif sc.peer_streams:
            if send and next_action is not None and next_action[1] != send[2][1]:
                self.pending_sends.append(send)  # sent with the next action's receive
            elif send:
                self._communicate(step, [send])
        elif send:
            self._p2p(step, *send)
        if sc.labelled:
            self.events.append(
                _HostEvent(
                    "user_annotation",
                    f"PP:{stage}{kind}{mb}",
                    self.main_tid,
                    label_start,
                    self.t,
                    {"External id": self._take_external()},
                )
            )

    def _forward(self, step: int, action: Action) -> None:
        stage, _, mb = action
        if not self.sc.recompute:
            self.forward_ops[(stage, mb)] = self._forward_ops(step, action, self.main_tid)
            return
        # Megatron's CheckpointFunction.forward (tensor_parallel/random.py:601-633) runs the layers
        # under torch.no_grad() (616-617) and saves only its inputs; the profiler records the
        # Function's apply under its class name (THPFunction_apply's RECORD_FUNCTION with
        # ((PyTypeObject*)cls)->tp_name, torch/csrc/autograd/python_function.cpp), with the
        # sequence number its backward node CheckpointFunctionBackward carries.
        seq, ext = self.next_sequence, self._take_external()
        self.next_sequence += 1
        start = self.t
        self.t += self._host(1_000)
        self._forward_ops(step, action, self.main_tid, grad=False)
        self.t += self._host(1_000)
        args = {"External id": ext, "Sequence number": seq, "Fwd thread id": 0, "Record function id": 0}
        self.events.append(_HostEvent("cpu_op", "CheckpointFunction", self.main_tid, start, self.t, args))
        self.forward_ops[(stage, mb)] = [(seq, ext)]

    def _forward_ops(
        self, step: int, action: Action, tid: int, grad: bool = True, recompute: bool = False
    ) -> list[tuple[int, int]]:
        """One forward's ops and kernels on thread ``tid``; returns each op's (sequence number,
        External id). ``grad=False``: under no_grad (no sequence numbers, no autograd nodes);
        ``recompute``: re-run inside a backward. With tp > 1 every 4 ops are Megatron's MLP as
        column linear, gelu, row linear, gelu, the row linear's output all-reduced on the TP group."""
        stage, _, mb = action
        cost = self.launch_cost()
        ops: list[tuple[int, int]] = []
        for k in range(self.sc.kernels_f):
            if self.sc.tp > 1 and k % 4 == 0 and grad:
                # the column linear's input enters _CopyToModelParallelRegion (mappings.py:201-218,
                # layers.py:1225): an identity forward whose apply the profiler records with the
                # sequence number of the node it makes, _CopyToModelParallelRegionBackward
                # (THPFunction_apply, torch/csrc/autograd/python_function.cpp), which the
                # backward visits last and where it all-reduces the input's gradient
                copy_seq = self.next_sequence
                self.next_sequence += 1
                self.tp_copy_seq[(action[0], action[2], k)] = copy_seq
                copy_args = {"Sequence number": copy_seq, "Fwd thread id": 0, "Record function id": 0}
                self._event("cpu_op", "_CopyToModelParallelRegion", tid, self.t, self.t + 2_000, **copy_args)
                self.t += self._host(2_000)
            start, end = self.t, self.t + cost
            seq = self.next_sequence
            if grad:
                self.next_sequence += 1
            autograd = {"Sequence number": seq, "Fwd thread id": 0} if grad else {}
            top_shapes, inner_shapes = _forward_shapes(k, self.sc.tp) if self.sc.record_shapes else ({}, {})
            top_name, inner_name, kernel_name = (
                ("aten::linear", "aten::addmm", self.sc.platform.gemm_kernel)
                if k % 2 == 0
                else ("aten::gelu", None, _GELU)
            )
            top = self._event(
                "cpu_op",
                top_name,
                tid,
                start,
                end,
                **{**autograd, "Record function id": 0, **top_shapes},
            )
            ops.append((seq, top))
            owner = top
            if inner_name:
                owner = self._event(
                    "cpu_op",
                    inner_name,
                    tid,
                    start + cost // 8,
                    end - cost // 8,
                    **{**autograd, "Record function id": 0, **inner_shapes},
                )
            self._launch(
                kernel_name,
                "compute",
                COMPUTE_STREAM,
                tid,
                start + cost // 4,
                start + 3 * cost // 4,
                owner,
                step,
                self._kernel_ns(stage),
                action=action,
                recompute=recompute,
            )
            self.host_compute[step].append((start, end))
            self.t = end
            if self.sc.tp > 1 and k % 4 == 2:
                self._tp_allreduce(step, tid, backward=False, recompute=recompute)
        return ops

    def _backward(self, step: int, action: Action) -> None:
        stage, _, mb = action
        self.t += self._host(3_000)  # hand-off to the autograd device thread
        saved = self.forward_ops.pop((stage, mb))
        # overlap_grad_reduce: bucket hooks fire only in the last microbatch's backward (module doc)
        last_microbatch = self.sc.dp > 1 and mb == self.sc.m - 1
        if not self.sc.recompute:
            self._backward_nodes(step, action, saved, last_microbatch)
        else:
            # CheckpointFunction.backward (random.py:635-672): re-run the forward under
            # enable_grad (658-659), then torch.autograd.backward on its outputs (668), which the
            # engine runs reentrantly on this thread: nested evaluate_function ranges.
            ((seq, forward_ext),) = saved
            start, outer, inner = self.t, self._take_external(), self._take_external()
            self.t += self._host(1_000)
            ops = self._forward_ops(step, action, self.autograd_tid, recompute=True)
            self._backward_nodes(step, action, ops, last_microbatch)
            self.t += self._host(1_000)
            node = "CheckpointFunctionBackward"  # a Function's node: class name + "Backward"
            autograd = {"Sequence number": seq, "Fwd thread id": 1, "Record function id": 0}
            self._node_ranges(node, self.autograd_tid, start, (outer, inner), autograd)
            self.flows.append((seq, forward_ext, outer))
        self.t += self._host(3_000)  # back on the main thread

    def _backward_nodes(self, step: int, action: Action, ops: list[tuple[int, int]], last_microbatch: bool) -> None:
        """The autograd nodes of one backward, last forward op first; with tp > 1 the column
        linear's input grad all-reduced after its node; in the last microbatch with dp > 1,
        a gradient bucket's all-reduce launched once its ops' grads are done."""
        stage = action[0]
        cost = self.launch_cost()
        per_op = self.sc.kernels_b // self.sc.kernels_f
        per_bucket = self.sc.kernels_f // self.sc.dp_buckets
        done = 0
        for k, (seq, forward_ext) in reversed(list(enumerate(ops))):
            start, end = self.t, self.t + per_op * cost
            node = "AddmmBackward0" if k % 2 == 0 else "GeluBackward0"
            top = self._event(
                "cpu_op",
                f"autograd::engine::evaluate_function: {node}",
                self.autograd_tid,
                start,
                end,
                **{"Sequence number": seq, "Fwd thread id": 1, "Record function id": 0},
            )
            self.flows.append((seq, forward_ext, top))
            self._event(
                "cpu_op",
                node,
                self.autograd_tid,
                start + 200,
                end - 200,
                **{"Sequence number": seq, "Fwd thread id": 1, "Record function id": 0},
            )
            for j in range(per_op):
                op_start = start + j * cost
                owner = self._event(
                    "cpu_op",
                    "aten::mm" if k % 2 == 0 else "aten::gelu_backward",
                    self.autograd_tid,
                    op_start + cost // 8,
                    op_start + cost - cost // 8,
                    **{"Record function id": 0},
                )
                self._launch(
                    self.sc.platform.gemm_kernel if k % 2 == 0 else _GELU_BWD,
                    "compute",
                    COMPUTE_STREAM,
                    self.autograd_tid,
                    op_start + cost // 4,
                    op_start + 3 * cost // 4,
                    owner,
                    step,
                    self._kernel_ns(stage),
                    action=action,
                )
            self.host_compute[step].append((start, end))
            self.t = end
            if self.sc.tp > 1 and k % 4 == 0:
                self._tp_allreduce(
                    step, self.autograd_tid, backward=True, seq=self.tp_copy_seq.pop((action[0], action[2], k), None)
                )
            done += 1
            if last_microbatch and done % per_bucket == 0:
                self._grad_bucket(step)

    def _tp_allreduce(
        self, step: int, tid: int, backward: bool, recompute: bool = False, seq: int | None = None
    ) -> None:
        """Megatron's ``_reduce`` (tensor_parallel/mappings.py:22-37: torch.distributed.all_reduce
        on the TP group, synchronous): in the forward of ``_ReduceFromModelParallelRegion``
        (221-235, RowParallelLinear's output, layers.py:1566), in the backward of
        ``_CopyToModelParallelRegion`` (201-218, ColumnParallelLinear's input, layers.py:1225).
        The compute stream then waits for it (work.wait())."""
        name = "_CopyToModelParallelRegion" if backward else "_ReduceFromModelParallelRegion"
        start, outer = self.t, self._take_external()
        inner = self._take_external() if backward else None
        self.t += self._host(1_000)
        kernel = self._collective(step, "tp", tid, TP_NELEMS, self.sc.tp_allreduce_ns, recompute)
        self._stream_wait(kernel, tid)
        self.tp_waited = kernel
        self.t += self._host(1_000)
        if backward:
            node = f"{name}Backward"
            args = {"Fwd thread id": 1, "Record function id": 0}
            if seq is not None:  # every autograd node's ranges carry its sequence number
                args = {"Sequence number": seq, **args}
            self._node_ranges(node, tid, start, (outer, inner), args)
        else:
            self.events.append(
                _HostEvent("cpu_op", name, tid, start, self.t, {"External id": outer, "Record function id": 0})
            )

    def _grad_bucket(self, step: int) -> None:
        """Megatron's overlap_grad_reduce: the grad accumulator's hook
        (distributed_data_parallel.py:473, ``_make_backward_post_hook`` 553-582) registers the
        grads ready (param_and_grad_buffer.py:863-884, last microbatch only); the bucket's last
        one starts ``start_grad_sync`` (600-): an async all_reduce on the DP group (730-731)."""
        start, outer, inner = self.t, self._take_external(), self._take_external()
        node = "torch::autograd::AccumulateGrad"
        self.t += self._host(1_000)
        kernel = self._collective(step, "dp", self.autograd_tid, DP_BUCKET_NELEMS, self.sc.dp_allreduce_ns)
        self.grad_syncs.append(kernel)
        self.t += self._host(1_000)
        self._node_ranges(node, self.autograd_tid, start, (outer, inner), {"Record function id": 0})

    def _node_ranges(self, node: str, tid: int, start: int, externals: tuple[int, int | None], args: dict) -> None:
        """An autograd node run by the engine from ``start`` to now: its evaluate_function range
        and, inside, the node's own (each with its External id)."""
        outer, inner = externals
        self.events.append(
            _HostEvent(
                "cpu_op",
                f"autograd::engine::evaluate_function: {node}",
                tid,
                start,
                self.t,
                {"External id": outer, **args},
            )
        )
        self.events.append(_HostEvent("cpu_op", node, tid, start + 200, self.t - 200, {"External id": inner, **args}))

    def _finish_grad_sync(self) -> None:
        """finalize_model_grads (finalize_model_grads.py:640) > finish_grad_sync: every bucket's
        handle waited on (param_and_grad_buffer.py:787-829) before the optimizer."""
        for kernel in self.grad_syncs:
            self._stream_wait(kernel)
        self.grad_syncs = []

    def _collective(self, step: int, role: str, tid: int, nelems: int, dur_ns: int, recompute: bool = False) -> Kernel:
        """One ``torch.distributed.all_reduce`` on NCCL: ``c10d::allreduce_`` >
        ``record_param_comms`` ("Collective name": "allreduce"), syncStreams (the group's NCCL
        stream waits for the compute stream), ``nccl:all_reduce`` and its kernel on the group's
        stream. The kernel spins until every member's has started; all end together."""
        sc = self.sc
        group = self.groups[role]
        ranks = group["ranks"]
        n = self.collective_calls[role] = self.collective_calls.get(role, 0) + 1
        start, end = self.t, self.t + self._host(P2P_HOST_NS)
        self._event("cpu_op", "c10d::allreduce_", tid, start, end, **{"Record function id": 0})
        meta = {
            "Collective name": "allreduce",
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "Group size": len(ranks),
            "dtype": "BFloat16",
            "In split size": "[]",
            "Out split size": "[]",
            **(_group_fields(group) if sc.pg_metadata else {}),
            "Rank": ranks.index(self.world_rank),
            "Seq": n,
        }
        comms = self._event(
            "cpu_op",
            "record_param_comms",
            tid,
            start + 2_000,
            end - 2_000,
            **{"Record function id": 0, **_rank_span(ranks), **meta},
        )
        self._runtime("event_record", tid, start + 4_000, start + 5_000, comms)
        self._runtime("stream_wait", tid, start + 6_000, start + 7_000, comms)
        annotation = self._event(
            "user_annotation", "nccl:all_reduce", tid, start + 9_000, end - 6_000, **{"Record function id": 0}
        )
        kernel = self._launch(
            TP_ALLREDUCE_KERNEL if role == "tp" else DP_ALLREDUCE_KERNEL,
            f"{role}_allreduce",
            TP_STREAM if role == "tp" else DP_STREAM,
            tid,
            start + 12_000,
            start + 20_000,
            comms,
            step,
            dur_ns,
            deps=[self.last_compute] if self.last_compute else [],
            args={**meta, "_annotation": ("nccl:all_reduce", annotation)},
            collective=(role, group["name"], n),
            group_size=len(ranks),
            recompute=recompute,
        )
        self.t = end
        return kernel

    def launch_cost(self) -> int:
        return self.sc.launch_cost(self.rank, self.pipe)

    def _stream_wait(self, kernel: Kernel, tid: int | None = None) -> None:
        """work.wait() on NCCL: the compute stream waits for the kernel's end (the host goes on)."""
        self._runtime("stream_wait", self.main_tid if tid is None else tid, self.t, self.t + 1_000, 0)
        self.t += self._host(2_000)
        self.stream_waits.append(kernel)

    def _p2p_call(self, direction: str, peer: int) -> tuple[int, int, dict]:
        """The host side of one send/recv: ``c10d::send`` / ``c10d::recv_`` > ``record_param_comms``,
        and syncStreams (the NCCL stream waits for the work already queued on the compute stream).
        Returns the call's start, the record_param_comms External id and its comm metadata."""
        sc = self.sc
        start, end = self.t, self.t + self._host(P2P_HOST_NS)
        nelems = MESSAGE_SHAPE[0] * MESSAGE_SHAPE[1]
        op = "c10d::send" if direction == "send" else "c10d::recv_"
        shapes = {  # record_shapes=True: the call's arguments, the peer as the group's rank
            "Concrete Inputs": ["", "", str(peer), "0"],
            "Input type": ["TensorList", "", "Scalar", "Scalar"],
            "Input Strides": [[[MESSAGE_SHAPE[1], 1]], [], [], []],
            "Input Dims": [[list(MESSAGE_SHAPE)], [], [], []],
        }
        self._event(
            "cpu_op",
            op,
            self.main_tid,
            start,
            end,
            **{
                "Sequence number": self.next_sequence,
                "Fwd thread id": 0,
                "Record function id": 0,
                **(shapes if sc.record_shapes else {}),
            },
        )
        self.p2p_calls += 1
        own, named = self._metadata_ranks(peer)
        meta = {
            "Collective name": direction,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "Group size": sc.p,
            "dtype": "Float",
            "In split size": "[]",
            "Out split size": "[]",
            **self._pipeline_group(),
            "Rank": own,
            ("Dst Rank" if direction == "send" else "Src Rank"): named,
            "Seq": self.p2p_calls,
        }
        comms = self._event(
            "cpu_op",
            "record_param_comms",
            self.main_tid,
            start + 2_000,
            end - 2_000,
            **{"Record function id": 0, **self._p2p_rank_span(), **meta},
        )
        self._runtime("event_record", self.main_tid, start + 4_000, start + 5_000, comms)
        self._runtime("stream_wait", self.main_tid, start + 6_000, start + 7_000, comms)
        self.t = end
        return start, comms, meta

    def _pipeline_group(self) -> dict:
        """record_param_comms' process group fields of a P2P op: a 3-D job's pipeline group
        (none without pg_metadata), else as :func:`_pipeline_group` says."""
        if not self.sc.multi_dim:
            return _pipeline_group(self.sc)
        return _group_fields(self.groups["pp"]) if self.sc.pg_metadata else {}

    def _p2p_rank_span(self) -> dict:
        if not self.sc.multi_dim:
            return {"Global rank start": 0, "Global rank stride": 1}
        return _rank_span(self.groups["pp"]["ranks"])

    def _metadata_ranks(self, peer: int) -> tuple[int, int]:
        """The (own, peer) ranks a P2P op's title and record_param_comms name: the pipeline
        group's ranks, or with p2p_comm_ranks those of the two-rank communicator NCCL runs the
        pair on (ProcessGroupNCCL: the lower rank is 0), as pytorch#153819 reports them."""
        if not self.sc.p2p_comm_ranks:
            return self.rank, peer
        own = 0 if self.rank <= peer else 1
        return own, 1 - own

    def _p2p(self, step: int, direction: str, peer: int, message: tuple) -> Kernel:
        """One c10d::send / c10d::recv_ call and its NCCL kernel on the (peer, direction) stream."""
        sc = self.sc
        start, comms, meta = self._p2p_call(direction, peer)
        end = self.t
        own, named = self._metadata_ranks(peer)
        title = f"nccl:send {own}->{named}" if direction == "send" else f"nccl:recv {own}<-{named}"
        annotation = self._event(
            "user_annotation", title, self.main_tid, start + 9_000, end - 6_000, **{"Record function id": 0}
        )
        # one stream per peer and direction (a simplification), or per peer pair as NCCL has it
        # (a single op's communicator is keyed by the rank pair: Megatron's unbatched P2P)
        pair = sc.peer_streams or (sc.framework == "megatron" and sc.megatron_p2p == "overlap")
        stream = 20 + 2 * peer + (0 if direction == "send" or pair else 1)
        src, dst = (self.rank, peer) if direction == "send" else (peer, self.rank)
        kernel = self._launch(
            sc.platform.comm_kernel,
            direction,
            stream,
            self.main_tid,
            start + 12_000,
            start + 20_000,
            comms,
            step,
            sc.transfer(src, dst),
            ops=[(direction, message, sc.transfer(src, dst))],
            deps=self._compute_deps(),
            args={**meta, "_annotation": (title, annotation)},
        )
        return kernel

    def _communicate(self, step: int, ops: list[tuple[str, int, tuple]]) -> None:
        """Megatron's ``_communicate`` with unbatched ops: each op its own kernel on the peer
        pair's stream, ops with the next rank sending first and ops with the previous rank
        receiving first (``_p2p_ops``); the compute stream waits for all of them."""
        for op in sorted(ops, key=lambda op: (op[1] > self.rank) == (op[0] == "recv")):
            self._stream_wait(self._p2p(step, *op))

    def _fused_before(self, step: int, recv: tuple | None) -> None:
        """Schedule1F1B before an action: the held sends and the action's recv go out as one
        group (``fwd_send_bwd_recv`` / ``bwd_send_fwd_recv``), and the compute waits for it."""
        group = self.pending_sends + ([recv] if recv else [])
        self.pending_sends = []
        if group:
            self._stream_wait(self._p2p_group(step, group))

    def _fused_after(self, step: int, send: tuple | None, next_action: Action | None) -> None:
        """Schedule1F1B after an action: a send is held to fuse with the next action's recv when
        that action is of the other kind (the 1B1F phase and the last warmup forward); otherwise
        it goes out alone, once the send posted alone before it is waited on."""
        if self.send_work is not None:
            self._stream_wait(self.send_work)
            self.send_work = None
        if send is None:
            return
        if next_action is not None and next_action[1] != send[2][1]:
            self.pending_sends.append(send)
        else:
            self.send_work = self._p2p_group(step, [send])

    def _p2p_group(self, step: int, group: list[tuple[str, int, tuple]]) -> Kernel:
        """batch_isend_irecv on NCCL (``_coalescing_manager``): each op's ``c10d::send`` /
        ``c10d::recv_`` call enqueues it inside ncclGroupStart/End and launches nothing; the
        group's end (``nccl:coalesced``) launches ONE fused SendRecv kernel for all of them on
        the process group's stream (batch P2P takes the group's communicator, not a per-peer one)."""
        sc = self.sc
        ops = []
        for direction, peer, message in group:
            self._p2p_call(direction, peer)
            src, dst = (self.rank, peer) if direction == "send" else (peer, self.rank)
            ops.append((direction, message, sc.transfer(src, dst)))
            self.t += self._host(1_000)
        start = self.t
        annotation = self._event(
            "user_annotation", "nccl:coalesced", self.main_tid, start, start + 12_000, **{"Record function id": 0}
        )
        kernel = self._launch(
            sc.platform.comm_kernel,
            "sendrecv",
            FUSED_STREAM,
            self.main_tid,
            start + 2_000,
            start + 10_000,
            annotation,
            step,
            max(t for _, _, t in ops),
            ops=ops,
            deps=self._compute_deps(),
            args={"_annotation": ("nccl:coalesced", annotation)},
        )
        self.t = start + 14_000
        return kernel

    def _optimizer(self, step: int) -> None:
        start = self.t
        cost = self.launch_cost()
        ext = self._take_external()
        for k in range(OPTIMIZER_KERNELS):
            op_start = start + 10_000 + k * cost
            owner = self._event(
                "cpu_op", "aten::_foreach_add_", self.main_tid, op_start, op_start + cost, **{"Record function id": 0}
            )
            self._launch(
                _OPTIM_KERNEL,
                "optimizer",
                COMPUTE_STREAM,
                self.main_tid,
                op_start + cost // 4,
                op_start + 3 * cost // 4,
                owner,
                step,
                OPTIMIZER_KERNEL_NS,
            )
        self.t = start + 10_000 + OPTIMIZER_KERNELS * cost + 10_000
        self.events.append(
            _HostEvent(
                "user_annotation",
                "Optimizer.step#SGD.step",
                self.main_tid,
                start,
                self.t,
                {"External id": ext, "Record function id": 0},
            )
        )


def _latency(sc: Scenario) -> int:
    return LAUNCH_LATENCY_NS if sc.host_costs else 0


def _resolve(
    kernels: list[Kernel], latency_ns: int = LAUNCH_LATENCY_NS, partial: bool = False, contention: float = 1.0
) -> None:
    """Device start/end of every kernel launched so far: streams in FIFO order, P2P paired.
    ``partial``: kernels that cannot run yet (a peer not launched) may stay unresolved.
    ``contention``: the factor a transfer takes while a TP all-reduce of either end runs
    (module doc, "Contention")."""
    streams: dict[tuple[int, int, int], list[Kernel]] = {}
    tp_of: dict[tuple[int, int], list[Kernel]] = {}  # (pipe, rank) -> its TP all-reduce kernels
    for k in kernels:
        streams.setdefault((k.pipe, k.rank, k.stream), []).append(k)
        if contention != 1.0 and k.kind == "tp_allreduce":
            tp_of.setdefault((k.pipe, k.rank), []).append(k)
    peers: dict[tuple, dict[str, Kernel]] = {}  # (pipe, message) -> {"send": kernel, "recv": kernel}
    members: dict[tuple, list[Kernel]] = {}  # collective -> its kernels launched so far
    for k in kernels:
        for direction, message, _ in k.ops:
            peers.setdefault((k.pipe, message), {})[direction] = k
        if k.collective is not None:
            members.setdefault(k.collective, []).append(k)
    heads = {key: 0 for key in streams}
    for key, queue in streams.items():  # skip what an earlier call already resolved
        while heads[key] < len(queue) and queue[heads[key]].end_ns is not None:
            heads[key] += 1
    progress = True
    while progress:
        progress = False
        for key, queue in streams.items():
            while heads[key] < len(queue):
                k = queue[heads[key]]
                previous_end = queue[heads[key] - 1].end_ns if heads[key] else 0
                if any(d.end_ns is None for d in k.deps):
                    break
                ready = max([k.launch_end_ns + latency_ns, previous_end] + [d.end_ns for d in k.deps])
                if k.collective is not None:
                    k.ready_ns = k.start_ns = ready
                    group = members[k.collective]
                    if len(group) < k.group_size or any(other.ready_ns is None for other in group):
                        break  # spins until every member has started; then all end together
                    k.end_ns = max(other.ready_ns for other in group) + k.dur_ns
                elif not k.ops:
                    k.start_ns, k.end_ns = ready, ready + k.dur_ns
                else:
                    k.ready_ns = k.start_ns = ready
                    others = [
                        peers[(k.pipe, message)].get("recv" if direction == "send" else "send")
                        for direction, message, _ in k.ops
                    ]
                    if any(other is None or other.ready_ns is None for other in others):
                        break  # spins until every peer kernel it moves data with has started
                    # Each direction moves once both sides run; the kernel ends with the last.
                    k.end_ns = max(
                        max(k.ready_ns, other.ready_ns)
                        + _taken(k, other, message, transfer, tp_of, members, contention)
                        for other, (_, message, transfer) in zip(others, k.ops)
                    )
                heads[key] += 1
                progress = True
    stuck = sum(k.end_ns is None for k in kernels)
    if stuck and not partial:
        raise RuntimeError(f"the generated schedule deadlocks on the device: {stuck} kernels never run")


def _taken(
    k: Kernel,
    other: Kernel,
    message: tuple,
    transfer: int,
    tp_of: dict[tuple[int, int], list[Kernel]],
    members: dict[tuple, list[Kernel]],
    factor: float,
) -> int:
    """The time ``message``'s transfer takes between kernels ``k`` and ``other`` (module doc,
    "Contention"): ``transfer``, or ``factor`` times it where a TP all-reduce kernel of either
    end's rank runs during it (as far as the kernels resolved so far say); decided once per
    message, by whichever end resolves first."""
    if factor == 1.0:
        return transfer
    if message in other.taken:
        return other.taken[message]
    begin = max(k.ready_ns, other.ready_ns)  # type: ignore[type-var]

    def ends_after_begin(tp: Kernel) -> bool:
        if tp.end_ns is not None:
            return tp.end_ns > begin
        group = members[tp.collective]
        if len(group) < tp.group_size or any(o.ready_ns is None for o in group):
            return True  # still spinning for a member
        return max(o.ready_ns for o in group) + tp.dur_ns > begin  # its end, not yet written

    busy = any(
        tp.ready_ns is not None and tp.ready_ns < begin + transfer and ends_after_begin(tp)
        for end in (k, other)
        for tp in tp_of.get((end.pipe, end.rank), [])
    )
    k.taken[message] = other.taken[message] = round(transfer * factor) if busy else transfer
    return k.taken[message]


def _forward_shapes(k: int, tp: int) -> tuple[dict, dict]:
    """The record_shapes args of forward op ``k`` (module doc, "Activation memory") and of the
    aten::addmm inside a linear: every 4 ops an MLP, linear H -> 4H/tp, gelu, linear 4H/tp -> H,
    gelu, on rows x H float activations (MESSAGE_SHAPE)."""
    rows, hidden = MESSAGE_SHAPE
    inner = 4 * hidden // tp
    width = hidden if k % 4 in (0, 3) else inner  # the op's input
    if k % 2:
        return {"Input Dims": [[rows, width]], "Input type": ["float"]}, {}
    out = inner if k % 4 == 0 else hidden
    top = {"Input Dims": [[rows, width], [out, width], [out]], "Input type": ["float", "float", "float"]}
    addmm = {
        "Input Dims": [[out], [rows, width], [width, out], [], []],
        "Input type": ["float", "float", "float", "Scalar", "Scalar"],
    }
    return top, addmm


def forward_input_bytes(sc: Scenario) -> list[int]:
    """Bytes of each forward op's activation input, its first (module doc, "Activation memory")."""
    out = []
    for k in range(sc.kernels_f):
        rows, width = _forward_shapes(k, sc.tp)[0]["Input Dims"][0]
        out.append(rows * width * 4)
    return out


def _run_megatron_step(ranks: list[_Rank], step: int, behind: dict[int, int | None]) -> None:
    """Every rank's host runs its Megatron step together: a host that synchronizes with its
    device waits until the kernels it launched have run, which may need other ranks' hosts to
    launch the peers of its P2P kernels first."""
    programs = {(host.pipe, host.rank): host.megatron_step(step, behind[(host.pipe, host.rank)]) for host in ranks}
    waits: dict[int, list[Kernel] | None] = {rank: None for rank in programs}
    while programs:
        moved = False
        for rank in list(programs):
            need = waits[rank]
            if need is not None and any(k.end_ns is None for k in need):
                continue
            try:
                waits[rank] = next(programs[rank])
            except StopIteration:
                del programs[rank]
            moved = True
        _resolve(
            [k for host in ranks for k in host.kernels],
            _latency(ranks[0].sc),
            partial=True,
            contention=ranks[0].sc.tp_p2p_contention,
        )
        if not moved:
            raise RuntimeError(f"the generated Megatron step {step} deadlocks: hosts {sorted(programs)} wait forever")


def _masked_groups(sizes: dict[str, int], token: str) -> list[list[int]]:
    """Megatron's RankGenerator.get_ranks(token) (parallel_state.py:534-549) over the order
    MEGATRON_ORDER: the groups spanning the dimensions in ``token`` (generate_masked_orthogonal_rank_groups,
    269-330): a rank is sum(index[d] * stride[d]) over the order's dimensions, the earlier ones
    the faster; the groups are enumerated over the other dimensions, the earlier the faster."""
    order = MEGATRON_ORDER.split("-")
    stride, product = {}, 1
    for dim in order:
        stride[dim], product = product, product * sizes[dim]
    inside = [d for d in order if d in token.split("-")]
    outside = [d for d in order if d not in inside]

    def points(dims: list[str]) -> list[int]:
        offsets = [0]
        for dim in dims:  # the earlier dimension varies fastest
            offsets = [o + i * stride[dim] for i in range(sizes[dim]) for o in offsets]
        return offsets

    return [[base + offset for offset in points(inside)] for base in points(outside)]


def process_groups(sc: Scenario) -> list[dict]:
    """The process groups a 3-D job creates, in creation order, as pg_config writes them
    (torch/distributed/distributed_c10d.py ``_get_pg_config``, torch 2.13.0 lines 1531-1543:
    pg_name, pg_desc, backend_config, pg_size, ranks), each with its ``role``. Names count up
    over every new_group call, members or not (``_process_group_name``, 5486-5494), so they are
    the job's, not a rank's. Megatron's initialize_model_parallel (parallel_state.py at
    NVIDIA/Megatron-LM d98e8a64dd) creates, with cp = ep = 1 and create_gloo_process_groups=True
    (its default, 620): per "dp-cp" group DATA_PARALLEL_GROUP_WITH_CP and its gloo twin (963-976),
    per "dp" group DATA_PARALLEL_GROUP and DATA_PARALLEL_GROUP_GLOO (1053-1062),
    CONTEXT_PARALLEL_GROUP per "cp" group (1117-1122), MODEL_PARALLEL_GROUP per "tp-pp" group
    (1147-1152), TENSOR_MODEL_PARALLEL_GROUP per "tp" group (1164-1169),
    PIPELINE_MODEL_PARALLEL_GROUP per "pp" group (1240-1250). The groups it creates after
    those (embedding, tp-dp, expert, ...) are left out here (a real pg_config lists them too)."""
    sizes = {"tp": sc.tp, "cp": 1, "ep": 1, "dp": sc.dp, "pp": sc.p}
    world = list(range(sc.world_size))
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": world, "role": "world", "gloo": False}]

    def add(ranks: list[int], desc: str, role: str, gloo: bool = False) -> None:
        groups.append({"pg_name": str(len(groups)), "pg_desc": desc, "ranks": ranks, "role": role, "gloo": gloo})

    for ranks in _masked_groups(sizes, "dp-cp"):
        add(ranks, "DATA_PARALLEL_GROUP_WITH_CP", "dp")
        add(ranks, "DATA_PARALLEL_GROUP_WITH_CP_GLOO", "dp", gloo=True)
    for ranks in _masked_groups(sizes, "dp"):
        add(ranks, "DATA_PARALLEL_GROUP", "dp")
        add(ranks, "DATA_PARALLEL_GROUP_GLOO", "dp", gloo=True)
    for ranks in _masked_groups(sizes, "cp"):
        add(ranks, "CONTEXT_PARALLEL_GROUP", "cp")
    for ranks in _masked_groups(sizes, "tp-pp"):
        add(ranks, "MODEL_PARALLEL_GROUP", "mp")
    for ranks in _masked_groups(sizes, "tp"):
        add(ranks, "TENSOR_MODEL_PARALLEL_GROUP", "tp")
    for ranks in _masked_groups(sizes, "pp"):
        add(ranks, "PIPELINE_MODEL_PARALLEL_GROUP", "pp")
    return [
        {
            "pg_name": g["pg_name"],
            "pg_desc": g["pg_desc"],
            "backend_config": "cpu:gloo,cuda:gloo" if g["gloo"] else "cuda:nccl",
            "pg_size": len(g["ranks"]),
            "ranks": g["ranks"],
            "role": g["role"],
        }
        for g in groups
    ]


# The group each role's traffic goes on: Megatron's TP all-reduces on the tensor-parallel group,
# gradient buckets on the data-parallel group (with cp = 1 the same ranks as "dp-cp";
# param_and_grad_buffer.py:700-703 takes data_parallel_group), P2P on the pipeline group.
_ROLE_DESC = {
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
}


def _rank_groups(sc: Scenario, world_rank: int) -> dict[str, dict]:
    """role -> {name, desc, ranks} of the group a rank's traffic of that role goes on: the
    default group for P2P in a plain pipeline (as before), Megatron's groups in a 3-D job."""
    if not sc.multi_dim:
        return {}
    out = {}
    for group in process_groups(sc):
        role = next((r for r, desc in _ROLE_DESC.items() if desc == group["pg_desc"]), None)
        if role and world_rank in group["ranks"]:
            out[role] = {"name": group["pg_name"], "desc": group["pg_desc"], "ranks": group["ranks"]}
    return out


def _group_fields(group: dict) -> dict:
    """record_param_comms' process group fields of an op on ``group``."""
    return {
        "Process Group Name": group["name"],
        "Process Group Description": group["desc"],
        "Process Group Ranks": str(group["ranks"]),
    }


def _rank_span(ranks: list[int]) -> dict:
    """record_param_comms' "Global rank start" / "Global rank stride" of a strided group."""
    return {"Global rank start": ranks[0], "Global rank stride": ranks[1] - ranks[0] if len(ranks) > 1 else 1}


def _pipeline_group(sc: Scenario) -> dict:
    """record_param_comms' process group fields of a P2P op: the default group, or with a
    rank_order the pipeline group (its ranks by group rank, as torch lists them)."""
    if sc.rank_order is None:
        return {
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(sc.p))),
        }
    return {
        "Process Group Name": "1",
        "Process Group Description": "pipeline_model_parallel_group",
        "Process Group Ranks": str(list(sc.rank_order)),
    }


def _union_in(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``spans`` clipped to [lo, hi]."""
    total, reach = 0, lo
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def simulate(sc: Scenario) -> tuple[list[_Rank], list[Kernel]]:
    """Run the scenario; every kernel's device times are filled in."""
    rng = random.Random(sc.seed)
    ranks = [_Rank(sc, r, rng, pipe) for pipe in range(sc.n_pipes) for r in range(sc.p)]
    kernels: list[Kernel] = []
    device_end: dict[tuple[int, int, int], int] = {}  # (pipe, rank, step) -> its last kernel's end
    steps = [FIRST_STEP + i for i in range(sc.steps)]
    for i, step in enumerate(steps):
        behind = {
            (host.pipe, host.rank): None if sc.host_sync or i < 2 else device_end[(host.pipe, host.rank, steps[i - 2])]
            for host in ranks
        }
        if sc.framework == "megatron":
            _run_megatron_step(ranks, step, behind)
        else:
            for host in ranks:
                host.run_step(step, behind[(host.pipe, host.rank)])
        kernels = [k for host in ranks for k in host.kernels]
        _resolve(kernels, _latency(sc), contention=sc.tp_p2p_contention)
        for host in ranks:
            end = device_end[(host.pipe, host.rank, step)] = max(k.end_ns for k in host.kernels if k.step == step)
            host.end_step(step, end if sc.host_sync else None)
    return ranks, kernels


def ground_truth(sc: Scenario, ranks: list[_Rank], kernels: list[Kernel]) -> dict:
    """What the simulation knows, from its own numbers (never from the written files). A 3-D
    job's truth has more keys (module doc, "Truth of a 3-D job")."""
    steps = sorted({k.step for k in kernels})
    per_step: list[dict] = []
    totals = ("window_ns", "busy_ns", "action_busy_ns", "host_wait_ns", "host_window_ns", "host_busy_ns")
    if sc.multi_dim:
        totals += _DIM_TOTALS
    per_rank = {(h.pipe, h.rank): dict.fromkeys(totals, 0) for h in ranks}
    by_host: dict[tuple[int, int], list[Kernel]] = {}
    for k in kernels:
        by_host.setdefault((k.pipe, k.rank), []).append(k)
    for step in steps:
        # the window: the action kernels (compute, and TP all-reduces inside actions) of every rank
        actions = [k for k in kernels if k.step == step and k.kind in ("compute", "tp_allreduce")]
        lo, hi = min(k.start_ns for k in actions), max(k.end_ns for k in actions)
        host_spans = {(h.pipe, h.rank): h.host_compute[step] for h in ranks}
        host_lo = min(s for spans in host_spans.values() for s, _ in spans)
        host_hi = max(e for spans in host_spans.values() for _, e in spans)
        for host in ranks:
            key = (host.pipe, host.rank)
            mine_all = [k for k in by_host[key] if k.step == step]
            mine = [k for k in mine_all if k.kind in ("compute", "optimizer")]
            busy = _union_in([(k.start_ns, k.end_ns) for k in mine], lo, hi)
            action_busy = _union_in([(k.start_ns, k.end_ns) for k in mine if k.kind == "compute"], lo, hi)
            host_busy = _union_in(host_spans[key], host_lo, host_hi)
            row = {
                "rank": host.rank,
                "step": step,
                "window_start_ns": lo,
                "window_end_ns": hi,
                "window_ns": hi - lo,
                "busy_ns": busy,
                "action_busy_ns": action_busy,
                "idle_ns": hi - lo - busy,
                "bubble_ratio": (hi - lo - busy) / (hi - lo),
                "host_wait_ns": _host_wait(host.rank, step, by_host[key], lo, hi),
                "host_window_ns": host_hi - host_lo,
                "host_busy_ns": host_busy,
                "host_bubble_ratio": (host_hi - host_lo - host_busy) / (host_hi - host_lo)
                if host_hi > host_lo
                else 0.0,
                "host_step_start_ns": host.step_spans[step][0],
                "host_step_end_ns": host.step_spans[step][1],
                "device_end_ns": max(k.end_ns for k in mine_all),
                "_pipe": host.pipe,
            }
            if sc.multi_dim:
                row.update(_dim_figures(sc, host, mine_all, lo, hi, busy))
            per_step.append(row)
            for name in totals:
                per_rank[key][name] += row[name]
    rank_rows = []
    for (pipe, r), tot in per_rank.items():
        idle = tot["window_ns"] - tot["busy_ns"]
        row = {
            "rank": r,
            **tot,
            "idle_ns": idle,
            "bubble_ratio": idle / tot["window_ns"],
            "host_bubble_ratio": (tot["host_window_ns"] - tot["host_busy_ns"]) / tot["host_window_ns"],
            "clock_offset_ns": sc.clock_offset_ns.get(sc.global_rank(r, pipe) if sc.multi_dim else r, 0),
            "_pipe": pipe,
        }
        if sc.multi_dim:
            row.update(_dim_ratios(sc, pipe, r, tot))
        rank_rows.append(row)
    pairs = []
    sends = {(k.pipe, message): k for k in kernels for direction, message, _ in k.ops if direction == "send"}
    recvs = [((k.pipe, message), k) for k in kernels for direction, message, _ in k.ops if direction == "recv"]
    for (pipe, message), recv in recvs:
        send = sends[(pipe, message)]
        step, kind, stage, mb = message
        later = max(send.start_ns, recv.start_ns)
        waiting = (
            None if send.start_ns == recv.start_ns else (send.rank if send.start_ns < recv.start_ns else recv.rank)
        )
        pairs.append(
            {
                "src_rank": send.rank,
                "dst_rank": recv.rank,
                "step": step,
                "microbatch": mb,
                "src_stage": stage,
                "payload": "activation" if kind == "F" else "gradient",
                "send_start_ns": send.start_ns,
                "send_end_ns": send.end_ns,
                "recv_start_ns": recv.start_ns,
                "recv_end_ns": recv.end_ns,
                "waiting_rank": waiting,
                "wait_ns": later - min(send.start_ns, recv.start_ns),
                "transfer_ns": send.end_ns - later,
                # the message's own direction (a fused kernel ends with its slowest one), as
                # contention left it
                "message_transfer_ns": send.taken.get(
                    message, next(t for d, m, t in send.ops if m == message and d == "send")
                ),
                "_pipe": pipe,
            }
        )
    links = _shared_links_truth(sc, by_host, pairs) if sc.tp > 1 else None
    for row in rank_rows + per_step + pairs:  # the job's ranks, as the files name them
        pipe = row.pop("_pipe")
        for key in ("rank", "src_rank", "dst_rank", "waiting_rank"):
            if row.get(key) is not None:
                row[key] = sc.global_rank(row[key], pipe)
    rank_rows.sort(key=lambda row: row["rank"])
    per_step.sort(key=lambda row: (row["step"], row["rank"]))
    pairs.sort(key=lambda row: (row["step"], row["src_rank"], row["dst_rank"], row["send_start_ns"]))
    truth = {
        "what": "GENERATED by tests/gpu_tracegen.py: ground truth of a simulated GPU pipeline, not a real trace",
        "times": "ns on the simulation's reference clock (a rank's file adds its clock_offset_ns to every ts)",
        "scenario": _scenario_json(sc),
        "injected": _global_injected(sc),
        "steps": steps,
        "ranks": rank_rows,
        "per_step": per_step,
        "p2p_pairs": pairs,
    }
    if sc.multi_dim:
        truth.update(_layout_truth(sc, rank_rows))
    if links is not None:
        truth["shared_links"] = links
    if sc.recompute:
        truth["activation_memory"] = _activation_memory_truth(sc, by_host)
    return truth


def _activation_memory_truth(sc: Scenario, by_host: dict[tuple[int, int], list[Kernel]]) -> dict:
    """Activation memory per rank with recomputation on (as run) and off (module doc,
    "Activation memory"), walking each rank's actions in the order its kernels ran."""
    inputs = forward_input_bytes(sc)
    kept, everything = inputs[0], sum(inputs)  # per microbatch: the checkpoint's input; every op's
    rows = []
    for (pipe, rank), mine in sorted(by_host.items()):
        held: set[tuple[int, int, int]] = set()
        seen: set[tuple[int, tuple]] = set()
        in_flight = peak_on = peak_off = 0
        for k in sorted((k for k in mine if k.kind == "compute"), key=lambda k: k.start_ns):
            if (k.step, k.action) in seen:
                continue
            seen.add((k.step, k.action))
            stage, kind, mb = k.action
            if kind == "F":
                held.add((k.step, stage, mb))
                in_flight = max(in_flight, len(held))
                peak_on, peak_off = max(peak_on, len(held) * kept), max(peak_off, len(held) * everything)
            else:  # its forward re-run first: one microbatch's activations rebuilt beside the rest
                peak_on = max(peak_on, len(held) * kept + everything - kept)
                held.discard((k.step, stage, mb))
        rows.append(
            {
                "rank": sc.global_rank(rank, pipe),
                "in_flight": in_flight,
                "kept_per_microbatch_bytes": kept,
                "activations_per_microbatch_bytes": everything,
                "peak_recompute_on_bytes": peak_on,
                "peak_recompute_off_bytes": peak_off,
            }
        )
    return {"ranks": sorted(rows, key=lambda row: row["rank"])}


def _shared_links_truth(sc: Scenario, by_host: dict[tuple[int, int], list[Kernel]], pairs: list[dict]) -> dict:
    """TP and PP on the same links (module doc, "Contention"), from the simulation's kernels
    and ``pairs`` (pipeline positions, before they are named by job rank): per rank the time
    its TP all-reduce kernels and its P2P kernels overlap; the transfers (each pair's last
    ``transfer_ns`` before its receive ends) a TP all-reduce of either end overlaps, and the
    rest, each with its median; how many contention slowed."""
    overlap = {}
    spans = {}
    for (pipe, rank), mine in by_host.items():
        tp = [(k.start_ns, k.end_ns) for k in mine if k.kind == "tp_allreduce"]
        p2p = [(k.start_ns, k.end_ns) for k in mine if k.kind in COMM_KINDS]
        lo = min(s for s, _ in tp + p2p) if tp + p2p else 0
        hi = max(e for _, e in tp + p2p) if tp + p2p else 0
        overlap[sc.global_rank(rank, pipe)] = (
            _union_in(tp, lo, hi) + _union_in(p2p, lo, hi) - _union_in(tp + p2p, lo, hi)
        )
        spans[(pipe, rank)] = tp
    during, alone = [], []
    slowed = 0
    for pair in pairs:
        end, transfer = pair["recv_end_ns"], pair["transfer_ns"]
        ends = [(pair["_pipe"], pair["src_rank"]), (pair["_pipe"], pair["dst_rank"])]
        hit = any(s < end and e > end - transfer for key in ends for s, e in spans[key])
        (during if hit else alone).append(transfer)
        slowed += pair["message_transfer_ns"] != sc.transfer(pair["src_rank"], pair["dst_rank"])
    return {
        "contention_factor": sc.tp_p2p_contention,
        "overlap_ns": {str(r): ns for r, ns in sorted(overlap.items())},
        "n_transfers_overlapped": len(during),
        "n_transfers_alone": len(alone),
        "median_transfer_overlapped_ns": _median(during),
        "median_transfer_alone_ns": _median(alone),
        "n_transfers_slowed": slowed,
    }


def _median(values: list[int]) -> int:
    """numpy's median of ints, truncated to an int as tracekit reports it (0 for none)."""
    if not values:
        return 0
    ordered, mid = sorted(values), len(values) // 2
    return ordered[mid] if len(values) % 2 else int((ordered[mid - 1] + ordered[mid]) / 2)


# per-rank totals of a 3-D job's per-step figures (module doc, "Truth of a 3-D job")
_DIM_TOTALS = (
    "busy_with_tp_ns",
    "tp_allreduce_ns",
    "tp_allreduce_count",
    "dp_grad_ns",
    "dp_grad_count",
    "dp_grad_overlapped_ns",
    "dp_grad_exposed_ns",
    "step_end_ns",
    "recompute_ns",
)


def _dim_figures(sc: Scenario, host: _Rank, mine: list[Kernel], lo: int, hi: int, busy: int) -> dict:
    """One rank's 3-D figures in one step, from its kernels ``mine`` and the step's window [lo, hi]."""
    tp = [k for k in mine if k.kind == "tp_allreduce"]
    dp = [k for k in mine if k.kind == "dp_allreduce"]
    spans = [(k.start_ns, k.end_ns) for k in mine]
    with_tp = _union_in(
        [(k.start_ns, k.end_ns) for k in mine if k.kind in ("compute", "optimizer", "tp_allreduce")], lo, hi
    )
    recompute = _union_in([(k.start_ns, k.end_ns) for k in mine if k.recompute and k.kind == "compute"], lo, hi)
    dp_spans = [(k.start_ns, k.end_ns) for k in dp]
    after = max(k.end_ns for k in mine)
    return {
        "tp_rank": host.pipe % sc.tp,
        "dp_rank": host.pipe // sc.tp,
        "pp_rank": host.rank,
        "busy_with_tp_ns": with_tp,
        "bubble_ratio_with_tp": (hi - lo - with_tp) / (hi - lo),
        "tp_allreduce_ns": sum(k.end_ns - k.start_ns for k in tp),
        "tp_allreduce_count": len(tp),
        "dp_grad_ns": sum(k.end_ns - k.start_ns for k in dp),
        "dp_grad_count": len(dp),
        "dp_grad_overlapped_ns": _union_in(dp_spans, min([lo] + [s for s, _ in dp_spans]), hi),
        "dp_grad_exposed_ns": _union_in(dp_spans, hi, max(hi, after)),
        "step_end_ns": _union_in(spans, hi, max(hi, after)),
        "recompute_ns": recompute,
        "recompute_share": recompute / busy if busy else 0.0,
    }


def _dim_ratios(sc: Scenario, pipe: int, rank: int, tot: dict) -> dict:
    """A rank's 3-D figures over all steps: its place in the layout and the ratios of its totals."""
    return {
        "tp_rank": pipe % sc.tp,
        "dp_rank": pipe // sc.tp,
        "pp_rank": rank,
        "bubble_ratio_with_tp": (tot["window_ns"] - tot["busy_with_tp_ns"]) / tot["window_ns"],
        "recompute_share": tot["recompute_ns"] / tot["busy_ns"] if tot["busy_ns"] else 0.0,
        "overhead_share_of_idle": tot["host_wait_ns"] / max(1, tot["window_ns"] - tot["busy_ns"]),
    }


def _layout_truth(sc: Scenario, rank_rows: list[dict]) -> dict:
    """The job's layout, per-stage recompute and the slow replica (module doc)."""
    groups = process_groups(sc)
    stages = []
    for position in range(sc.p):
        rows = [row for row in rank_rows if row["pp_rank"] == position]
        recompute, busy = sum(r["recompute_ns"] for r in rows), sum(r["busy_ns"] for r in rows)
        stages.append(
            {
                "pp_rank": position,
                "ranks": sorted(row["rank"] for row in rows),
                "recompute_ns": recompute,
                "busy_ns": busy,
                "recompute_share": recompute / busy if busy else 0.0,
            }
        )
    replicas = []
    for replica in range(sc.dp):
        rows = [row for row in rank_rows if row["dp_rank"] == replica]
        replicas.append(
            {
                "dp_rank": replica,
                "ranks": sorted(row["rank"] for row in rows),
                "slowdown": sc.replica_slowdown.get(replica, 1.0),
                "action_busy_ns": sum(r["action_busy_ns"] for r in rows),
            }
        )
    slow = max(sc.replica_slowdown, key=sc.replica_slowdown.get) if sc.replica_slowdown else None
    return {
        "layout": {
            "world_size": sc.world_size,
            "dims": {"pp": sc.p, "tp": sc.tp, "dp": sc.dp},
            "order": "tp-dp-pp",
            "megatron_order": MEGATRON_ORDER,
            "line": f"{sc.world_size} ranks: PP {sc.p} x TP {sc.tp} x DP {sc.dp}, Megatron order tp-dp-pp",
            "groups": {role: [g["ranks"] for g in groups if g["pg_desc"] == desc] for role, desc in _ROLE_DESC.items()},
            "process_groups": groups,
            "pg_metadata": sc.pg_metadata,
        },
        "stages": stages,
        "replicas": replicas,
        "slow_replica": slow if slow is not None and sc.replica_slowdown[slow] > 1.0 else None,
    }


def _global_injected(sc: Scenario) -> dict:
    """:meth:`Scenario.injected` with ranks as the job numbers them (stages stay stages)."""
    injected = sc.injected()
    if "link" in injected:
        injected["link"] = [sc.global_rank(r) for r in injected["link"]]
    if "rank" in injected:
        injected["rank"] = sc.global_rank(injected["rank"])
    return injected


def _host_wait(rank: int, step: int, kernels: list[Kernel], lo: int, hi: int) -> int:
    """Device idle while the next compute kernel had not been launched yet.

    For each compute-stream kernel whose start was set by its launch (launch end + latency
    later than the previous kernel's end and its dependencies' ends), the idle gap from the
    latest of those to its start, clipped to the step window.
    """
    stream = [k for k in kernels if k.rank == rank and k.stream == COMPUTE_STREAM]
    total = 0
    for previous, k in zip(stream, stream[1:]):
        if k.step != step:
            continue
        other_ready = max([previous.end_ns] + [d.end_ns for d in k.deps])
        if k.start_ns > other_ready:  # only the launch held it back
            total += max(0, min(k.start_ns, hi) - max(other_ready, lo))
    return total


CAUSES = ("imbalance", "comm", "overhead")


def cause_shares(sc: Scenario) -> dict[int, dict[str, float]]:
    """Each rank's idle split over tracekit's three removable causes by re-simulating the job
    (truth by construction, never read from a trace): the exact Shapley value of each cause
    over the 2^3 simulations with some of them switched off, summed over steps. Switched off:
    **imbalance** (no slow stage or replica, no jitter), **comm** (every P2P transfer free),
    **overhead** (a host that costs nothing: ``host_costs=False``; launches, P2P calls, launch
    latency, synchronize returns). Values in ns per rank, for both idle definitions: ``idle``
    (busy = compute and optimizer kernels) and ``idle_with_tp`` (TP all-reduce kernels busy
    too, tracekit's default on a TP job, where a TP kernel's wait for its slowest peer shrinks
    with the overhead). What a root cause costs where it propagates, as tracekit's attribution
    charges it; ``host_wait_ns`` in the truth is the rank's own late launches only."""
    from itertools import combinations
    from math import factorial

    def idle(present: frozenset[str]) -> dict[int, tuple[int, int]]:
        changed = sc
        if "imbalance" not in present:
            changed = replace(changed, stage_factor={}, replica_slowdown={}, jitter=0.0)
        if "comm" not in present:
            changed = replace(changed, transfer_ns=0, link_transfer_ns={})
        if "overhead" not in present:
            changed = replace(changed, host_costs=False)
        ranks, kernels = simulate(changed)
        rows = ground_truth(changed, ranks, kernels)["ranks"]
        return {
            row["rank"]: (
                row["window_ns"] - row["busy_ns"],
                row["window_ns"] - row.get("busy_with_tp_ns", row["busy_ns"]),
            )
            for row in rows
        }

    values = {frozenset(c): idle(frozenset(c)) for k in range(len(CAUSES) + 1) for c in combinations(CAUSES, k)}
    n = len(CAUSES)
    out: dict[int, dict[str, float]] = {}
    for rank in values[frozenset(CAUSES)]:
        row: dict[str, float] = {}
        for which, key in ((0, "idle"), (1, "idle_with_tp")):
            for cause in CAUSES:
                others = [c for c in CAUSES if c != cause]
                total = 0.0
                for k in range(n):
                    weight = factorial(k) * factorial(n - k - 1) / factorial(n)
                    for coalition in combinations(others, k):
                        with_it = values[frozenset(coalition) | {cause}][rank][which]
                        without = values[frozenset(coalition)][rank][which]
                        total += weight * (with_it - without)
                row[f"{cause}_{key}_ns"] = total
            row[f"{key}_ns"] = values[frozenset(CAUSES)][rank][which]
        out[rank] = row
    return out


def link_costs(sc: Scenario) -> dict[tuple[int, int], dict[str, int]]:
    """What each link (src rank, dst rank) costs the run, by simulating it again (truth by
    construction, never read from a trace): ``freed_ns``, the idle (all ranks, all steps)
    that making that link's transfers free saves; ``alone_ns``, the idle that link adds when
    every other link is free. Links whose costs add up have the two equal; with many links
    alike, freeing one saves little (the critical path moves to the next) while it alone
    costs much."""

    def idle(transfers: dict[tuple[int, int], int]) -> int:
        changed = replace(sc, transfer_ns=0, link_transfer_ns=transfers)
        ranks, kernels = simulate(changed)
        return sum(row["idle_ns"] for row in ground_truth(changed, ranks, kernels)["ranks"])

    ranks, kernels = simulate(sc)
    links = sorted({(p["src_rank"], p["dst_rank"]) for p in ground_truth(sc, ranks, kernels)["p2p_pairs"]})
    measured = {link: sc.transfer(*link) for link in links}
    everything, nothing = idle(measured), idle({})
    return {
        link: {
            "freed_ns": everything - idle({**measured, link: 0}),
            "alone_ns": idle({link: measured[link]}) - nothing,
        }
        for link in links
    }


# Scenario fields of 3-D jobs, left out of the truth's scenario where they are at their
# defaults so that the plain scenarios' truth files stay byte for byte as they were
_DIM_FIELDS = (
    "tp",
    "dp",
    "tp_allreduce_ns",
    "dp_allreduce_ns",
    "dp_buckets",
    "replica_slowdown",
    "recompute",
    "pg_metadata",
    "tp_p2p_contention",
)


def _scenario_json(sc: Scenario) -> dict:
    out = asdict(sc)
    if sc.multi_dim:
        out["replica_slowdown"] = {str(k): v for k, v in sc.replica_slowdown.items()}
    else:
        for name in _DIM_FIELDS:
            del out[name]
    out["link_transfer_ns"] = [[s, d, ns] for (s, d), ns in sc.link_transfer_ns.items()]
    out["rank_order"] = None if sc.rank_order is None else list(sc.rank_order)
    for key in ("stage_factor", "rank_launch_ns", "clock_offset_ns"):
        out[key] = {str(k): v for k, v in out[key].items()}
    return out


# -- writer ----------------------------------------------------------------------------------
def _us(t_ns: int) -> float:
    return round(t_ns / 1000, 3)


def _kernel_args(platform: Platform, k: Kernel, device: int) -> dict:
    """A kernel's own args: CUPTI's, or roctracer's (device, stream, correlation, kind; no
    grid or block, as in the real MI250 trace). Comm metadata is added beside them."""
    comm = bool(k.ops) or k.collective is not None
    if platform.rocm:
        return {
            "External id": k.external_id,
            "device": device,
            "stream": k.stream,
            "correlation": k.correlation,
            "kind": "Dispatch Kernel",
        }
    return {
        "External id": k.external_id,
        "queued": 0,
        "device": device,
        "context": 1,
        "stream": k.stream,
        "correlation": k.correlation,
        "registers per thread": 96 if comm else 128,
        "shared memory": 0,
        "blocks per SM": 0.5,
        "warps per SM": 2.0,
        "grid": [2, 1, 1] if comm else [132, 1, 1],
        "block": [640, 1, 1] if comm else [384, 1, 1],
        "est. achieved occupancy %": 0 if comm else 19,
    }


def _rank_document(sc: Scenario, host: _Rank, kernels: list[Kernel]) -> dict:
    offset = ORIGIN_NS + sc.clock_offset_ns.get(host.world_rank if sc.multi_dim else host.rank, 0)
    device = host.world_rank
    events: list[dict] = []

    def x(cat: str, name: str, pid, tid, start: int, end: int, args: dict) -> None:
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": _us(start + offset),
                "dur": _us(end - start),
                "args": args,
            }
        )

    def meta(name: str, pid, tid, args: dict) -> None:
        events.append({"name": name, "ph": "M", "ts": _us(offset), "pid": pid, "tid": tid, "args": args})

    meta("process_name", host.pid, 0, {"name": "python3.11"})
    meta("process_labels", host.pid, 0, {"labels": "CPU"})
    meta("process_sort_index", host.pid, 0, {"sort_index": host.pid})
    meta("process_name", device, 0, {"name": "python3.11"})
    meta("process_labels", device, 0, {"labels": f"GPU {device}"})
    meta("process_sort_index", device, 0, {"sort_index": 16777216 + device})
    for tid, label in ((host.main_tid, "pt_main_thread"), (host.autograd_tid, f"pt_autograd_{device}")):
        meta("thread_name", host.pid, tid, {"name": f"thread {tid} ({label})"})
        meta("thread_sort_index", host.pid, tid, {"sort_index": tid})
    for stream in sorted({k.stream for k in kernels}):
        meta("thread_name", device, stream, {"name": f"stream {stream} "})
        meta("thread_sort_index", device, stream, {"sort_index": stream})
    for ev in host.events:
        x(ev.cat, ev.name, host.pid, ev.tid, ev.start_ns, ev.end_ns, dict(ev.args))
    by_external = {ev.args["External id"]: ev for ev in host.events if ev.cat != "cuda_runtime"}
    for k in kernels:
        args = _kernel_args(sc.platform, k, device)
        extra = dict(k.args)
        annotation = extra.pop("_annotation", None)
        args.update(extra)
        x("kernel", k.name, device, k.stream, k.start_ns, k.end_ns, args)
        events.append(
            {
                "ph": "s",
                "id": k.correlation,
                "pid": host.pid,
                "tid": k.tid,
                "ts": _us(k.launch_start_ns + offset),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        events.append(
            {
                "ph": "f",
                "id": k.correlation,
                "pid": device,
                "tid": k.stream,
                "ts": _us(k.start_ns + offset),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        if annotation:
            title, ext = annotation
            x("gpu_user_annotation", title, device, k.stream, k.start_ns, k.end_ns, {"External id": ext})
    for ev in host.events:  # the optimizer's device extent, as Kineto records it
        if ev.name.startswith("Optimizer.step"):
            mine = [k for k in kernels if k.kind == "optimizer" and ev.start_ns <= k.launch_start_ns <= ev.end_ns]
            x(
                "gpu_user_annotation",
                ev.name,
                device,
                COMPUTE_STREAM,
                min(k.start_ns for k in mine),
                max(k.end_ns for k in mine),
                {"External id": ev.args["External id"]},
            )
    for flow_id, forward_ext, backward_ext in host.flows:
        fwd, bwd = by_external[forward_ext], by_external[backward_ext]
        events.append(
            {
                "ph": "s",
                "id": flow_id,
                "pid": host.pid,
                "tid": fwd.tid,
                "ts": _us(fwd.start_ns + offset),
                "cat": "fwdbwd",
                "name": "fwdbwd",
            }
        )
        events.append(
            {
                "ph": "f",
                "id": flow_id,
                "pid": host.pid,
                "tid": bwd.tid,
                "ts": _us(bwd.start_ns + offset),
                "cat": "fwdbwd",
                "name": "fwdbwd",
                "bp": "e",
            }
        )
    first = min(ev.start_ns for ev in host.events)
    last = max([ev.end_ns for ev in host.events] + [k.end_ns for k in kernels])
    x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", first - 1_000, last + 1_000, {"Op count": 0})
    # Time order, metadata first, a parent before the children that start with it.
    events.sort(key=lambda e: (e["ph"] != "M", e["ts"], -e.get("dur", 0)))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, **sc.platform.device} for d in range(sc.world_size)],
        "distributedInfo": _distributed_info(sc, host.world_rank)
        if sc.multi_dim
        else {
            "backend": "nccl",
            "rank": sc.global_rank(host.rank),
            "world_size": sc.p,
            "pg_count": 1 if sc.rank_order is None else 2,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": sc.p,
                    "ranks": list(range(sc.p)),
                }
            ]
            + (
                []
                if sc.rank_order is None
                else [
                    {
                        "pg_name": "1",
                        "pg_desc": "pipeline_model_parallel_group",
                        "backend_config": "cuda:nccl",
                        "pg_size": sc.p,
                        "ranks": list(sc.rank_order),
                    }
                ]
            ),
            "nccl_version": sc.platform.comm_version,
        },
        "record_shapes": 1 if sc.record_shapes else 0,
        "traceEvents": events,
        "traceName": f"generated_{sc.name}/rank{host.world_rank}.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
    }


def _distributed_info(sc: Scenario, world_rank: int) -> dict:
    """A 3-D job's distributedInfo as torch's profiler writes it (torch/profiler/profiler.py
    ``_get_distributed_info``, torch 2.13.0 lines 554-572): pg_count is every group the job
    created (``get_pg_count``: _world.group_count, distributed_c10d.py 1555-1560), pg_config the
    ones this rank is in (``_get_all_pg_configs`` over _world.pg_map, 1546-1552). Without
    pg_metadata, neither: the layout must come from the traffic."""
    info: dict = {"backend": "nccl", "rank": world_rank, "world_size": sc.world_size}
    if sc.pg_metadata:
        groups = process_groups(sc)
        info["pg_count"] = len(groups)
        info["pg_config"] = [
            {key: g[key] for key in ("pg_name", "pg_desc", "backend_config", "pg_size", "ranks")}
            for g in groups
            if world_rank in g["ranks"]
        ]
    info["nccl_version"] = sc.platform.comm_version
    return info


def generate(sc: Scenario, out_dir: Path | str) -> tuple[Path, dict]:
    """Simulate ``sc`` and write ``generated_<name>/rank{R}.json.gz`` and, beside that folder,
    ``generated_<name>.truth.json`` (outside it, so tracekit does not see a stray file).

    Returns the run folder and the ground truth (the same dict as the truth file).
    """
    ranks, kernels = simulate(sc)
    truth = ground_truth(sc, ranks, kernels)
    folder = Path(out_dir) / f"generated_{sc.name}"
    folder.mkdir(parents=True, exist_ok=True)
    for host in ranks:
        doc = _rank_document(sc, host, [k for k in kernels if (k.pipe, k.rank) == (host.pipe, host.rank)])
        # mtime=0: the same scenario gives the same bytes
        name = f"rank{host.world_rank}.json.gz"
        (folder / name).write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    truth_path(folder).write_text(json.dumps(truth, indent=1))
    return folder, truth


def truth_path(folder: Path) -> Path:
    """Where :func:`generate` writes the ground truth of the run in ``folder``."""
    return folder.with_name(folder.name + ".truth.json")


# The scenarios of tracekit issue #12's acceptance tests (p=4, m=8, small and fast).
SCENARIOS: dict[str, Scenario] = {
    "host_ahead": Scenario("host_ahead", steps=3, host_sync=False),
    "slow_stage": Scenario("slow_stage", stage_factor={2: 2.0}),
    "slow_link": Scenario("slow_link", link_transfer_ns={(1, 2): 400_000}),
    "launch_bound": Scenario("launch_bound", rank_launch_ns={1: 80_000}),
    "interleaved": Scenario("interleaved", schedule="Interleaved1F1B", v=2, kernel_ns=25_000),
    "unlabelled_1f1b": Scenario("unlabelled_1f1b", labelled=False),
    # Megatron-core's interleaved schedule leaves no labels either: stages from the message chains.
    "unlabelled_interleaved": Scenario(
        "unlabelled_interleaved", schedule="Interleaved1F1B", v=2, kernel_ns=25_000, labelled=False
    ),
    "clock_offset": Scenario("clock_offset", clock_offset_ns={1: 3_000_000, 3: -2_000_000}),
    "gpipe": Scenario("gpipe", schedule="GPipe"),
    # torch's native Schedule1F1B (no labels) on NCCL: batch_isend_irecv, fused SendRecv kernels
    "fused_1f1b": Scenario("fused_1f1b", labelled=False, fused_p2p=True),
    "fused_slow_link": Scenario("fused_slow_link", labelled=False, fused_p2p=True, link_transfer_ns={(1, 2): 400_000}),
    # Megatron-core (no labels, its own P2P: see "Megatron-core" in the module doc)
    "megatron_interleaved": Scenario(
        "megatron_interleaved", schedule="Interleaved1F1B", v=2, kernel_ns=25_000, labelled=False, framework="megatron"
    ),
    "megatron_interleaved_nosync": Scenario(
        "megatron_interleaved_nosync",
        schedule="Interleaved1F1B",
        v=2,
        kernel_ns=25_000,
        labelled=False,
        framework="megatron",
        megatron_p2p="batch",
    ),
    "megatron_interleaved_overlap": Scenario(
        "megatron_interleaved_overlap",
        schedule="Interleaved1F1B",
        v=2,
        kernel_ns=25_000,
        labelled=False,
        framework="megatron",
        megatron_p2p="overlap",
    ),
    "megatron_1f1b": Scenario("megatron_1f1b", labelled=False, framework="megatron"),
    "megatron_slow_link": Scenario(
        "megatron_slow_link",
        schedule="Interleaved1F1B",
        v=2,
        kernel_ns=25_000,
        labelled=False,
        framework="megatron",
        link_transfer_ns={(1, 2): 400_000},
    ),
    # peers as group ranks: the pipeline runs on the job's ranks 2, 0, 3, 1 (its group ranks
    # 0-3), and every P2P field names group ranks (the megatron_interleaved run, renumbered)
    "megatron_group_ranks": Scenario(
        "megatron_group_ranks",
        schedule="Interleaved1F1B",
        v=2,
        kernel_ns=25_000,
        labelled=False,
        framework="megatron",
        rank_order=(2, 0, 3, 1),
    ),
    # ... and wrong (pytorch#153819: the two-rank communicator's ranks in titles and
    # record_param_comms, no Concrete Inputs): the unlabelled_1f1b run, renumbered
    "wrong_peer_metadata": Scenario(
        "wrong_peer_metadata",
        labelled=False,
        rank_order=(2, 0, 3, 1),
        record_shapes=False,
        p2p_comm_ranks=True,
    ),
    # the size issue #29 names: p=8, v=4, m=32 (1,024 actions a step; ~5 s to generate)
    "megatron_p8_v4_m32": Scenario(
        "megatron_p8_v4_m32",
        schedule="Interleaved1F1B",
        p=8,
        v=4,
        m=32,
        kernels_f=2,
        kernels_b=4,
        kernel_ns=20_000,
        labelled=False,
        framework="megatron",
    ),
    # tracekit issue #29: the same jobs on ROCm (HIP runtime calls, RCCL's one generic kernel)
    "rocm_1f1b": Scenario("rocm_1f1b", rocm=True),
    "rocm_unlabelled_1f1b": Scenario("rocm_unlabelled_1f1b", labelled=False, rocm=True),
    "rocm_slow_link": Scenario("rocm_slow_link", link_transfer_ns={(1, 2): 400_000}, rocm=True),
    "rocm_fused_1f1b": Scenario("rocm_fused_1f1b", labelled=False, fused_p2p=True, rocm=True),
}
# The acceptance scenarios the tests check: plain P2P kernels, and torch's fused batch_isend_irecv
# (one SendRecv kernel per group). gpipe is there for the what-if tests.
PLAIN_SCENARIOS = [
    "host_ahead",
    "slow_stage",
    "slow_link",
    "launch_bound",
    "interleaved",
    "unlabelled_1f1b",
    "unlabelled_interleaved",
    "clock_offset",
]
FUSED_SCENARIOS = ["fused_1f1b", "fused_slow_link"]
# Megatron-core's schedules and P2P (batch_isend_irecv groups with and without synchronize,
# overlapped isend/irecv), small; megatron_p8_v4_m32 is checked on its own (slower)
MEGATRON_SCENARIOS = [
    "megatron_interleaved",
    "megatron_interleaved_nosync",
    "megatron_interleaved_overlap",
    "megatron_1f1b",
    "megatron_slow_link",
]
# ROCm naming (issue #29): plain P2P kernels, and torch's fused batch_isend_irecv on RCCL
ROCM_PLAIN_SCENARIOS = ["rocm_1f1b", "rocm_unlabelled_1f1b", "rocm_slow_link"]
ROCM_FUSED_SCENARIOS = ["rocm_fused_1f1b"]


# tracekit issue #31: pipelines inside 3-D jobs, Megatron-core 1F1B without labels (module doc,
# "3-D parallel jobs"); replica 1's machine 10% slower where there are replicas
SCENARIOS_3D: dict[str, Scenario] = {
    "tp2_pp4": Scenario("tp2_pp4", labelled=False, framework="megatron", tp=2),
    "dp2_pp4": Scenario("dp2_pp4", labelled=False, framework="megatron", dp=2, replica_slowdown={1: 1.1}),
    "tp2_dp2_pp4": Scenario("tp2_dp2_pp4", labelled=False, framework="megatron", tp=2, dp=2, replica_slowdown={1: 1.1}),
    "recompute_pp4": Scenario("recompute_pp4", labelled=False, framework="megatron", recompute=True),
    # no pg_config and no Process Group fields: the layout from traffic alone
    "tp2_pp4_nometa": Scenario("tp2_pp4_nometa", labelled=False, framework="megatron", tp=2, pg_metadata=False),
    "dp2_pp4_nometa": Scenario(
        "dp2_pp4_nometa", labelled=False, framework="megatron", dp=2, replica_slowdown={1: 1.1}, pg_metadata=False
    ),
    "tp2_dp2_pp4_nometa": Scenario(
        "tp2_dp2_pp4_nometa",
        labelled=False,
        framework="megatron",
        tp=2,
        dp=2,
        replica_slowdown={1: 1.1},
        pg_metadata=False,
    ),
}


# TP all-reduces and pipeline transfers overlapping on a rank: with
# --overlap-p2p-communication (interleaved) a receive posted for a later action waits on its
# stream while the current action's TP all-reduce runs (not in SCENARIOS_3D: the layout tests
# over those hold them to the truth's figures, which this one is built for only in part)
TP_OVERLAP_SCENARIO = Scenario(
    "tp2_pp4_overlap",
    labelled=False,
    framework="megatron",
    tp=2,
    schedule="Interleaved1F1B",
    v=2,
    megatron_p2p="overlap",
)
# The same job with TP and PP sharing the links (module doc, "Contention"): activations that
# take 200 us on the wire (a pipeline across nodes) and transfers 1.6x as long while a TP
# all-reduce of either end runs; not in SCENARIOS_3D, for the same reason
CONTENDED_SCENARIO = replace(TP_OVERLAP_SCENARIO, name="tp2_pp4_contended", transfer_ns=200_000, tp_p2p_contention=1.6)


# by name for the command line (tp2_pp4_overlap, tp2_pp4_contended)
_SHARED_LINK_SCENARIOS = {sc.name: sc for sc in (TP_OVERLAP_SCENARIO, CONTENDED_SCENARIO)}


def _parse_slowdown(text: str) -> tuple[int, float]:
    replica, _, factor = text.partition(":")
    return int(replica), float(factor or 1.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Write a GENERATED GPU pipeline trace (not a real one): a named scenario, or a "
        "Megatron-core 3-D job built from --tp/--dp/--pp (e.g. --tp 2 --dp 2 --pp 4 out/)."
    )
    parser.add_argument("out_dir", nargs="?", type=Path, help="folder to write generated_<name>/ into")
    parser.add_argument("--scenario", choices=sorted({**SCENARIOS, **SCENARIOS_3D, **_SHARED_LINK_SCENARIOS}))
    parser.add_argument("--out", type=Path, help="the same as out_dir")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per stage")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline")
    parser.add_argument("--pp", type=int, default=4, help="pipeline stages")
    parser.add_argument("--m", type=int, default=8, help="microbatches per step")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--recompute", action="store_true", help="Megatron's activation recomputation")
    parser.add_argument(
        "--slow-replica", type=_parse_slowdown, metavar="R[:F]", help="replica R's machine F times slower (1.1)"
    )
    parser.add_argument("--no-pg-metadata", action="store_true", help="leave out pg_config and Process Group args")
    parser.add_argument("--name", help="the run's name (generated_<name>/); made from the dimensions if left out")
    args = parser.parse_args()
    out = args.out or args.out_dir
    if out is None:
        parser.error("give the output folder (out_dir or --out)")
    if args.scenario:
        sc = {**SCENARIOS, **SCENARIOS_3D, **_SHARED_LINK_SCENARIOS}[args.scenario]
    else:
        name = args.name or "_".join(
            [f"tp{args.tp}"] * (args.tp > 1)
            + [f"dp{args.dp}"] * (args.dp > 1)
            + [f"pp{args.pp}"]
            + ["recompute"] * args.recompute
            + ["nometa"] * args.no_pg_metadata
        )
        sc = Scenario(
            name,
            p=args.pp,
            m=args.m,
            steps=args.steps,
            labelled=False,
            framework="megatron",
            tp=args.tp,
            dp=args.dp,
            recompute=args.recompute,
            replica_slowdown=dict([args.slow_replica]) if args.slow_replica else {},
            pg_metadata=not args.no_pg_metadata,
        )
    folder, truth = generate(sc, out)
    print(folder)
    if "layout" in truth:
        print(truth["layout"]["line"], f"(slow replica: {truth['slow_replica']})")
    for row in truth["ranks"]:
        line = (
            f"rank {row['rank']}: bubble {row['bubble_ratio']:.3f} (host view {row['host_bubble_ratio']:.3f}), "
            f"host wait {row['host_wait_ns'] / 1e6:.2f} ms"
        )
        if "layout" in truth:
            n = len(truth["steps"])
            line += (
                f"; with TP busy {row['bubble_ratio_with_tp']:.3f}, TP {row['tp_allreduce_ns'] / n / 1e6:.2f} ms/step, "
                f"DP {row['dp_grad_ns'] / n / 1e6:.2f} ms/step ({row['dp_grad_exposed_ns'] / n / 1e6:.2f} exposed), "
                f"recompute {row['recompute_share']:.0%}"
            )
        print(line)


if __name__ == "__main__":
    main()
