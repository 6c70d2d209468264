"""Load a model reference (builtin:NAME, a .gguf file, an HF directory) into a LoadedModel."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.model.gguf_loader import load_gguf
from llmservice.server.model.hf_loader import load_hf_dir
from llmservice.server.model.loaded import LoadedModel, UnsupportedModelError
from llmservice.server.model.registry import resolve_model_path


def load_model(
    model: str | Path, dtype: torch.dtype = torch.float32, progress: Callable[[int, int], None] | None = None
) -> LoadedModel:
    path = resolve_model_path(str(model))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists() or not ggufs:
            return load_hf_dir(path, dtype, progress)
        path = ggufs[0]
    if path.suffix == ".gguf":
        return load_gguf(path, dtype, progress)
    raise UnsupportedModelError(f"{path}: not a .gguf file or an HF model directory")
