"""HF directory loader: config.json + *.safetensors (+ tokenizer.json, generation_config.json)
for Llama (2, 3.x with llama3 RoPE scaling), Mistral, Qwen2/2.5 and Qwen3.

That is what users mount into pods (pvc://claim/path) or download (hf://org/name, see
hub.py). Weights go shard by shard, tensor by tensor, to the device in the serving dtype,
so the host holds at most one shard beyond what the device keeps.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.loaded import LoadedModel, TokenizerSource, UnsupportedModelError
from llmservice.server.model.parallel_weights import Shard, WeightSource
from llmservice.server.model.sources import ARCHITECTURES, architecture_problem
from safetensors import SafetensorError, safe_open

log = logging.getLogger(__name__)
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
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        max_position_embeddings=attended_context(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        name=path.name,
        sampling_defaults=sampling,
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


class CorruptShardError(UnsupportedModelError):
    """A safetensors shard whose header or data does not match its size (a copy or
    download cut short). safetensors' own message names no file."""


def open_shard(file: Path):
    """`safe_open` of one shard, failing with the shard's path when it is truncated or corrupt."""
    try:
        return safe_open(str(file), framework="pt")
    except SafetensorError as exc:
        detail = str(exc).removeprefix("Error while deserializing header: ")
        raise CorruptShardError(f"{file}: truncated or corrupt safetensors file ({detail}); "
                                "copy or download it again") from None


def load_hf_dir(
    path: Path,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    device: torch.device | str = "cpu",
) -> LoadedModel:
    """Shard by shard: each tensor is read from the memory-mapped file and moved to
    `device` in `dtype` at once, so host memory never holds more than one shard's pages
    beyond the weights kept (on a GPU: nothing beyond one shard)."""
    config, tokenizer = read_hf_info(path)
    files = shard_files(path)
    weights: dict[str, torch.Tensor] = {}
    for i, file in enumerate(files):
        with open_shard(file) as f:
            for key in f.keys():
                weights[key] = f.get_tensor(key).to(device=device, dtype=dtype)
        if progress:
            progress(i + 1, len(files))
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, path=path)


class SafetensorsSource(WeightSource):
    """An HF directory's tensors by name, each read as the slice a rank asks for
    (safetensors `get_slice`: only those bytes of the memory-mapped file are touched)."""

    def __init__(self, path: Path, device: torch.device | str, dtype: torch.dtype):
        super().__init__(device, dtype)
        self.files = [open_shard(file) for file in shard_files(path)]
        self.where = {key: f for f in self.files for key in f.keys()}

    def has(self, name: str) -> bool:
        return name in self.where

    def _read(self, name: str, dim: int, shard: Shard | None) -> torch.Tensor:
        f = self.where[name]
        if shard is None:
            return f.get_tensor(name)
        view = f.get_slice(name)
        index = [slice(None)] * len(view.get_shape())
        index[dim] = slice(shard.start, shard.end)
        return view[tuple(index)]

    def release(self) -> None:
        self.where.clear()
        self.files.clear()
