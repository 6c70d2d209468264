"""8-bit KV cache (`--kv-cache-dtype fp8` / `fp8_e4m3`): K and V stored as float8_e4m3fn
with one scale per pool (per layer, K and V apart), dequantized where attention reads them.

A value x is stored as fp8(x / scale) and read back as fp8 * scale. The scale of each
pool is set once, at allocation, from a calibration prefill in full precision (the
largest |K| or |V| of that layer, times HEADROOM, maps to e4m3's largest finite value):
e4m3 keeps ~3 significant bits whatever the magnitude, so the headroom costs precision
only at the subnormal end, while a value past the calibrated range saturates instead of
overflowing. The scale lives on the pool tensor itself (`kv_scale`), so every path that
is handed a pool (the attention ops, the swap copies) finds it without another argument.

Torch has no CPU `index_copy_` for float8, so writes and block copies go through a
uint8 view of the same bytes (`as_bytes`).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
HEADROOM = 2.0
CALIBRATION_TOKENS = 256


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def element_bytes(kv_cache_dtype: str, model_dtype: torch.dtype) -> int:
    """Bytes of one stored K or V element: 1 for fp8, else the model's dtype."""
    return 1 if is_fp8(kv_cache_dtype) else torch.tensor([], dtype=model_dtype).element_size()


def is_quantized(pool: torch.Tensor) -> bool:
    return pool.dtype == FP8


def scale_of(pool: torch.Tensor) -> float:
    return float(getattr(pool, "kv_scale", 1.0))


def set_scale(pool: torch.Tensor, scale: float) -> None:
    pool.kv_scale = float(scale)


def scale_for(amax: float) -> float:
    """The pool scale that maps `amax` (the calibrated largest magnitude) to FP8_MAX / HEADROOM."""
    return max(float(amax), 1e-6) * HEADROOM / FP8_MAX


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The same memory as uint8 (fp8 tensors), for indexing ops torch lacks for float8."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp8 of x / scale, saturated to e4m3's finite range (a cast alone would give NaN)."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (q.to(torch.float32) * scale).to(dtype)


def write(pool: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter rows [T, Hkv, D] into the fp8 pool [N, bs, Hkv, D] at the flat slots."""
    num_blocks, block_size, hkv, d = pool.shape
    flat = as_bytes(pool).view(num_blocks * block_size, hkv, d)
    flat.index_copy_(0, slot_mapping, as_bytes(quantize(rows, scale_of(pool))))


def select_blocks(pool: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """pool.index_select(0, blocks) in `dtype`: dequantized when the pool is fp8."""
    picked = pool.index_select(0, blocks)
    return dequantize(picked, scale_of(pool), dtype) if is_quantized(picked) else picked
