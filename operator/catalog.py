"""Architecture numbers of the models the operator can size without being told.

The VRAM check needs a model's shape (layers, KV heads, head size, parameter count), but
the operator never downloads weights. So it keeps this small table, keyed by catalog name
and by the Hugging Face ids people put in `spec.model.source`. Anything else must carry
`spec.model.architecture` (or `spec.model.catalogName`) for the check to run.

Numbers are from each model's published `config.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only transformer, as far as memory sizing cares.

    Mixture-of-experts: every expert of every MoE layer stays resident in GPU memory (only
    `num_experts_per_token` of them compute per token), so the weights count all
    `num_experts`; `intermediate_size` is then one expert's width (Mixtral's
    `intermediate_size`, Qwen-MoE's `moe_intermediate_size`). The router is E x hidden per
    MoE layer. `num_dense_layers` of the layers keep a dense MLP of
    `dense_intermediate_size` instead (Qwen-MoE's `mlp_only_layers` / `decoder_sparse_step`).
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # the MLP's width; with num_experts > 1 one routed expert's
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 1  # MoE: routed experts per MoE layer (all resident in memory)
    num_experts_per_token: int = 1
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    parameter_count: int | None = None  # overrides the count derived from the shape
    num_dense_layers: int = 0  # MoE: layers with a dense MLP instead of experts
    dense_intermediate_size: int | None = None  # those layers' MLP width (None: intermediate_size)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an always-on expert, 1-wide sigmoid gate
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and on k in every layer

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return max(0, self.num_layers - self.num_dense_layers) if self.num_experts > 1 else 0

    @property
    def dense_mlp_size(self) -> int:
        """The MLP width of the layers without experts."""
        return self.dense_intermediate_size or self.intermediate_size

    def moe_mlp_parameters(self) -> int:
        """One MoE layer: all experts (gate, up, down), the router, the shared expert."""
        h = self.hidden_size
        experts = 3 * h * self.intermediate_size * self.num_experts + h * self.num_experts
        if self.shared_expert_intermediate_size:
            experts += 3 * h * self.shared_expert_intermediate_size + h  # + its 1-wide gate
        return experts

    def derived_parameter_count(self) -> int:
        """Parameters implied by the shape (embeddings, attention, MLP/experts, norms)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        if self.attention_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        moe_layers = self.num_moe_layers
        dense_layers = self.num_layers - moe_layers
        mlp = moe_layers * self.moe_mlp_parameters()
        mlp += dense_layers * 3 * self.hidden_size * self.dense_mlp_size
        per_layer = attention + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + mlp + embeddings + lm_head + self.hidden_size

    @property
    def parameters(self) -> int:
        return self.parameter_count or self.derived_parameter_count()


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    architecture: Architecture
    hf_ids: tuple[str, ...] = field(default_factory=tuple)
    builtin: str | None = None  # `builtin:<name>` served by the bundled server
    # The builtin GGUF's weights as the bundled server holds them on CPU: its Q4_1/Q8_0
    # blocks stay packed (docs/cpu.md) and the norms are fp32, so the CPU plan is this
    # file's tensor bytes, not parameters x 4.
    builtin_cpu_weight_bytes: int | None = None


_LLAMA3_8B = Architecture(32, 4096, 32, 8, 128, 14336, 128256)
# Qwen3-MoE: 128 routed experts of moe_intermediate_size, 8 per token, in every layer
# (decoder_sparse_step 1, no mlp_only_layers); intermediate_size is only a dense layer's.
_QWEN3_30B_A3B = Architecture(
    48, 2048, 32, 4, 128, 768, 151936, num_experts=128, num_experts_per_token=8,
    dense_intermediate_size=6144, qk_norm=True,
)  # fmt: skip
_QWEN3_235B_A22B = Architecture(
    94, 4096, 64, 4, 128, 1536, 151936, num_experts=128, num_experts_per_token=8,
    dense_intermediate_size=12288, qk_norm=True,
)  # fmt: skip
_LLAMA3_70B = Architecture(80, 8192, 64, 8, 128, 28672, 128256)

CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            "smollm2-135m",
            Architecture(30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True),
            hf_ids=("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct"),
            builtin="smollm2-135m",
            builtin_cpu_weight_bytes=96_576_768,  # SmolLM2-135M-Instruct.Q4_1.gguf's tensors
        ),
        CatalogEntry(
            "llama-3-8b",
            _LLAMA3_8B,
            hf_ids=(
                "meta-llama/Meta-Llama-3-8B",
                "meta-llama/Meta-Llama-3-8B-Instruct",
                "meta-llama/Llama-3.1-8B",
                "meta-llama/Llama-3.1-8B-Instruct",
            ),
        ),
        CatalogEntry(
            "llama-3-70b",
            _LLAMA3_70B,
            hf_ids=(
                "meta-llama/Meta-Llama-3-70B",
                "meta-llama/Meta-Llama-3-70B-Instruct",
                "meta-llama/Llama-3.1-70B",
                "meta-llama/Llama-3.1-70B-Instruct",
                "meta-llama/Llama-3.3-70B-Instruct",
            ),
        ),
        CatalogEntry(
            "mistral-7b",
            Architecture(32, 4096, 32, 8, 128, 14336, 32768),
            hf_ids=("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
        ),
        CatalogEntry(
            "mixtral-8x7b",
            Architecture(
                32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, num_experts_per_token=2
            ),
            hf_ids=("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
        ),
        CatalogEntry(
            "qwen2.5-7b",
            Architecture(28, 3584, 28, 4, 128, 18944, 152064, attention_bias=True),
            hf_ids=("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
        ),
        CatalogEntry(
            "qwen2.5-72b",
            Architecture(80, 8192, 64, 8, 128, 29568, 152064, attention_bias=True),
            hf_ids=("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
        ),
        CatalogEntry(
            "qwen3-30b-a3b",
            _QWEN3_30B_A3B,
            hf_ids=("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
        ),
        CatalogEntry(
            "qwen3-235b-a22b",
            _QWEN3_235B_A22B,
            hf_ids=("Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-Instruct-2507"),
        ),
    )
}

_BY_HF_ID = {hf_id.lower(): entry for entry in CATALOG.values() for hf_id in entry.hf_ids}
_BY_BUILTIN = {entry.builtin: entry for entry in CATALOG.values() if entry.builtin}


def lookup(source: str) -> CatalogEntry | None:
    """The catalog entry for a model source (`builtin:x`, `hf://org/name`), if known."""
    if source.startswith("builtin:"):
        return _BY_BUILTIN.get(source.removeprefix("builtin:"))
    if source.startswith("hf://"):
        return _BY_HF_ID.get(source.removeprefix("hf://").strip("/").lower())
    return None
