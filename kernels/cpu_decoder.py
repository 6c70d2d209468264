"""A decode-only CPU step's decoder layers as one C call (kernels/cpu_decoder.c).

The Python loop over layers costs ~10 calls per layer, each with its checks, views and
allocations: at batch 1 on the embedded model that was a quarter of a token's time. The
C loop calls the same kernels in the same order with the same thread count, so it gives
the Python loop's bits exactly (tests/unit/kernels/test_cpu_decoder.py); the model takes
it when every layer is packed (cpu_quant.Packed), fp32 and on one rank. A step with
adapter rows passes the LoRA slot pool's stacks and rows (kernels/cpu_lora.py): the C loop
adds each projection's delta with the function the Python loop calls, so it stays on the
one call.

`DecoderWeights` holds the per-layer pointers (built once per model); `decode_layers` runs
one step over them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from llmservice.kernels import cpu_attention, cpu_lora, cpu_native, cpu_quant
from llmservice.kernels.metadata import AttentionMetadata

_p, _f32, _i64, _i32 = ctypes.c_void_p, ctypes.c_float, ctypes.c_int64, ctypes.c_int32


class _Layer(ctypes.Structure):
    _fields_ = [(n, _p) for n in ("qkv", "o", "gate_up", "down", "qkv_bias", "input_norm", "post_norm",
                                  "q_norm", "k_norm")] + [
        (n, _i32) for n in ("qkv_kind", "o_kind", "gate_up_kind", "down_kind")
    ]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate")] + [
        ("eps", _f32), ("scale", _f32), ("cos_sin", _p), ("rotary_positions", _i64), ("final_norm", _p),
    ]  # fmt: skip


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the kernel reads it: packed matrices, fp32 vectors."""

    qkv: cpu_quant.Packed
    o: cpu_quant.Packed
    gate_up: cpu_quant.Packed
    down: cpu_quant.Packed
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


def _vector(t: torch.Tensor | None, n: int, what: str) -> int | None:
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous() or t.numel() != n:
        raise ValueError(
            f"{what}: expected {n} contiguous fp32 CPU values, got {tuple(t.shape)} {t.dtype}"
        )
    return t.data_ptr()


class DecoderWeights:
    """The C structs over a model's layers (they point into the tensors held here)."""

    def __init__(self, layers: Sequence[LayerWeights], final_norm: torch.Tensor, cos_sin: torch.Tensor,
                 heads: int, kv_heads: int, head_dim: int, eps: float, scale: float):  # fmt: skip
        first = layers[0]
        self.hidden, self.intermediate = first.qkv.cols, first.gate_up.rows // 2
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        h, nq, nkv = self.hidden, heads * head_dim, kv_heads * head_dim
        shapes = {"qkv": (nq + 2 * nkv, h), "o": (h, nq), "gate_up": (2 * self.intermediate, h),
                  "down": (h, self.intermediate)}  # fmt: skip
        self.layers, self._held = (
            tuple(layers),
            (final_norm, cos_sin),
        )  # the structs point into them
        self._structs = (_Layer * len(layers))()
        for i, lw in enumerate(layers):
            c = self._structs[i]
            for name, (rows, cols) in shapes.items():
                p: cpu_quant.Packed = getattr(lw, name)
                if (p.rows, p.cols) != (rows, cols):
                    raise ValueError(
                        f"layer {i} {name}: {p.rows}x{p.cols} blocks, expected {rows}x{cols}"
                    )
                setattr(c, name, p.data.data_ptr())
                setattr(c, f"{name}_kind", p.kind)
            c.qkv_bias = _vector(lw.qkv_bias, nq + 2 * nkv, f"layer {i} qkv bias")
            c.input_norm = _vector(lw.input_norm, h, f"layer {i} input norm")
            c.post_norm = _vector(lw.post_norm, h, f"layer {i} post-attention norm")
            if (lw.q_norm is None) != (lw.k_norm is None):
                raise ValueError(f"layer {i}: q and k head norms come together")
            c.q_norm = _vector(lw.q_norm, head_dim, f"layer {i} q norm")
            c.k_norm = _vector(lw.k_norm, head_dim, f"layer {i} k norm")
        if (
            cos_sin.dtype != torch.float32
            or not cos_sin.is_contiguous()
            or cos_sin.shape[1] != head_dim
        ):
            raise ValueError(
                f"rotary cache {tuple(cos_sin.shape)} {cos_sin.dtype}: expected fp32 [P, {head_dim}]"
            )
        self._model = _Model(len(layers), h, heads, kv_heads, head_dim, self.intermediate, eps, scale,
                             cos_sin.data_ptr(), cos_sin.shape[0], _vector(final_norm, h, "final norm"))  # fmt: skip
        self._pools: tuple | None = None
        # (in, widths) of each layer's qkv, o, gate_up, down: what a LoRA pool must match
        self.lora_shapes = ((h, (nq, nkv, nkv)), (nq, (h,)), (h, (self.intermediate,) * 2),
                            (self.intermediate, (h,))) * len(layers)  # fmt: skip

    def _pool_pointers(
        self, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple | None:
        """(k pointers, v pointers, slots, block size), or None for pools the kernel cannot
        read (not contiguous fp32 CPU tensors of the layers' shape); kept while the same."""
        key = (id(kv_caches), kv_caches[0][0].data_ptr(), kv_caches[-1][1].data_ptr())
        if self._pools is None or self._pools[0] != key:
            shape = kv_caches[0][0].shape
            fits = len(kv_caches) == len(self._structs) and shape[2:] == (
                self.kv_heads,
                self.head_dim,
            )
            fits = fits and all(
                t.shape == shape and t.is_contiguous() and t.dtype == torch.float32 and t.is_cpu
                for pair in kv_caches
                for t in pair
            )
            ks = (_p * len(kv_caches))(*[k.data_ptr() for k, _ in kv_caches])
            vs = (_p * len(kv_caches))(*[v.data_ptr() for _, v in kv_caches])
            pointers = (ks, vs, shape[0] * shape[1], shape[1]) if fits else None
            self._pools = (key, pointers, kv_caches)  # the list is held: its id stays its own
        return self._pools[1]

    def decode_layers(self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                      kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                      lora: cpu_lora.StepRows | None = None) -> torch.Tensor | None:  # fmt: skip
        """hidden [B, H] (the embeddings: becomes the residual stream) -> the final-normed
        hidden states [B, H], with the LoRA delta of `lora`'s rows; None (nothing done) for
        a step the kernel does not take: not decode-only, pools it cannot read, or a LoRA
        pool of other shapes."""
        b, h = hidden.shape
        if meta.num_decodes != b or meta.num_seqs != b or b == 0:
            return None
        if lora is not None and (lora.stacks.shapes != self.lora_shapes or lora.num_rows != b):
            return None
        if not hidden.is_contiguous() or hidden.dtype != torch.float32 or h != self.hidden:
            raise ValueError(
                f"hidden states {tuple(hidden.shape)} {hidden.dtype}: expected [B, {self.hidden}] fp32"
            )
        pools = self._pool_pointers(kv_caches)
        if pools is None:
            return None
        ks, vs, num_slots, block_size = pools
        rows = cpu_attention.DecodeRows.of_step(meta)
        pos = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        lib = cpu_native.library("cpu_decoder")
        work = torch.empty(lib.qd_work_floats(ctypes.byref(self._model), b), dtype=torch.float32)
        out = torch.empty_like(hidden)
        threads = torch.get_num_threads()
        tiled = cpu_quant.choose_path(b, threads) == "tiled"
        rc = lib.qd_decode(
            ctypes.byref(self._model), self._structs, ks, vs, num_slots, block_size, hidden.data_ptr(),
            out.data_ptr(), pos.data_ptr(), slots.data_ptr(), rows.tables.data_ptr(), rows.tables.stride(0),
            rows.lens.data_ptr(), b, int(tiled), work.data_ptr(),
            lora.stacks.group_pointer() if lora is not None else None,
            ctypes.byref(lora.struct) if lora is not None else None, threads,
        )  # fmt: skip
        if rc == -1:
            raise IndexError(
                f"a position of {pos.tolist()} is outside the rotary cache ({self._model.rotary_positions})"
            )
        if rc == -2:
            raise IndexError(
                f"a slot of {slots.tolist()} is outside the KV pools ({num_slots} slots)"
            )
        if rc == -4:
            raise IndexError(f"an adapter slot of {lora.slots.tolist()} is outside the LoRA pool")
        if rc != 0:
            raise MemoryError("decode attention: no memory for the scores buffer")
        return out


def available() -> bool:
    return cpu_native.available("cpu_decoder")
