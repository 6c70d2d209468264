"""The one-call C decoder with adapter rows against the model's Python layer loop.

A decode step whose rows use LoRA adapters stays on the C decoder, which adds each
projection's delta with the C function the Python loop calls (kernels/cpu_lora.c), so
both must give the same bits: hidden states, every K/V row written, and logits. Checked
on the embedded model's packed weights with a pool of four slots padded to rank 16
holding adapters of ranks 8, 16 and 3 that target different modules, rows of several
adapters and of the base model mixed, at batch sizes on both matmul paths."""

from __future__ import annotations

import pytest
import torch
from llmservice.kernels import cpu_decoder, cpu_lora
from llmservice.server.lora.adapter import LoRAAdapter
from llmservice.server.lora.weights import MODULES, LoRAWeights
from llmservice.server.model.llama import LlamaModel

from tests.unit.engine.test_cpu_decoder import assert_same_bits, decode_meta, pools

pytestmark = pytest.mark.skipif(
    not (cpu_decoder.available() and cpu_lora.available()),
    reason="the C kernels cannot be built here",
)
CPU = torch.device("cpu")
# (rank, targeted modules) of the adapters in slots 0-2; slot 3 stays empty
ADAPTERS = [
    (8, MODULES),
    (16, ("q_proj", "v_proj", "gate_proj", "down_proj")),
    (3, ("k_proj", "o_proj", "up_proj")),
]


def random_adapter(
    model: LlamaModel, pool: LoRAWeights, rank: int, modules, seed: int
) -> LoRAAdapter:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(model.config.num_layers):
        for m in modules:
            fan_in, fan_out = pool.shapes[m]
            a = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            weights[(layer, m)] = (a, torch.randn(fan_out, rank, generator=gen) * 0.05)
    return LoRAAdapter(f"r{rank}", rank, 2.0 / (seed + 1), None, weights)


@pytest.fixture(scope="module")
def model(smollm) -> LlamaModel:
    m = LlamaModel(smollm.config, smollm.weights, CPU, torch.float32, 512)
    pool = LoRAWeights(m.config, num_slots=4, max_rank=16, device=CPU, dtype=torch.float32)
    assert pool.cpu is not None
    for slot, (rank, modules) in enumerate(ADAPTERS):
        pool.load_slot(slot, random_adapter(m, pool, rank, modules, seed=slot))
    m.lora = pool
    return m


def run(
    model: LlamaModel, lens: list[int], row_slots: list[int] | None, fused: bool, threads: int = 2
):
    """(hidden, pools, logits) of one decode step through the C decoder or the Python loop."""
    decoder = model.fused_decoder
    assert decoder is not None
    ids = torch.tensor([(7919 * i) % 40000 + 17 for i in range(len(lens))])
    positions = torch.tensor([n - 1 for n in lens])
    kv = pools(model, len(lens) * -(-max(lens) // 16), 16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    model.fused_decoder = decoder if fused else None
    model.lora.set_rows(row_slots)
    try:
        hidden = model.forward_hidden(ids, positions, decode_meta(lens, 16), kv)
        return hidden, kv, model.compute_logits(hidden, torch.arange(len(lens)))
    finally:
        model.fused_decoder = decoder
        model.lora.set_rows(None)
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "row_slots",
    [[1], [0, -1, 2, 1, 3], [2, 0, 1, -1] * 4 + [0], [0] * 9],
    ids=["one-row", "mixed-5", "mixed-17-tiled", "one-adapter-9"],
)
def test_c_decoder_with_adapters_gives_the_python_loops_bits(model, row_slots):
    lens = [30 + 7 * i for i in range(len(row_slots))]
    fused, loop = run(model, lens, row_slots, True), run(model, lens, row_slots, False)
    assert_same_bits([fused[:2], loop[:2]])
    assert torch.equal(fused[2], loop[2])


def test_one_thread_gives_the_same_bits(model):
    lens, row_slots = [40, 41, 42, 43, 44, 45, 46, 47, 48], [0, 1, 2, -1, 0, 1, 2, 3, 1]
    assert_same_bits(
        [run(model, lens, row_slots, True, threads=1)[:2], run(model, lens, row_slots, False)[:2]]
    )


def test_adapter_rows_change_and_base_rows_keep_the_base_bits(model):
    lens, row_slots = [25, 33, 41, 50, 58], [0, -1, 1, 3, 2]
    with_adapters = run(model, lens, row_slots, True)[0]
    base = run(model, lens, None, True)[0]
    for row, slot in enumerate(row_slots):
        same = torch.equal(with_adapters[row], base[row])
        assert same == (slot in (-1, 3)), (row, slot)  # slot 3 holds no adapter: a zero delta


def test_a_slot_outside_the_pool_is_refused(model):
    with pytest.raises(IndexError, match="outside the pool"):
        run(model, [20], [4], True)
