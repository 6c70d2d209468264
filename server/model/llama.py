"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, and their mixture-of-experts kin
Mixtral, Qwen2-MoE, Qwen3-MoE) whose attention reads/writes a paged KV cache.

A pure function of (tokens, positions, attention metadata, KV pools), no nn.Module. Its
matmuls are the tensor-parallel layers of `parallel.py` (one device: `World()`, each is
the F.linear it replaces), and every weight is a `LinearWeight` from a `WeightSource`
(parallel_weights.py), so sharding and weight encodings are decided outside the model.
Q/K/V and gate/up are fused into one GEMM each (per rank: its own slice of each), which
matters on CPU where the batch is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from llmservice.kernels import ops
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.lora.weights import LoRAWeights
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.fused_decoder import decoder_weights
from llmservice.server.model.moe import MoEBlock, moe_rank_weight_elements
from llmservice.server.model.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    World,
    even_shard,
    kv_head_shard,
    scaled,
    vocab_shard,
)
from llmservice.server.model.parallel_weights import Shard, WeightSource
from llmservice.server.model.quant_weights import source_for

# the LoRA target modules behind each of the layer's GEMMs, in their output column order
QKV, O_PROJ, GATE_UP, DOWN = ("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",)


@dataclass
class DecoderLayer:
    qkv: ColumnParallelLinear
    o_proj: RowParallelLinear
    gate_up: ColumnParallelLinear | None  # the dense MLP; None in a mixture-of-experts layer
    down: RowParallelLinear | None
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    q_norm: torch.Tensor | None = None  # Qwen3: RMSNorm over each head of q and k
    k_norm: torch.Tensor | None = None
    moe: MoEBlock | None = None  # router + experts in place of gate_up/down

    @property
    def nbytes(self) -> int:
        norms = [
            t
            for t in (self.input_norm, self.post_attn_norm, self.q_norm, self.k_norm)
            if t is not None
        ]
        linears = [x for x in (self.qkv, self.o_proj, self.gate_up, self.down) if x is not None]
        moe = self.moe.nbytes if self.moe is not None else 0
        return moe + sum(x.weight.nbytes for x in linears) + sum(
            t.numel() * t.element_size() for t in norms
        )


@dataclass(frozen=True)
class RankShape:
    """What one rank holds of a layer: its query heads, KV heads and MLP columns."""

    q_heads: Shard
    kv_heads: Shard
    intermediate: Shard

    @classmethod
    def of(cls, config: ModelConfig, world: World) -> RankShape:
        return cls(
            even_shard(config.num_heads, world, "num_attention_heads"),
            kv_head_shard(config.num_kv_heads, world),
            even_shard(config.intermediate_size, world, "intermediate_size"),
        )


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
        weights: dict[str, torch.Tensor] | WeightSource,
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
        consume: bool = False,
        world: World | None = None,
    ):
        """`weights`: HF-named tensors or a `WeightSource` (which reads each rank's shard
        only). `consume=True` empties a dict as the layers are built, so the unfused
        tensors are freed one layer at a time (peak memory ~ the weights, not twice)."""
        self.config = config
        self.device = device
        self.dtype = dtype
        self.world = world = world or World()
        src = (
            weights
            if isinstance(weights, WeightSource)
            else source_for(weights, device, dtype, consume)
        )
        shape = self.shape = RankShape.of(config, world)
        d = config.head_dim
        self.num_heads, self.num_kv_heads = shape.q_heads.length, shape.kv_heads.length
        self.embed = VocabParallelEmbedding(
            src, "model.embed_tokens.weight", config.vocab_size, world
        )
        self.final_norm = src.get("model.norm.weight")
        self.tied_head = config.tie_word_embeddings or not src.has("lm_head.weight")
        if self.tied_head:
            self.lm_head = ParallelLMHead.tied(self.embed)
        else:
            self.lm_head = ParallelLMHead.load(src, "lm_head.weight", config.vocab_size, world)
        q_rows, kv_rows = scaled(shape.q_heads, d), scaled(shape.kv_heads, d)
        self.layers: list[DecoderLayer] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            sparse = config.is_moe_layer(i)
            self.layers.append(
                DecoderLayer(
                    qkv=ColumnParallelLinear(src, [a + "q_proj", a + "k_proj", a + "v_proj"],
                                             [q_rows, kv_rows, kv_rows], bias=config.attention_bias),
                    o_proj=RowParallelLinear(src, a + "o_proj", q_rows, world),
                    gate_up=None if sparse else ColumnParallelLinear(src, [m + "gate_proj", m + "up_proj"], [shape.intermediate] * 2),
                    down=None if sparse else RowParallelLinear(src, m + "down_proj", shape.intermediate, world),
                    input_norm=src.get(p + "input_layernorm.weight"),
                    post_attn_norm=src.get(p + "post_attention_layernorm.weight"),
                    q_norm=src.get(a + "q_norm.weight") if config.qk_norm else None,
                    k_norm=src.get(a + "k_norm.weight") if config.qk_norm else None,
                    moe=MoEBlock(src, p, config, world) if sparse else None,
                )
            )  # fmt: skip
        src.release()
        self.cos_sin_cache = rope_cache(config, max_positions, device)
        self.scale = d**-0.5
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        # decode-only CPU steps on packed layers: all layers in one C call (same bits)
        self.fused_decoder = decoder_weights(self)
        # --enable-lora: the adapter slot pool (server/lora/weights.py); its per-step row
        # groups add each projection's LoRA delta for the rows that use an adapter
        self.lora: LoRAWeights | None = None

    def weight_bytes(self) -> int:
        """Bytes of the weights this rank holds."""
        total = self.embed.nbytes + self.final_norm.numel() * self.final_norm.element_size()
        if not self.tied_head:
            total += self.lm_head.weight.nbytes
        return total + sum(layer.nbytes for layer in self.layers)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV bytes per token on this rank (its KV heads only)."""
        return 2 * self.config.num_layers * self.num_kv_heads * self.config.head_dim * dtype_bytes

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor | None:
        """Run T new tokens through the model; return fp32 logits [S, vocab] at
        logits_indices (on rank 0; other ranks of a tensor-parallel group get None)."""
        hidden = self.forward_hidden(input_ids, positions, meta, kv_caches)
        return self.compute_logits(hidden, logits_indices)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor | None:
        """fp32 logits of the rows `logits_indices` of the final hidden states. Kept out
        of `forward_hidden` so a CUDA graph holds the layers only: the [batch, vocab]
        logits of every padded row would cost graph memory for rows nobody samples."""
        logits = self.lm_head(hidden.index_select(0, logits_indices))
        return logits.float() if logits is not None else None

    @torch.inference_mode()
    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The decoder layers and the final norm: hidden states [T, hidden]. No host
        synchronisation: on CUDA (Triton kernels) it reads only tensors and the host
        values of `meta` (num_decodes, query_lens, seq_lens_host as launch sizes), so a
        pure-decode step can be captured in a CUDA graph (cuda_graphs.py)."""
        cfg = self.config
        t = input_ids.shape[0]
        eps = cfg.rms_norm_eps
        d, nh, nkv = cfg.head_dim, self.num_heads, self.num_kv_heads
        hidden = self.embed(input_ids)
        lora = self.lora if self.lora is not None and self.lora.active else None
        # adapter rows stay on the one-call decoder where the C LoRA kernels take them
        lora_rows = lora.step_rows() if lora is not None else None
        if self.fused_decoder is not None and (lora is None or lora_rows is not None) \
                and ops.backend_for(hidden) == "torch":  # fmt: skip
            out = self.fused_decoder.decode_layers(hidden, positions, meta, kv_caches, lora_rows)
            if out is not None:
                return out
        residual = hidden
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(x)
            if lora is not None:
                lora.add(i, QKV, x, qkv)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(t, nh, d)
            k = k.view(t, nkv, d)
            v = v.view(t, nkv, d)
            if layer.q_norm is not None:
                q = ops.rms_norm(q.reshape(-1, d), layer.q_norm, eps).view(t, nh, d)
                k = ops.rms_norm(k.reshape(-1, d), layer.k_norm, eps).view(t, nkv, d)
            ops.rotary_embedding(positions, q, k, self.cos_sin_cache)
            k_cache, v_cache = kv_caches[i]
            ops.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = ops.paged_attention(q, k_cache, v_cache, meta, self.scale)
            attn = attn.reshape(t, self.q_size)
            o = layer.o_proj(attn)
            if lora is not None:
                lora.add(i, O_PROJ, attn, o)
            x, residual = ops.fused_add_rms_norm(o, residual, layer.post_attn_norm, eps)
            mlp = layer.moe(x) if layer.moe is not None else self._dense_mlp(i, layer, x, lora)
            next_norm = (
                self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
            )
            x, residual = ops.fused_add_rms_norm(mlp, residual, next_norm, eps)
        return x

    def _dense_mlp(self, i: int, layer: DecoderLayer, x: torch.Tensor, lora: LoRAWeights | None) -> torch.Tensor:
        """gate_up -> SiLU-and-mul -> down, each with its LoRA delta where adapters run."""
        assert layer.gate_up is not None and layer.down is not None
        gate_up = layer.gate_up(x)
        if lora is not None:
            lora.add(i, GATE_UP, x, gate_up)
        act = ops.silu_and_mul(gate_up)
        mlp = layer.down(act)
        if lora is not None:
            lora.add(i, DOWN, act, mlp)
        return mlp


def score_tokens(model: LlamaModel, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Logits [n, vocab] at every position of one sequence (parity checks, prompt scoring)."""
    n = len(token_ids)
    nblocks = -(-n // block_size)
    cfg = model.config
    shape = (nblocks, block_size, model.num_kv_heads, cfg.head_dim)
    caches = [
        (
            torch.zeros(shape, dtype=model.dtype, device=model.device),
            torch.zeros(shape, dtype=model.dtype, device=model.device),
        )
        for _ in range(cfg.num_layers)
    ]
    dev = model.device
    meta = AttentionMetadata.one_sequence(n, block_size, dev)
    positions = torch.arange(n, device=dev)
    return model.forward(torch.tensor(token_ids, device=dev), positions, meta, caches, positions)


def rank_weight_bytes(config: ModelConfig, world: World, dtype_bytes: int) -> int:
    """Bytes of the weights rank `world.rank` holds, from the shape alone (what
    `LlamaModel.weight_bytes()` reports once built): the operator's per-GPU plan is
    checked against it without loading a model."""
    shape = RankShape.of(config, world)
    h, d = config.hidden_size, config.head_dim
    qkv_rows = (shape.q_heads.length + 2 * shape.kv_heads.length) * d
    per_layer = qkv_rows * h + shape.q_heads.length * d * h
    per_layer += qkv_rows * config.attention_bias + 2 * h + 2 * d * config.qk_norm
    mlps = sum(
        moe_rank_weight_elements(config, world) if config.is_moe_layer(n) else 3 * shape.intermediate.length * h
        for n in range(config.num_layers)
    )
    vocab_rows = (
        vocab_shard(config.vocab_size, world).length if world.size > 1 else config.vocab_size
    )
    heads = 1 if config.tie_word_embeddings else 2
    return dtype_bytes * (config.num_layers * per_layer + mlps + heads * vocab_rows * h + h)
