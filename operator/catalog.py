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
    """The shape of a decoder-only transformer, as far as memory sizing cares."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 1  # MoE: experts per layer (all resident in memory)
    num_experts_per_token: int = 1
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    parameter_count: int | None = None  # overrides the count derived from the shape

    def derived_parameter_count(self) -> int:
        """Parameters implied by the shape (embeddings, attention, MLP/experts, norms)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        if self.attention_bias:
            attention += q + 2 * kv
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts
        if self.num_experts > 1:
            mlp += self.hidden_size * self.num_experts  # router
        per_layer = attention + mlp + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + lm_head + self.hidden_size

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
