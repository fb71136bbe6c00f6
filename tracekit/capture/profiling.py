"""How every capture's ranks profile themselves and write their trace (torch.profiler).

Shared by :mod:`tracekit.capture.worker` and the framework ranks, so every sample folder is
recorded alike: CPU activity, shapes (they carry P2P peers and sizes), all threads, and
``schedule(wait=1, warmup=1, active=steps)`` so the first two steps (shape inference,
warm-up) are not in the trace. :func:`tracekit.capture.runner.profiler_manifest` says the
same in capture.json. Imports torch: only the capture code path may import this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch._C._profiler import _ExperimentalConfig  # torch.profiler re-exports it without __all__

from tracekit.capture.files import gzip_file


def make_profiler(
    schedule: dict[str, int],
    trace_json: Path,
    profile_memory: bool = False,
    *,
    cuda: bool = False,
    with_stack: bool = False,
) -> torch.profiler.profile:
    """A profiler with ``schedule`` (``CaptureConfig.profiler_schedule()``: ``steps`` steps
    after unrecorded ones) writing into ``trace_json``; ``profile_memory``: with a ``[memory]``
    event on every allocation and free (what one microbatch's activations take); ``cuda``:
    the GPU's kernels and copies too (CUPTI); ``with_stack``: ``python_function`` frames."""

    def on_trace_ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_json))

    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else []),
        schedule=torch.profiler.schedule(**schedule, repeat=1),
        record_shapes=True,
        with_stack=with_stack,
        profile_memory=profile_memory,
        # torch 2.13 on CPU records no [memory] event while profile_all_threads is on (seen: 0
        # events with it, one per allocation without); the main thread has the compute
        experimental_config=_ExperimentalConfig(profile_all_threads=not profile_memory),
        on_trace_ready=on_trace_ready,
    )


def gzip_trace(trace_json: Path) -> Path:
    """Replace ``rank<R>.json`` by ``rank<R>.json.gz`` (level 9: sample folders are committed)."""
    gz = trace_json.with_name(trace_json.name + ".gz")
    gzip_file(trace_json, gz)
    os.remove(trace_json)
    return gz
