"""HF directory loader: config.json + *.safetensors (+ tokenizer.json, generation_config.json)
for Llama (2, 3.x with llama3 RoPE scaling), Mistral, Qwen2/2.5 and Qwen3.

That is what users mount into pods (pvc://claim/path) or download (hf://org/name, see
hub.py). The weights are read where the model keeps them (safetensors_weights.py): a
single tensor is a view of its shard's mapping, a fused one (Q/K/V, gate/up) is read
straight into its rows; on a GPU each tensor goes to the device in the serving dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.model.hf_info import (  # noqa: F401  (re-exported: the metadata half)
    _ids,
    attended_context,
    post_processor_adds_bos,
    read_generation_config,
    read_hf_config,
    read_hf_info,
    read_hf_tokenizer,
    sampling_defaults,
    shard_files,
)
from llmservice.server.model.loaded import LoadedModel
from llmservice.server.model.parallel_weights import Shard, WeightSource
from llmservice.server.model.safetensors_weights import (  # noqa: F401
    CorruptShardError,
    SafetensorsWeights,
    corrupt,
)
from safetensors import SafetensorError, safe_open

log = logging.getLogger(__name__)


def open_shard(file: Path):
    """`safe_open` of one shard, failing with the shard's path when it is truncated or corrupt."""
    try:
        return safe_open(str(file), framework="pt")
    except SafetensorError as exc:
        raise corrupt(file, str(exc).removeprefix("Error while deserializing header: ")) from None


def load_hf_dir(
    path: Path,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    device: torch.device | str = "cpu",
) -> LoadedModel:
    """The shards' headers now (a truncated shard fails here, with its path); the
    tensors are read when the model takes them, each once, into the memory it keeps."""
    config, tokenizer = read_hf_info(path)
    files = shard_files(path)
    weights = SafetensorsWeights(files, device, dtype)
    if progress:
        progress(len(files), len(files))
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
