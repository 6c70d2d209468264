"""HF directory loader: config.json + *.safetensors (+ tokenizer.json) for Llama, Mistral, Qwen2.

That is what users mount into pods (pvc://claim/path) or download (hf://org/name).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.loaded import LoadedModel, TokenizerSource, UnsupportedModelError
from safetensors import safe_open

_ARCHS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


def read_hf_config(path: Path) -> ModelConfig:
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise UnsupportedModelError(f"{path}: no config.json (expected an HF model directory or a .gguf file)")
    cfg = json.loads(cfg_file.read_text())
    archs = cfg.get("architectures") or []
    arch = next((_ARCHS[a] for a in archs if a in _ARCHS), None)
    if arch is None:
        raise UnsupportedModelError(
            f"{cfg_file}: architecture {archs} is not supported (supported: {', '.join(_ARCHS)})"
        )
    n_heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    return ModelConfig(
        architecture=arch,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_heads=n_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        rope_scaling=cfg.get("rope_scaling"),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=[int(e) for e in eos_ids],
        name=path.name,
    )


def read_hf_tokenizer(path: Path) -> TokenizerSource:
    source = TokenizerSource()
    tok_json = path / "tokenizer.json"
    if tok_json.exists():
        source.tokenizer_json = tok_json
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.exists():
        cfg = json.loads(tok_cfg.read_text())
        template = cfg.get("chat_template")
        source.chat_template = template if isinstance(template, str) else None
        source.add_bos_token = bool(cfg.get("add_bos_token", False))
    template_file = path / "chat_template.jinja"
    if source.chat_template is None and template_file.exists():
        source.chat_template = template_file.read_text()
    return source


def read_hf_info(path: Path) -> tuple[ModelConfig, TokenizerSource]:
    """Architecture and tokenizer of an HF directory, without touching its weights."""
    config = read_hf_config(path)
    tokenizer = read_hf_tokenizer(path)
    tokenizer.bos_token_id = config.bos_token_id
    tokenizer.eos_token_id = config.eos_token_ids[0] if config.eos_token_ids else None
    return config, tokenizer


def load_hf_dir(path: Path, dtype: torch.dtype, progress: Callable[[int, int], None] | None = None) -> LoadedModel:
    config, tokenizer = read_hf_info(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{path}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for i, file in enumerate(files):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                weights[key] = f.get_tensor(key).to(dtype)
        if progress:
            progress(i + 1, len(files))
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, path=path)
