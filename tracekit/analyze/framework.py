"""Which training framework ran a pipeline: the one whose config lines advice is written in.

A what-if recommendation (a split, v, m, a schedule) is applied through the framework's own
flags (:mod:`tracekit.analyze.framework_config`), so tracekit needs to know which framework
ran. The evidence, strongest first:

- ``--framework`` given by the user;
- ``capture.json`` beside the traces (``tracekit capture`` writes the framework and the
  schedule class it ran);
- the label table the actions came from (:mod:`tracekit.reconstruct.labels`): Megatron's
  ``forward_step`` / ``backward_step`` frames or its NVTX ranges, DeepSpeed's engine ranges,
  torch.distributed.pipelining's ``PP:`` and GPipe ranges;
- the traces' process-group descriptions: Megatron-LM describes every group it creates
  (``PIPELINE_MODEL_PARALLEL_GROUP``, ...: megatron/core/parallel_state.py); a torch
  DeviceMesh with a ``pp`` dimension (``mesh_pp``) is how torchtitan builds its pipeline
  group (torchtitan/distributed/parallel_dims.py names the dimension ``pp``; read at
  torchtitan b5bcd76c);
- where the trace files sit: torchtitan writes ``profiling/traces/iteration_<N>/rank<R>_trace.json.gz``
  (torchtitan/tools/profiler.py, PROFILE_ITER_DIR / PROFILE_FILE), Megatron-LM ``torch_profile/rank-<R>.json.gz``.

torchtitan runs torch.distributed.pipelining's schedules, so torch's labels alone say
"torch"; with a torchtitan file layout or mesh they say torchtitan. A run with none of these
is not recognised, and the output says how to name the framework.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tracekit.model.frameworks import FRAMEWORKS
from tracekit.model.run import Run
from tracekit.reconstruct.layout import MEGATRON_DESCRIPTIONS

# The label tables each framework writes (tracekit.reconstruct.labels.BUILTIN).
_LABEL_TABLES = {
    "megatron-torch": "megatron",
    "megatron-nvtx": "megatron",
    "deepspeed-nvtx": "deepspeed",
    "torch-pp": "torch",
    "torch-gpipe": "torch",
}
# The module path of the schedule a capture ran (capture.json "schedule_class").
_SCHEDULE_MODULES = {
    "megatron.": "megatron",
    "deepspeed.": "deepspeed",
    "torchtitan.": "torchtitan",
    "torch.distributed.pipelining.": "torch",
}
_TORCHTITAN_FILES = re.compile(r"(?:^|/)iteration_\d+/rank\d+_trace\.json(?:\.gz)?$")
_MEGATRON_FILES = re.compile(r"(?:^|/)torch_profile/rank-\d+\.json(?:\.gz)?$")
# When the traces hold evidence of several, the more specific wins: torchtitan runs torch's
# schedules (its evidence is torch's and more).
_PRECEDENCE = ("torchtitan", "megatron", "deepspeed", "torch")


@dataclass(frozen=True)
class Framework:
    """The framework that ran (None: not recognised) and what says so."""

    name: str | None  # a key of FRAMEWORKS
    evidence: tuple[str, ...]

    @property
    def title(self) -> str:
        return FRAMEWORKS[self.name] if self.name else "not recognised"

    def line(self) -> str:
        """One line: "Megatron-LM (capture.json; Megatron's process groups)"."""
        if self.name is None:
            return (
                "not recognised from the traces; --framework "
                + "|".join(FRAMEWORKS)
                + " prints each recommendation as that framework's config lines"
            )
        return f"{self.title} ({'; '.join(self.evidence)})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "evidence": list(self.evidence)}


def detect_framework(run: Run, given: str | None = None) -> Framework:
    """The framework of ``run``: ``given`` (``--framework``) where set, else the manifest's,
    else the strongest evidence in the traces (see the module doc)."""
    if given is not None:
        return Framework(given, ("--framework",))
    evidence = _trace_evidence(run)
    manifest = _from_manifest(run.capture)
    if manifest is not None:
        return Framework(manifest, ("capture.json", *evidence.get(manifest, ())))
    if "torchtitan" in evidence and "torch" in evidence:
        evidence["torchtitan"] += evidence.pop("torch")
    for name in _PRECEDENCE:
        if name in evidence:
            return Framework(name, tuple(evidence[name]))
    return Framework(None, ())


def _from_manifest(capture: dict[str, Any] | None) -> str | None:
    if not capture:
        return None
    named = capture.get("framework")
    if isinstance(named, str) and named in FRAMEWORKS:
        return named
    schedule_class = capture.get("schedule_class")
    if isinstance(schedule_class, str):
        for prefix, name in _SCHEDULE_MODULES.items():
            if schedule_class.startswith(prefix):
                return name
    return None


def _trace_evidence(run: Run) -> dict[str, list[str]]:
    """framework -> what in the traces points at it."""
    out: dict[str, list[str]] = {}
    table = _LABEL_TABLES.get(run.labels)
    if table is not None:
        out.setdefault(table, []).append(f"label table {run.labels}")
    if run.layout is not None:
        descriptions = {g.description.strip() for g in run.layout.groups}
        if descriptions & MEGATRON_DESCRIPTIONS:
            out.setdefault("megatron", []).append("Megatron's process-group descriptions")
        if "mesh_pp" in descriptions:
            out.setdefault("torchtitan", []).append("a DeviceMesh 'pp' dimension")
    paths = [f.path.as_posix() for f in run.files]
    if any(_TORCHTITAN_FILES.search(p) for p in paths):
        out.setdefault("torchtitan", []).append("torchtitan's trace folders (iteration_N/rankR_trace.json)")
    if any(_MEGATRON_FILES.search(p) for p in paths):
        out.setdefault("megatron", []).append("Megatron-LM's trace folder (torch_profile/rank-R.json)")
    return out
