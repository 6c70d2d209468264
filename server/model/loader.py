"""Load a model reference (builtin:NAME, a .gguf file, an HF directory) into a LoadedModel."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.config import LOAD_FORMATS
from llmservice.server.model.dummy import dummy_weights
from llmservice.server.model.gguf_loader import load_gguf, read_gguf_info
from llmservice.server.model.hf_loader import load_hf_dir, read_hf_info
from llmservice.server.model.loaded import LoadedModel, UnsupportedModelError
from llmservice.server.model.registry import resolve_model_path


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
    path = resolve_model_path(str(model))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists() or not ggufs:
            if load_format == "dummy":
                return _dummy(path, *read_hf_info(path), dtype, device)
            return load_hf_dir(path, dtype, progress)
        path = ggufs[0]
    if path.suffix == ".gguf":
        if load_format == "dummy":
            return _dummy(path, *read_gguf_info(path), dtype, device)
        return load_gguf(path, dtype, progress)
    raise UnsupportedModelError(f"{path}: not a .gguf file or an HF model directory")


def _dummy(path, config, tokenizer, dtype, device) -> LoadedModel:
    weights = dummy_weights(config, dtype, device)
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, path=path)
