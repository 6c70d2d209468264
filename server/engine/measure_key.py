"""What a start-up measurement (the step profile, the preemption prices) depends on.

Both are timed once per process and reused by every engine built again in it (tests and
benchmarks build many), so their cache key must change whenever the timing would: the
model's shape, how its weights are held (GGUF blocks kept packed or dense fp32), the
tensor-parallel size, the device, the dtype and the thread count.
"""

from __future__ import annotations

from typing import Any

import torch


def measurement_key(model: Any, *extra: object) -> tuple:
    """`model`: a LlamaModel, or the tensor-parallel executor standing in for one."""
    layers = getattr(model, "layers", None)
    weight_kind = type(layers[0].qkv.weight).__name__ if layers else ""
    world = getattr(model, "world", None)
    tp_size = world.size if world is not None else getattr(model, "size", 1)
    return (
        repr(model.config),
        weight_kind,
        tp_size,
        str(model.device),
        str(model.dtype),
        torch.get_num_threads(),
        *extra,
    )
