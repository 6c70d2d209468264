"""An HF model folder's metadata: config.json, generation_config.json and the tokenizer
files, read without its weights and without torch (the API process reads them while
the engine process loads the weights; hf_loader.py reads the weights).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from llmservice.server.model.config import ModelConfig
from llmservice.server.model.loaded import TokenizerSource, UnsupportedModelError
from llmservice.server.model.sources import ARCHITECTURES, architecture_problem, dense_mlp_layers

log = logging.getLogger("llmservice.server.model.hf_loader")
_ARCHS = ARCHITECTURES
_SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int}


def _ids(value) -> list[int]:
    return [int(v) for v in (value if isinstance(value, list) else [value] if value is not None else [])]


def read_generation_config(path: Path) -> tuple[list[int], dict[str, float]]:
    """generation_config.json's EOS ids and sampling defaults (as vLLM: whatever
    temperature/top_p/top_k it names, do_sample aside)."""
    file = path / "generation_config.json"
    if not file.exists():
        return [], {}
    gen = json.loads(file.read_text())
    defaults = {k: cast(gen[k]) for k, cast in _SAMPLING_KEYS.items() if gen.get(k) is not None}
    return _ids(gen.get("eos_token_id")), defaults


def sampling_defaults(model: str) -> dict[str, float]:
    """The sampling defaults of a local HF model folder (empty for anything else)."""
    path = Path(model)
    return read_generation_config(path)[1] if path.is_dir() else {}


def attended_context(cfg: dict) -> int:
    """The longest context this engine computes exactly for a config. The engine attends
    to every earlier token; a model trained with a sliding window (Mistral v0.1:
    4096) attends only to the window, so past it our tokens would differ from the
    model's. As vLLM does without sliding-window support, the context is capped there."""
    context = int(cfg.get("max_position_embeddings", 2048))
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) and int(window) < context:
        log.warning("the model attends over a sliding window of %d tokens (this engine attends "
                    "to all of them): context length capped at %d", window, window)
        return int(window)
    return context


def moe_fields(arch: str, cfg: dict) -> dict:
    """The MoE part of a config.json as ModelConfig fields (empty for a dense family).

    Mixtral routes every layer over `num_local_experts` experts of `intermediate_size`
    and always renormalises the top k; Qwen2/3-MoE size experts by
    `moe_intermediate_size`, renormalise only with `norm_topk_prob`, and keep a dense MLP
    in `mlp_only_layers` and in layers off `decoder_sparse_step` (as transformers does)."""
    if arch == "mixtral":
        return dict(num_experts=int(cfg["num_local_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), norm_topk_prob=True)  # fmt: skip
    # Hub configs say num_experts; transformers >= 5 saves it as num_local_experts
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if arch not in ("qwen2_moe", "qwen3_moe") or not experts:
        return {}
    return dict(
        num_experts=int(experts),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
        if arch == "qwen2_moe" else 0,
        dense_mlp_layers=dense_mlp_layers(cfg, cfg["num_hidden_layers"]),
    )


def read_hf_config(path: Path) -> ModelConfig:
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise UnsupportedModelError(f"{path}: no config.json (expected an HF model directory or a .gguf file)")
    cfg = json.loads(cfg_file.read_text())
    archs = cfg.get("architectures") or []
    arch = next((_ARCHS[a] for a in archs if a in _ARCHS), None)
    if arch is None:
        raise UnsupportedModelError(f"{cfg_file}: {architecture_problem(archs)}")
    n_heads = cfg["num_attention_heads"]
    gen_eos, sampling = read_generation_config(path)
    eos_ids = list(dict.fromkeys(_ids(cfg.get("eos_token_id")) + gen_eos))
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
        # Hub configs say rope_scaling; transformers >= 5 saves the same as rope_parameters
        rope_scaling=cfg.get("rope_scaling") or cfg.get("rope_parameters"),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "qwen3_moe"),
        max_position_embeddings=attended_context(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        name=path.name,
        sampling_defaults=sampling,
        **moe_fields(arch, cfg),
    )


def post_processor_adds_bos(tokenizer_json: dict) -> bool:
    """Whether tokenizer.json's post-processor puts a special token first (Llama 3 adds
    <|begin_of_text|> that way; its tokenizer_config.json has no add_bos_token)."""
    post = tokenizer_json.get("post_processor") or {}
    steps = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing":
            first = (step.get("single") or [{}])[0]
            return "SpecialToken" in first
    return False


def read_hf_tokenizer(path: Path) -> TokenizerSource:
    source = TokenizerSource()
    tok_json = path / "tokenizer.json"
    if tok_json.exists():
        source.tokenizer_json = tok_json
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.exists():
        cfg = json.loads(tok_cfg.read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        source.chat_template = template if isinstance(template, str) else None
        source.add_bos_token = bool(cfg.get("add_bos_token", False))
        if "add_bos_token" not in cfg and tok_json.exists():
            source.add_bos_token = post_processor_adds_bos(json.loads(tok_json.read_text()))
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


def shard_files(path: Path) -> list[Path]:
    """The safetensors files, in model.safetensors.index.json's order when there is one."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = dict.fromkeys(json.loads(index.read_text())["weight_map"].values())
        missing = [n for n in names if not (path / n).exists()]
        if missing:
            raise UnsupportedModelError(f"{path}: shards named in {index.name} are missing: {missing[:3]}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{path}: no *.safetensors files")
    return files
