"""Vectorized torch dequantization of GGML block formats (Q4_0, Q4_1, Q8_0, F16, BF16, F32).

Several times faster than a numpy round trip on the model's 210 Q4_1 tensors; other
block formats fall back to the `gguf` package's reference dequantizer.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

QK = 32  # elements per block for the 4/8-bit formats here


def _blocks(raw: np.ndarray, block_bytes: int) -> torch.Tensor:
    data = torch.from_numpy(np.array(raw, copy=True).view(np.uint8).reshape(-1))  # mmap is read-only
    return data.view(-1, block_bytes)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # element j in 0..15 is the low nibble of byte j, element 16+j its high nibble
    return torch.cat([qs & 0x0F, qs >> 4], dim=1).float()


def dequantize_q4_0(raw: np.ndarray) -> torch.Tensor:
    b = _blocks(raw, 2 + QK // 2)
    return (_f16(b, 0) * (_nibbles(b[:, 2:]) - 8.0)).reshape(-1)


def dequantize_q4_1(raw: np.ndarray) -> torch.Tensor:
    b = _blocks(raw, 4 + QK // 2)
    return (_f16(b, 0) * _nibbles(b[:, 4:]) + _f16(b, 2)).reshape(-1)


def dequantize_q8_0(raw: np.ndarray) -> torch.Tensor:
    b = _blocks(raw, 2 + QK)
    return (_f16(b, 0) * b[:, 2:].contiguous().view(torch.int8).float()).reshape(-1)


_TORCH = {Q.Q4_0: dequantize_q4_0, Q.Q4_1: dequantize_q4_1, Q.Q8_0: dequantize_q8_0}


def dequantize(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """Dequantize one tensor's raw data to float32 with the given (numpy-order) shape."""
    if qtype == Q.F32:
        return torch.from_numpy(np.array(raw, dtype=np.float32).reshape(shape))
    if qtype == Q.F16:
        return torch.from_numpy(np.array(raw).view(np.float16).astype(np.float32).reshape(shape))
    if qtype in _TORCH:
        return _TORCH[qtype](raw).reshape(shape)
    return torch.from_numpy(np.array(gguf_dequantize(raw, qtype), dtype=np.float32).reshape(shape))
