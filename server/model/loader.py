"""Load a model reference (builtin:NAME, a .gguf file, an HF directory) into a LoadedModel."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.config import LOAD_FORMATS
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.dummy import dummy_weights
from llmservice.server.model.gguf_loader import load_gguf, read_gguf_info
from llmservice.server.model.hf_loader import load_hf_dir, read_hf_info
from llmservice.server.model.loaded import LoadedModel, TokenizerSource, UnsupportedModelError
from llmservice.server.model.registry import resolve_model_path


def model_path(model: str | Path) -> tuple[Path, str]:
    """The file or directory a reference names, and its kind: 'hf' or 'gguf'."""
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


def load_model(
    model: str | Path,
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
) -> LoadedModel:
    """`load_format="dummy"` reads only the architecture and tokenizer and makes random
    weights of that shape on `device` (an HF directory then needs no *.safetensors)."""
    if load_format not in LOAD_FORMATS:
        raise UnsupportedModelError(f"load format {load_format!r} is not one of {list(LOAD_FORMATS)}")
    if load_format == "dummy":
        path, config, tokenizer = read_model_info(model)
        return LoadedModel(config=config, weights=dummy_weights(config, dtype, device), tokenizer=tokenizer, path=path)
    path, kind = model_path(model)
    return load_hf_dir(path, dtype, progress) if kind == "hf" else load_gguf(path, dtype, progress)
