"""The Triton LoRA shrink/expand kernels (interpreter on CPU) against the float64 reference
and against the slot pool's per-group torch delta (server/lora/weights.py): rows of several
adapters mixed with base rows (-1), ranks below the padded R, odd sizes, fused groups of
one to three modules written into a column slice of a wider output."""

import pytest
import torch
from llmservice.kernels import ops, reference
from llmservice.kernels.lora_rows import lora_tiles
from llmservice.kernels.triton_lora import add_lora, lora_expand, lora_shrink
from llmservice.server.lora.adapter import LoRAAdapter
from llmservice.server.lora.weights import GROUPS, LoRAWeights
from llmservice.server.model.config import ModelConfig

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _stacks(slots, widths, fan_in, padded_rank, ranks, dtype, device, gen):
    """a [slots, n*R, in], b [slots, sum(widths), R] with slot i of rank ranks[i] (zero padding)."""
    n = len(widths)
    a = torch.zeros(slots, n * padded_rank, fan_in)
    b = torch.zeros(slots, sum(widths), padded_rank)
    for slot, rank in enumerate(ranks):
        for m in range(n):
            a[slot, m * padded_rank : m * padded_rank + rank] = (
                torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            )
        b[slot, :, :rank] = torch.randn(sum(widths), rank, generator=gen)
    return a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)


def _case(row_slots, widths, fan_in, padded_rank, ranks, dtype, device, seed, margin=(3, 5)):
    """Inputs and a poisoned-margin output: `out` is a column slice of `full`."""
    gen = torch.Generator().manual_seed(seed)
    a, b = _stacks(len(ranks), widths, fan_in, padded_rank, ranks, dtype, device, gen)
    x = torch.randn(len(row_slots), fan_in, generator=gen).to(device=device, dtype=dtype)
    scalings = torch.tensor([0.5 + i for i in range(len(ranks))], device=device)
    full = torch.randn(len(row_slots), margin[0] + sum(widths) + margin[1], generator=gen).to(
        device=device, dtype=dtype
    )
    out = full[:, margin[0] : margin[0] + sum(widths)]
    return x, a, b, scalings, full, out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "row_slots, widths, fan_in, ranks",
    [
        ([0, -1, 2, 0, 1, -1, 2, 2, 0], (24, 8, 8), 40, [8, 3, 5]),  # fused q/k/v, odd in
        ([-1, 1, 1, -1, 0], (70,), 33, [2, 8]),  # one module wider than a column block
        ([1, 0, 1, 0, 1, 0, 1], (13, 13), 19, [1, 7]),  # gate/up, interleaved rows
    ],
)
def test_add_lora_matches_reference(dtype, row_slots, widths, fan_in, ranks, device):
    x, a, b, scalings, full, out = _case(
        row_slots, widths, fan_in, 8, ranks, dtype, device, seed=fan_in
    )
    before = full.clone()
    want = reference.lora_add(x, a, b, scalings, row_slots, widths, out)

    add_lora(x, a, b, scalings, lora_tiles(row_slots, device), widths, out)

    reference.assert_close(out, want, dtype)
    base_rows = [i for i, s in enumerate(row_slots) if s < 0]
    assert torch.equal(full[base_rows], before[base_rows]), "base-model rows are left untouched"
    assert torch.equal(full[:, :3], before[:, :3]) and torch.equal(full[:, -5:], before[:, -5:]), (
        "columns outside the slice are left untouched"
    )


@pytest.mark.parametrize("num_splits", [1, 3])
def test_many_rows_per_adapter_and_split_k(num_splits, device):
    """37 unsorted rows: one adapter's 20 rows span two 16-row tiles or one 32-row tile,
    and the shrink's K is split across programs."""
    gen = torch.Generator().manual_seed(num_splits)
    row_slots = torch.randint(-1, 2, (37,), generator=gen).tolist()
    row_slots[:20] = [0] * 20
    perm = torch.randperm(37, generator=gen).tolist()
    row_slots = [row_slots[i] for i in perm]
    widths = (29, 11)
    x, a, b, scalings, _, out = _case(
        row_slots, widths, 150, 16, [16, 9], torch.float32, device, seed=7
    )
    want = reference.lora_add(x, a, b, scalings, row_slots, widths, out)
    for block_m in (16, 32):
        got = out.clone()
        add_lora(
            x,
            a,
            b,
            scalings,
            lora_tiles(row_slots, device, block_m),
            widths,
            got,
            num_splits=num_splits,
        )
        reference.assert_close(got, want, torch.float32)


def test_expand_reads_only_tiled_rows_of_the_workspace(device):
    """The shrink writes only the tiles' rows of its workspace; poisoning every other row
    (and a spare split) with NaN must not reach the output."""
    row_slots = [1, -1, 0, -1, 1]
    widths = (16, 16)
    x, a, b, scalings, _, out = _case(
        row_slots, widths, 24, 8, [8, 4], torch.float32, device, seed=3
    )
    tiles = lora_tiles(row_slots, device)
    s = lora_shrink(x, a, tiles, num_splits=2)
    poisoned = torch.full((3, *s.shape[1:]), float("nan"), device=device)
    adapter_rows = [i for i, slot in enumerate(row_slots) if slot >= 0]
    poisoned[:2, adapter_rows] = s[:, adapter_rows]
    want = reference.lora_add(x, a, b, scalings, row_slots, widths, out)

    lora_expand(poisoned[:2], b, out, scalings, tiles, widths)

    reference.assert_close(out, want, torch.float32)


def test_tiles_group_rows_by_slot_and_skip_base_rows():
    tiles = lora_tiles([2, -1, 0, 2, 2, -1, 0], "cpu", block_m=2)
    assert tiles.row_ids.tolist() == [2, 6, 0, 3, 4]
    assert tiles.tile_slot.tolist() == [0, 2, 2]
    assert tiles.tile_start.tolist() == [0, 2, 4]
    assert tiles.tile_rows.tolist() == [2, 2, 1]
    assert lora_tiles([-1, -1], "cpu") is None
    assert lora_tiles(list(range(3)) * 6, "cpu").block_m == 16
    assert lora_tiles([0] * 17, "cpu").block_m == 32


# --- the slot pool's two paths: the Triton kernels vs its per-group torch loop ----------

CONFIG = ModelConfig("llama", num_layers=2, hidden_size=40, num_heads=4, num_kv_heads=2, head_dim=10,
                     intermediate_size=27, vocab_size=64)  # fmt: skip


def _pool(dtype, device) -> LoRAWeights:
    """Three slots: rank 8 on every module, rank 3 on q/v/down only, and an empty slot."""
    pool = LoRAWeights(CONFIG, num_slots=3, max_rank=8, device=torch.device(device), dtype=dtype)
    gen = torch.Generator().manual_seed(11)
    for slot, (rank, modules) in enumerate(
        [(8, [m for g in GROUPS for m in g]), (3, ["q_proj", "v_proj", "down_proj"])]
    ):
        weights = {}
        for layer in range(CONFIG.num_layers):
            for m in modules:
                fan_in, fan_out = pool.shapes[m]
                weights[(layer, m)] = (
                    torch.randn(rank, fan_in, generator=gen) / fan_in**0.5,
                    torch.randn(fan_out, rank, generator=gen),
                )
        pool.load_slot(slot, LoRAAdapter(f"a{slot}", rank, 2.0 / (slot + 1), None, weights))
    return pool


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_triton_path_matches_its_torch_path(dtype, device, monkeypatch):
    pool = _pool(dtype, device)
    row_slots = [1, -1, 0, 0, -1, 1, 0]
    gen = torch.Generator().manual_seed(5)
    for layer, modules in [(0, GROUPS[0]), (1, GROUPS[2]), (1, GROUPS[3])]:
        fan_in = pool.shapes[modules[0]][0]
        width = sum(pool.shapes[m][1] for m in modules)
        x = torch.randn(len(row_slots), fan_in, generator=gen).to(device=device, dtype=dtype)
        base = torch.randn(len(row_slots), width, generator=gen).to(device=device, dtype=dtype)
        got = {}
        for path in ("torch", "triton"):
            monkeypatch.setenv("LLMSERVICE_KERNELS", path)
            pool.set_rows(row_slots)
            got[path] = pool.add(layer, modules, x, base.clone())
        reference.assert_close(got["triton"], got["torch"], dtype)
        assert torch.equal(got["triton"][[1, 4]], base[[1, 4]])


def test_pool_on_cpu_keeps_the_torch_loop(monkeypatch):
    """Without LLMSERVICE_KERNELS, CPU tensors never reach the Triton kernels."""
    monkeypatch.delenv("LLMSERVICE_KERNELS", raising=False)

    def refuse(*args):
        raise AssertionError("the Triton LoRA path ran on CPU tensors")

    monkeypatch.setattr(ops, "lora_add", refuse)
    pool = _pool(torch.float32, "cpu")
    pool.set_rows([0, -1, 1])
    x = torch.randn(3, CONFIG.hidden_size)
    out = pool.add(0, GROUPS[0], x, torch.zeros(3, pool.group_b[0][GROUPS[0]].shape[1]))
    assert out[0].abs().sum() > 0 and torch.equal(out[1], torch.zeros_like(out[1]))
