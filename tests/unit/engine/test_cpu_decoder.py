"""The one-call C decoder (kernels/cpu_decoder.c) against the model's Python layer loop.

Both run the same kernels in the same order, so a decode-only step must give the same
bits: the hidden states and every K/V row written to the pools. Checked on the embedded
model's packed weights at batch sizes on both matmul paths (direct below 17 rows at two
threads, tiled from there), at two block sizes, and with the Qwen-style extras the
embedded Llama lacks (a QKV bias, per-head q/k norms) grafted onto its layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from llmservice.kernels import cpu_decoder
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loader import load_model

pytestmark = pytest.mark.skipif(
    not cpu_decoder.available(), reason="the C kernels cannot be built here"
)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model(smollm) -> LlamaModel:
    return LlamaModel(smollm.config, smollm.weights, CPU, torch.float32, 512)


def pools(
    model: LlamaModel, blocks: int, block_size: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape = (blocks, block_size, model.num_kv_heads, model.config.head_dim)
    return [
        (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in model.layers
    ]


def decode_meta(lens: list[int], block_size: int) -> AttentionMetadata:
    """Sequence b holds blocks [b * per, (b + 1) * per) and writes its token at lens[b] - 1."""
    per = -(-max(lens) // block_size)
    b = len(lens)
    return AttentionMetadata(
        slot_mapping=torch.tensor([i * per * block_size + n - 1 for i, n in enumerate(lens)]),
        block_tables=torch.arange(b * per, dtype=torch.int32).view(b, per),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.arange(b + 1, dtype=torch.int32),
        query_lens=[1] * b,
        seq_lens_host=list(lens),
        num_decodes=b,
        block_size=block_size,
    )


def both_paths(model: LlamaModel, lens: list[int], block_size: int, threads: int = 2):
    """(hidden, pools) from the C decoder, then from the Python loop, on equal inputs."""
    fused = model.fused_decoder
    assert fused is not None
    ids = torch.tensor([(7919 * i) % 40000 + 17 for i in range(len(lens))])
    positions = torch.tensor([n - 1 for n in lens])
    blocks = len(lens) * -(-max(lens) // block_size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for decoder in (fused, None):
            model.fused_decoder = decoder
            kv = pools(model, blocks, block_size)
            results.append(
                (model.forward_hidden(ids, positions, decode_meta(lens, block_size), kv), kv)
            )
        return results
    finally:
        model.fused_decoder = fused
        torch.set_num_threads(before)


def assert_same_bits(results) -> None:
    (fused, fused_kv), (loop, loop_kv) = results
    assert torch.equal(fused, loop), (fused - loop).abs().max()
    for (fk, fv), (lk, lv) in zip(fused_kv, loop_kv, strict=True):
        assert torch.equal(fk, lk) and torch.equal(fv, lv)


@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("batch", [1, 3, 17, 24])
def test_decode_step_gives_the_python_loops_bits(model, batch, block_size):
    lens = [40 + 9 * i for i in range(batch)]
    assert_same_bits(both_paths(model, lens, block_size))


def test_one_thread_and_the_tiled_path_from_nine_rows(model):
    assert_same_bits(both_paths(model, [33] * 9, 16, threads=1))


def test_qkv_bias_and_head_norms_give_the_python_loops_bits(smollm):
    grafted = LlamaModel(smollm.config, smollm.weights, CPU, torch.float32, 512)
    gen = torch.Generator().manual_seed(3)
    d = grafted.config.head_dim
    for layer in grafted.layers:
        w = layer.qkv.weight
        w.bias = torch.randn(w.packed.rows, generator=gen) * 0.1
        layer.q_norm, layer.k_norm = 1 + 0.2 * torch.randn(2, d, generator=gen)
    grafted.fused_decoder = cpu_decoder.DecoderWeights(
        [dataclasses.replace(lw, qkv_bias=layer.qkv.weight.bias, q_norm=layer.q_norm, k_norm=layer.k_norm)
         for lw, layer in zip(grafted.fused_decoder.layers, grafted.layers, strict=True)],
        grafted.final_norm, grafted.cos_sin_cache, grafted.num_heads, grafted.num_kv_heads, d,
        grafted.config.rms_norm_eps, grafted.scale,
    )  # fmt: skip
    assert_same_bits(both_paths(grafted, [21, 50, 8], 16))


def test_a_bad_slot_or_position_is_refused_before_anything_is_written(model):
    kv = pools(model, 4, 16)
    copy = [(k.clone(), v.clone()) for k, v in kv]
    meta = decode_meta([10], 16)
    meta.slot_mapping = torch.tensor([4 * 16])  # one past the pools
    with pytest.raises(IndexError, match="outside the KV pools"):
        model.forward_hidden(torch.tensor([5]), torch.tensor([9]), meta, kv)
    with pytest.raises(IndexError, match="outside the rotary cache"):
        model.forward_hidden(torch.tensor([5]), torch.tensor([512]), decode_meta([10], 16), kv)
    assert all(
        torch.equal(a, b)
        for pair, before in zip(kv, copy, strict=True)
        for a, b in zip(pair, before, strict=True)
    )


def test_prefill_steps_and_dense_models_keep_the_python_loop(model):
    meta = decode_meta([10, 12], 16)
    meta.num_decodes = 1  # the second sequence is a prefill chunk: not the C decoder's step
    hidden = torch.zeros(2, model.config.hidden_size)
    assert (
        model.fused_decoder.decode_layers(hidden, torch.tensor([9, 11]), meta, pools(model, 2, 16))
        is None
    )
    dense = load_model("builtin:smollm2-135m", torch.float32, cpu_weights="fp32")
    assert LlamaModel(dense.config, dense.weights, CPU, torch.float32, 64).fused_decoder is None
