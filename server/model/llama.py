"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) whose attention reads/writes a paged KV cache.

Plain tensors and F.linear rather than nn.Modules: the model is a pure function of
(tokens, positions, attention metadata, KV pools). Q/K/V and gate/up projections are
fused into one GEMM each, which matters on CPU where the batch is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from llmservice.kernels import ops
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.model.config import ModelConfig


@dataclass
class LayerWeights:
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    q_norm: torch.Tensor | None = None  # Qwen3: RMSNorm over each head of q and k
    k_norm: torch.Tensor | None = None


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind not in (None, "default"):
        raise ValueError(f"rope scaling type {kind!r} is not supported")
    return inv_freq


def rope_cache(config: ModelConfig, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] = cat(cos, sin), computed in fp64 then stored fp32."""
    inv_freq = rope_inv_freq(config)
    t = torch.arange(max_positions, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=torch.float32)


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
        consume: bool = False,
    ):
        """`consume=True` empties `weights` as the layers are built, so the unfused
        tensors are freed one layer at a time (peak memory ~ the weights, not twice)."""
        self.config = config
        self.device = device
        self.dtype = dtype
        w = weights if consume else dict(weights)

        def take(name: str) -> torch.Tensor:
            return w.pop(name).to(device=device, dtype=dtype)

        self.embed = take("model.embed_tokens.weight")
        self.final_norm = take("model.norm.weight")
        lm_head = take("lm_head.weight") if "lm_head.weight" in w else None
        self.lm_head = self.embed if (lm_head is None or config.tie_word_embeddings) else lm_head
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            bias = None
            if config.attention_bias:
                bias = torch.cat([take(a + f"{n}_proj.bias") for n in "qkv"])
            self.layers.append(
                LayerWeights(
                    qkv=torch.cat([take(a + f"{n}_proj.weight") for n in "qkv"]).contiguous(),
                    qkv_bias=bias,
                    o_proj=take(a + "o_proj.weight"),
                    gate_up=torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")]).contiguous(),
                    down=take(m + "down_proj.weight"),
                    input_norm=take(p + "input_layernorm.weight"),
                    post_attn_norm=take(p + "post_attention_layernorm.weight"),
                    q_norm=take(a + "q_norm.weight") if config.qk_norm else None,
                    k_norm=take(a + "k_norm.weight") if config.qk_norm else None,
                )
            )
        self.cos_sin_cache = rope_cache(config, max_positions, device)
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run T new tokens through the model; return fp32 logits [S, vocab] at logits_indices."""
        cfg = self.config
        t = input_ids.shape[0]
        eps = cfg.rms_norm_eps
        hidden = F.embedding(input_ids, self.embed)
        residual = hidden
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(t, cfg.num_heads, cfg.head_dim)
            k = k.view(t, cfg.num_kv_heads, cfg.head_dim)
            v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
            if layer.q_norm is not None:
                q = ops.rms_norm(q.reshape(-1, cfg.head_dim), layer.q_norm, eps).view(t, cfg.num_heads, cfg.head_dim)
                k = ops.rms_norm(k.reshape(-1, cfg.head_dim), layer.k_norm, eps).view(t, cfg.num_kv_heads, cfg.head_dim)
            ops.rotary_embedding(positions, q, k, self.cos_sin_cache)
            k_cache, v_cache = kv_caches[i]
            ops.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = ops.paged_attention(q, k_cache, v_cache, meta, self.scale)
            o = F.linear(attn.reshape(t, self.q_size), layer.o_proj)
            x, residual = ops.fused_add_rms_norm(o, residual, layer.post_attn_norm, eps)
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
            mlp = F.linear(F.silu(gate) * up, layer.down)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
            x, residual = ops.fused_add_rms_norm(mlp, residual, next_norm, eps)
        return F.linear(x.index_select(0, logits_indices), self.lm_head).float()


def score_tokens(model: LlamaModel, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Logits [n, vocab] at every position of one sequence (parity checks, prompt scoring)."""
    n = len(token_ids)
    nblocks = -(-n // block_size)
    cfg = model.config
    shape = (nblocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [
        (torch.zeros(shape, dtype=model.dtype, device=model.device), torch.zeros(shape, dtype=model.dtype, device=model.device))
        for _ in range(cfg.num_layers)
    ]
    dev = model.device
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=dev),
        block_tables=torch.arange(nblocks, dtype=torch.int32, device=dev)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
        query_lens=[n],
        seq_lens_host=[n],
        num_decodes=1 if n == 1 else 0,
        block_size=block_size,
    )
    positions = torch.arange(n, device=dev)
    return model.forward(torch.tensor(token_ids, device=dev), positions, meta, caches, positions)
