"""The training frameworks whose config lines what-if advice is written in.

The command line's ``--framework`` choices and the outputs' names read this table;
:mod:`tracekit.analyze.framework` finds which one ran, :mod:`tracekit.analyze.framework_config`
writes each one's lines.
"""

from __future__ import annotations

#: framework -> how the outputs name it (``--framework`` takes the keys)
FRAMEWORKS: dict[str, str] = {
    "megatron": "Megatron-LM",
    "torchtitan": "torchtitan",
    "deepspeed": "DeepSpeed",
    "torch": "torch.distributed.pipelining",
}
