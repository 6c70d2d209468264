"""What a loader returns: architecture, HF-named weights and tokenizer material."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmservice.server.model.config import ModelConfig

if TYPE_CHECKING:  # the API process reads tokenizer material from here and never needs torch
    import torch


class UnsupportedModelError(ValueError):
    """The file is readable but its architecture or tensor type is not supported."""


@dataclass
class TokenizerSource:
    """Either a tokenizer.json file or GGUF BPE material (tokens + merges)."""

    tokenizer_json: Path | None = None
    tokens: list[str] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)
    token_types: list[int] = field(default_factory=list)
    pre: str = ""
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    chat_template: str | None = None
    add_bos_token: bool = False


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF Llama names: model.layers.N.self_attn.q_proj.weight, ...
    tokenizer: TokenizerSource
    path: Path
