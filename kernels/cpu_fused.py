"""The decoder's small per-layer ops as single C calls on fp32 CPU tensors (cpu_ops.c).

At batch 1 the layer's norms, rotary and SiLU gate are ~35 torch ops whose dispatch
costs more than their arithmetic (a few microseconds each, x 30 layers, every token).
`supports` says when a tensor qualifies (CPU, fp32, rows contiguous, the library built);
callers (torch_ops, ops) fall back to the torch formulas otherwise.
"""

from __future__ import annotations

import torch
from llmservice.kernels import cpu_native


def supports(*tensors: torch.Tensor) -> bool:
    return all(
        t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors
    ) and cpu_native.available("cpu_ops")


def _lib():
    return cpu_native.library("cpu_ops")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    n = x.shape[-1]
    out = torch.empty_like(x)
    _lib().qo_rms_norm(x.data_ptr(), weight.contiguous().data_ptr(), x.numel() // n, n, eps, out.data_ptr(),
                       torch.get_num_threads())  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place); return (rms_norm(residual) * weight, residual)."""
    if not residual.is_contiguous():
        raise ValueError("the residual stream must be contiguous (it is updated in place)")
    x = x.contiguous()
    n = x.shape[-1]
    out = torch.empty_like(residual)
    _lib().qo_add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.contiguous().data_ptr(), residual.numel() // n,
                           n, eps, out.data_ptr(), torch.get_num_threads())  # fmt: skip
    return out, residual


def rotary_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """q [T, Hq, D] and k [T, Hk, D] with heads D apart and elements adjacent (views of QKV)."""
    d = q.shape[-1]
    return (
        all(t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == d for t in (q, k))
        and k.shape[-1] == d
    )


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """In place, rotate-half (HF Llama); cos_sin_cache [P, D] = cat(cos, sin)."""
    t, hq, d = q.shape
    pos = positions.to(torch.int64).contiguous()
    cs = cos_sin_cache.contiguous()
    if pos.numel() and int(pos.max()) >= cs.shape[0]:
        raise IndexError(f"position {int(pos.max())} past the rotary cache ({cs.shape[0]})")
    _lib().qo_rotary(pos.data_ptr(), q.data_ptr(), q.stride(0), hq, k.data_ptr(), k.stride(0), k.shape[1], t, d,
                     cs.data_ptr(), torch.get_num_threads())  # fmt: skip


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[..., :n]) * gate_up[..., n:] (the fused gate/up projection's output)."""
    gu = gate_up.contiguous()
    n = gu.shape[-1] // 2
    out = torch.empty((*gu.shape[:-1], n), dtype=gu.dtype)
    _lib().qo_silu_mul(
        gu.data_ptr(), gu.numel() // (2 * n), n, out.data_ptr(), torch.get_num_threads()
    )
    return out
