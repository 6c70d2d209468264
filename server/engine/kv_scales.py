"""The fp8 KV pools' scales (kernels/kv_quant.py), calibrated once per model.

One full-precision prefill of CALIBRATION_TOKENS fixed pseudo-random tokens on a scratch
pool; each layer's largest |K| and |V| give that layer's two scales. Fixed ids make the
scales (and so every fp8 run) reproducible; the result is kept per model object, since
tests and benchmarks build many engines on one model.
"""

from __future__ import annotations

import weakref

import torch
from llmservice.kernels import kv_quant
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.model.llama import LlamaModel

_CACHE: weakref.WeakKeyDictionary[LlamaModel, list[tuple[float, float]]] = weakref.WeakKeyDictionary()


def calibrated_scales(model: LlamaModel, block_size: int = 16) -> list[tuple[float, float]]:
    """[(k_scale, v_scale)] per layer of this rank."""
    if model not in _CACHE:
        _CACHE[model] = [
            (kv_quant.scale_for(k), kv_quant.scale_for(v)) for k, v in kv_amax(model, block_size)
        ]
    return _CACHE[model]


@torch.inference_mode()
def kv_amax(model: LlamaModel, block_size: int) -> list[tuple[float, float]]:
    """Largest |K| and |V| per layer over one calibration prefill."""
    n = min(kv_quant.CALIBRATION_TOKENS, model.cos_sin_cache.shape[0])  # within the rotary table
    vocab = model.config.vocab_size
    ids = [(i * 7919 + 17) % vocab for i in range(n)]
    nblocks = -(-n // block_size)
    dev = model.device
    shape = (nblocks, block_size, model.num_kv_heads, model.config.head_dim)
    caches = [
        (torch.zeros(shape, dtype=model.dtype, device=dev), torch.zeros(shape, dtype=model.dtype, device=dev))
        for _ in range(model.config.num_layers)
    ]
    meta = AttentionMetadata.one_sequence(n, block_size, dev)
    positions = torch.arange(n, device=dev)
    model.forward_hidden(torch.tensor(ids, device=dev), positions, meta, caches)
    return [(float(k.abs().max()), float(v.abs().max())) for k, v in caches]
