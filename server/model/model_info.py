"""Which file or folder a model reference names, and its metadata (architecture and
tokenizer) without the weights: all the API process needs, so it never imports torch."""

from __future__ import annotations

from pathlib import Path

from llmservice.server.model.config import ModelConfig
from llmservice.server.model.gguf_info import read_gguf_info
from llmservice.server.model.hf_info import read_hf_info
from llmservice.server.model.loaded import TokenizerSource, UnsupportedModelError
from llmservice.server.model.registry import resolve_model_path
from llmservice.server.model.sources import parse_hub_ref


def model_path(model: str | Path) -> tuple[Path, str]:
    """The file or directory a reference names, and its kind: 'hf' or 'gguf'. A Hub
    reference is fetched into the default cache (`serve` fetches it earlier, with its
    --revision and --download-dir, and passes the local folder)."""
    ref = parse_hub_ref(str(model))
    if ref is not None:
        from llmservice.server.model.hub import fetch_model

        path = fetch_model(ref)
    else:
        path = resolve_model_path(str(model))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists() or not ggufs:
            return path, "hf"
        path = ggufs[0]
    if path.suffix == ".gguf":
        return path, "gguf"
    raise UnsupportedModelError(f"{path}: not a .gguf file or an HF model directory")


def read_model_info(model: str | Path) -> tuple[Path, ModelConfig, TokenizerSource]:
    """Architecture and tokenizer of a model reference, without reading its weights."""
    path, kind = model_path(model)
    return (path, *(read_hf_info(path) if kind == "hf" else read_gguf_info(path)))
