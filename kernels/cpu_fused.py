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
    for t in tensors:  # a loop, not all(genexpr): ~10 calls per layer per token
        if not t.is_cpu or t.dtype != torch.float32:
            return False
    return cpu_native.available("cpu_ops")


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
    rc = _lib().qo_rotary(pos.data_ptr(), q.data_ptr(), q.stride(0), hq, k.data_ptr(), k.stride(0), k.shape[1], t,
                          d, cs.data_ptr(), cs.shape[0], torch.get_num_threads())  # fmt: skip
    if rc < 0:  # checked in C before writing: no per-layer max() and sync here
        raise IndexError(f"position {int(pos[-1 - rc])} outside the rotary cache ({cs.shape[0]} positions)")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate_up[..., :n]) * gate_up[..., n:] (the fused gate/up projection's output)."""
    gu = gate_up.contiguous()
    n = gu.shape[-1] // 2
    out = torch.empty((*gu.shape[:-1], n), dtype=gu.dtype)
    _lib().qo_silu_mul(
        gu.data_ptr(), gu.numel() // (2 * n), n, out.data_ptr(), torch.get_num_threads()
    )
    return out


def cache_fits(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """key/value [T, Hkv, D] with each token's row contiguous (views of QKV), both pools
    fp32 and contiguous (the C call copies raw floats into either)."""
    return (
        supports(key, value, k_cache, v_cache)
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and all(t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (key, value))
    )


def cache_write(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """k_cache/v_cache [N, bs, Hkv, D] rows at `slots` = key/value [T, Hkv, D]: one C call
    instead of two index_copy_ per layer."""
    n, bs, hkv, d = k_cache.shape
    if v_cache.shape != k_cache.shape or not v_cache.is_contiguous() or key.shape[1:] != (hkv, d):
        raise ValueError(f"K/V rows {tuple(key.shape)} do not fit pools {tuple(k_cache.shape)}")
    s = slots.to(torch.int64).contiguous()
    rc = _lib().qo_cache_write(key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0),
                               k_cache.data_ptr(), v_cache.data_ptr(), s.data_ptr(), key.shape[0], hkv * d,
                               n * bs)  # fmt: skip
    if rc < 0:
        raise IndexError(f"slot {int(s[-1 - rc])} outside the KV pools ({n * bs} slots)")
