"""A GGUF file's metadata: the architecture (ModelConfig) and the tokenizer material,
read without its weights and without torch (the API process reads them while the engine
process loads the weights; gguf_loader.py reads the weights)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmservice.server.model.config import ModelConfig
from llmservice.server.model.gguf_header import GGUFFile
from llmservice.server.model.loaded import TokenizerSource, UnsupportedModelError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")


def _field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def read_config(reader: GGUFFile, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    g: Callable = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    if int(g("expert_count", 0) or 0) > 0:  # Mixtral GGUFs say "llama" and carry *_exps tensors
        raise UnsupportedModelError(
            f"{path}: a mixture-of-experts GGUF ({g('expert_count')} experts) is not supported; "
            "serve the model's Hugging Face folder (safetensors) instead"
        )
    n_heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    names = {t.name for t in reader.tensors}
    scaling = None
    scaling_type = g("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        scaling = {"rope_type": scaling_type, "factor": float(g("rope.scaling.factor", 1.0))}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = [int(x) for x in (eos, eot) if x is not None]
    return ModelConfig(
        architecture=arch,
        num_layers=int(g("block_count")),
        hidden_size=hidden,
        num_heads=n_heads,
        num_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=int(g("attention.key_length", hidden // n_heads)),
        intermediate_size=int(g("feed_forward_length")),
        vocab_size=int(g("vocab_size", len(tokens))),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(g("context_length", 2048)),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=sorted(set(eos_ids)),
        name=str(_field(reader, "general.name", path.stem)),
    )


def read_tokenizer(reader: GGUFFile) -> TokenizerSource:
    return TokenizerSource(
        tokens=list(_field(reader, "tokenizer.ggml.tokens") or []),
        merges=list(_field(reader, "tokenizer.ggml.merges") or []),
        token_types=[int(t) for t in (_field(reader, "tokenizer.ggml.token_type") or [])],
        pre=str(_field(reader, "tokenizer.ggml.pre", "")),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        chat_template=_field(reader, "tokenizer.chat_template"),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def read_gguf_info(path: Path) -> tuple[ModelConfig, TokenizerSource]:
    """Architecture and tokenizer from the metadata; the tensors stay unread (mmap)."""
    reader = GGUFFile(path)
    return read_config(reader, path), read_tokenizer(reader)
