"""The one place that chooses a kernel implementation for each hot-path op.

On CUDA tensors the Triton kernels run; on CPU the torch path (`torch_ops`: batched SDPA
over gathered KV, the fastest CPU option measured). The environment variable
LLMSERVICE_KERNELS=triton|torch forces one path, read at every call so tests can flip it.

Triton on CPU tensors works only through Triton's interpreter, and Triton decides
interpreter-or-compiler when a kernel is *decorated*, i.e. when our triton_* modules
are imported, by reading TRITON_INTERPRET then. So the Triton modules are imported
lazily, on the first Triton call, and on a machine without CUDA that first import sets
TRITON_INTERPRET=1 unless the user set it already. If they were already imported in
compiled mode (a CUDA machine) and are then handed CPU tensors, the call fails with a
message saying to start the process with TRITON_INTERPRET=1.

fp8 KV pools (`--kv-cache-dtype fp8`, kv_quant.py) take the same routes: the Triton
kernels write and read e4m3 bytes with each pool's own scale (its `kv_scale`, read by
the kernels' wrappers at each call and passed to the launch as a constant), the torch
path quantizes and dequantizes as it scatters and gathers.
"""

import os
from types import ModuleType, SimpleNamespace

import torch
from llmservice.kernels import torch_moe, torch_ops
from llmservice.kernels.metadata import AttentionMetadata

_triton: SimpleNamespace | None = None


def backend_for(t: torch.Tensor) -> str:
    forced = os.environ.get("LLMSERVICE_KERNELS", "").strip().lower()
    if forced in ("triton", "torch"):
        return forced
    return "triton" if t.is_cuda else "torch"


def _load_triton() -> SimpleNamespace:
    global _triton
    if _triton is None:
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from llmservice.kernels import (
            triton_cache,
            triton_common,
            triton_decode,
            triton_lora,
            triton_moe,
            triton_norm,
            triton_prefill,
            triton_rotary,
        )

        modules: dict[str, ModuleType] = {
            "cache": triton_cache,
            "decode": triton_decode,
            "lora": triton_lora,
            "moe": triton_moe,
            "norm": triton_norm,
            "prefill": triton_prefill,
            "rotary": triton_rotary,
        }
        _triton = SimpleNamespace(
            interpreted=triton_common.is_interpreted(triton_decode._decode_split_kernel), **modules
        )
    return _triton


def _triton_for(t: torch.Tensor) -> SimpleNamespace:
    kernels = _load_triton()
    if not t.is_cuda and not kernels.interpreted:
        raise RuntimeError(
            "Triton kernels were compiled for the GPU but got CPU tensors; run with "
            "TRITON_INTERPRET=1 set before the first kernel import, or LLMSERVICE_KERNELS=torch"
        )
    return kernels


def reshape_and_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    if backend_for(key) == "triton":
        _triton_for(key).cache.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
    else:
        torch_ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    if backend_for(q) != "triton":
        return torch_ops.paged_attention(q, k_cache, v_cache, meta, scale)
    kernels = _triton_for(q)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    nd = meta.num_decodes
    if nd:
        kernels.decode.paged_decode_attention(
            q[:nd],
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            scale,
            max_seq_len=max(meta.seq_lens_host[:nd]),
            out=out[:nd],
        )
    if nd < meta.num_seqs:
        kernels.prefill.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            max_query_len=max(meta.query_lens[nd:]),
            first_seq=nd,
            num_seqs=meta.num_seqs - nd,
            out=out,
        )
    return out


def rms_norm(x, weight, eps):
    if backend_for(x) == "triton":
        return _triton_for(x).norm.rms_norm(x, weight, eps)
    return torch_ops.rms_norm(x, weight, eps)


def fused_add_rms_norm(x, residual, weight, eps):
    if backend_for(x) == "triton":
        return _triton_for(x).norm.fused_add_rms_norm(x, residual, weight, eps)
    return torch_ops.fused_add_rms_norm(x, residual, weight, eps)


def rotary_embedding(positions, q, k, cos_sin_cache) -> None:
    if backend_for(q) == "triton":
        _triton_for(q).rotary.rotary_embedding(positions, q, k, cos_sin_cache)
    else:
        torch_ops.rotary_embedding(positions, q, k, cos_sin_cache)


def lora_add(x, a, b, scalings, tiles, widths, out) -> None:
    """The LoRA delta of a step's adapter rows added into `out` by the Triton kernels.
    Only the Triton path lives here: the CPU path is server/lora/weights.py's per-group
    torch loop, which skips the modules an adapter does not target."""
    _triton_for(x).lora.add_lora(x, a, b, scalings, tiles, widths, out)


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """A mixture-of-experts MLP over routed tokens: the Triton fused-MoE kernel on CUDA
    (triton_moe.py), one GEMM pair per expert group on CPU (torch_moe.py)."""
    if backend_for(x) == "triton":
        return _triton_for(x).moe.fused_moe(x, w13, w2, topk_weights, topk_ids)
    return torch_moe.grouped_moe(x, w13, w2, topk_weights, topk_ids)


def silu_and_mul(gate_up):
    """silu(gate) * up of the fused gate_up output (a C call on fp32 CPU, torch elsewhere)."""
    return torch_ops.silu_and_mul(gate_up)
