"""The slot pool's CPU path: its group stacks as the C kernels read them
(kernels/cpu_lora.py), for the Python layer loop and the one-call C decoder.

Taken on CPU in fp32 when the C library builds; otherwise (CUDA, bf16, no compiler) the
pool keeps its torch or Triton path. The structs point into the pool's tensors, which
loading a slot fills in place, so they are built once per pool.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from llmservice.kernels import cpu_lora

if TYPE_CHECKING:
    from llmservice.server.lora.weights import LoRAWeights

log = logging.getLogger(__name__)


def cpu_stacks(weights: LoRAWeights) -> cpu_lora.LoRAStacks | None:
    """The C view of `weights`, or None where the C kernels do not apply."""
    from llmservice.server.lora.weights import GROUPS

    first = weights.group_a[0][GROUPS[0]] if weights.group_a else None
    if (
        first is None
        or first.device.type != "cpu"
        or first.dtype != torch.float32
        or not cpu_lora.available()
    ):
        return None
    layers = [
        [cpu_lora.GroupStacks(weights.group_a[i][g], weights.group_b[i][g].transpose(1, 2), weights.ranks[i][g],
                              tuple(weights.shapes[m][1] for m in g)) for g in GROUPS]
        for i in range(len(weights.group_a))
    ]  # fmt: skip
    try:
        return cpu_lora.LoRAStacks(layers, weights.scaling_tensor, weights.max_rank)
    except ValueError as e:  # a tensor the kernels cannot read: the torch loop runs
        log.info("LoRA C kernels not used: %s", e)
        return None
