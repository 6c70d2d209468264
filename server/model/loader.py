"""Load a model reference (builtin:NAME, a .gguf file, an HF directory, a Hub repo) into a LoadedModel."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from llmservice.server.config import LOAD_FORMATS
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.dummy import dummy_weights
from llmservice.server.model.gguf_loader import load_gguf
from llmservice.server.model.gguf_source import GGUFSource
from llmservice.server.model.hf_loader import SafetensorsSource, load_hf_dir
from llmservice.server.model.loaded import LoadedModel, TokenizerSource, UnsupportedModelError
from llmservice.server.model.model_info import model_path, read_model_info  # noqa: F401  (re-exported)
from llmservice.server.model.parallel_weights import TensorSource, WeightSource
from llmservice.server.model.quant_weights import packs_gguf, weights_nbytes

log = logging.getLogger("llmservice.loader")


def load_model(
    model: str | Path,
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
    cpu_weights: str = "quantized",
) -> LoadedModel:
    """`load_format="dummy"` reads only the architecture and tokenizer and makes random
    weights of that shape on `device` (an HF directory then needs no *.safetensors).
    `cpu_weights="quantized"`: a GGUF's Q4_0/Q4_1/Q8_0 matrices stay packed for the CPU
    kernels when the model runs on CPU in fp32 (docs/cpu.md); "fp32" dequantizes them."""
    if load_format not in LOAD_FORMATS:
        raise UnsupportedModelError(f"load format {load_format!r} is not one of {list(LOAD_FORMATS)}")
    if load_format == "dummy":
        path, config, tokenizer = read_model_info(model)
        return LoadedModel(config=config, weights=dummy_weights(config, dtype, device), tokenizer=tokenizer, path=path)
    path, kind = model_path(model)
    t0 = time.perf_counter()
    if kind == "hf":
        loaded = load_hf_dir(path, dtype, progress, device=device)
    else:
        loaded = load_gguf(path, dtype, progress, pack=packs_gguf(cpu_weights, device, dtype))
    dt = time.perf_counter() - t0
    size = weights_nbytes(loaded.weights)
    log.info("loaded %s: %.2f GB of %s weights in %.2f s (%.2f GB/s)", path, size / 1e9,
             str(dtype).removeprefix("torch."), dt, size / 1e9 / max(dt, 1e-9))
    return loaded


def weight_source(
    model: str | Path,
    dtype: torch.dtype,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
    cpu_weights: str = "quantized",
) -> tuple[Path, ModelConfig, TokenizerSource, WeightSource]:
    """The weights as a source a tensor-parallel rank reads its shard from, without
    loading the rest: safetensors slices, GGUF rows/blocks (kept packed on a CPU fp32
    rank unless `cpu_weights="fp32"`, as `load_model` does), or dummy weights."""
    path, config, tokenizer = read_model_info(model)
    if load_format == "dummy":
        return path, config, tokenizer, TensorSource(dummy_weights(config, dtype, device), device, dtype, True)
    _, kind = model_path(path)
    if kind == "hf":
        return path, config, tokenizer, SafetensorsSource(path, device, dtype)
    pack = packs_gguf(cpu_weights, device, dtype)
    return path, config, tokenizer, GGUFSource(path, config, device, dtype, pack=pack)
