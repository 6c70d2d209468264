"""The Triton fused MoE (interpreter on CPU, compiled on CUDA with TRITON_INTERPRET=0)
against the float64 per-expert reference, and its align step's invariants: odd H and I,
one to 64 tokens, top-1 and top-2, an expert with no token, every token on one expert,
experts shared by many tokens, and the compiled tile sizes run through the interpreter."""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_moe import (
    MoEConfig,
    choose_config,
    fused_moe,
    max_padded_pairs,
    moe_align_block_size,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _routing(num_tokens, num_experts, top_k, pattern, gen):
    """topk_ids [T, K] (distinct experts per token) and renormalised fp32 weights [T, K]."""
    if num_tokens == 0:
        return torch.empty(0, top_k), torch.empty(0, top_k, dtype=torch.int64)
    if pattern == "one_expert":  # every token's first choice is expert 1
        ids = torch.stack(
            [torch.cat([torch.tensor([1]), 2 + torch.randperm(num_experts - 2, generator=gen)[: top_k - 1]])
             for _ in range(num_tokens)]
        )  # fmt: skip
    else:
        usable = num_experts - 1 if pattern == "empty_expert" else num_experts  # last one: no token
        ids = torch.stack(
            [torch.randperm(usable, generator=gen)[:top_k] for _ in range(num_tokens)]
        )
    weights = torch.rand(num_tokens, top_k, generator=gen) + 0.1
    return weights / weights.sum(1, keepdim=True), ids


def _case(num_tokens, num_experts, top_k, hidden, inter, dtype, device, pattern="random", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    weights, ids = _routing(num_tokens, num_experts, top_k, pattern, gen)
    return (
        x.to(device=device, dtype=dtype),
        w13.to(device=device, dtype=dtype),
        w2.to(device=device, dtype=dtype),
        weights.to(device),
        ids.to(device),
    )


CASES = [  # T, E, K, H, I, routing
    (1, 4, 1, 48, 40, "random"),
    (3, 8, 2, 48, 40, "random"),
    (17, 8, 2, 64, 24, "empty_expert"),
    (17, 4, 1, 48, 40, "one_expert"),  # all 17 tokens on expert 1: two blocks of one expert
    (64, 4, 2, 48, 40, "random"),  # ~32 pairs per expert: several blocks each
    (64, 8, 2, 40, 56, "one_expert"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, num_experts, top_k, hidden, inter, pattern", CASES)
def test_fused_moe_matches_reference(
    num_tokens, num_experts, top_k, hidden, inter, pattern, dtype, device
):
    args = _case(
        num_tokens, num_experts, top_k, hidden, inter, dtype, device, pattern, seed=num_tokens
    )
    out = fused_moe(*args)
    assert out.shape == (num_tokens, hidden) and out.dtype == dtype and out.device == args[0].device
    reference.assert_close(out, reference.moe_reference(*args), dtype)


def test_int32_ids_and_duplicated_experts_across_tokens(device):
    """Every token picks from the same three experts (int32 ids, as some routers return)."""
    x, w13, w2, weights, _ = _case(9, 8, 2, 48, 40, torch.float32, device)
    gen = torch.Generator().manual_seed(3)
    ids = torch.stack(
        [torch.tensor([2, 5, 6])[torch.randperm(3, generator=gen)[:2]] for _ in range(9)]
    )
    ids = ids.to(device=device, dtype=torch.int32)
    out = fused_moe(x, w13, w2, weights, ids)
    reference.assert_close(out, reference.moe_reference(x, w13, w2, weights, ids), torch.float32)


@pytest.mark.parametrize(
    "config",
    [MoEConfig(16, 64, 32), MoEConfig(32, 64, 64), MoEConfig(64, 16, 16, num_warps=8)],
)
def test_tile_sizes_do_not_change_the_result(config, device):
    """The tiles choose_config picks on a GPU (block_m 16-64), run here too."""
    args = _case(64, 4, 2, 48, 40, torch.float32, device, seed=5)
    out = fused_moe(*args, config=config)
    reference.assert_close(out, reference.moe_reference(*args), torch.float32)


def test_routing_weights_scale_each_pair(device):
    """Doubling one pair's weight adds exactly that pair's expert output once more."""
    x, w13, w2, weights, ids = _case(5, 4, 2, 48, 40, torch.float32, device, seed=2)
    base = fused_moe(x, w13, w2, weights, ids)
    bumped = weights.clone()
    bumped[3, 1] *= 2
    single = fused_moe(x[3:4], w13, w2, weights[3:4, 1:], ids[3:4, 1:])
    got = fused_moe(x, w13, w2, bumped, ids)
    torch.testing.assert_close(got[3], base[3] + single[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[[0, 1, 2, 4]], base[[0, 1, 2, 4]], rtol=0, atol=0)


def test_no_tokens(device):
    x, w13, w2, weights, ids = _case(0, 4, 2, 48, 40, torch.float32, device)
    assert fused_moe(x, w13, w2, weights, ids).shape == (0, 48)


def test_large_batch_with_the_gpus_tiles(device):
    """A prefill-sized batch (64 pairs per expert) with the tiles the compiled path picks
    for it (block_m 64, bf16): 512 tokens on a GPU; on CPU, where the interpreter is slow,
    128 tokens over 4 experts, the same pairs per expert, with those tiles given."""
    if device == "cpu":
        args = _case(128, 4, 2, 64, 48, torch.bfloat16, device, seed=9)
        out = fused_moe(*args, config=MoEConfig(64, 64, 64, num_warps=8))
    else:
        args = _case(512, 16, 2, 256, 192, torch.bfloat16, device, seed=9)
        assert choose_config(1024, 16, torch.bfloat16).block_m == 64
        out = fused_moe(*args)
    reference.assert_close(out, reference.moe_reference(*args), torch.bfloat16)


# --- the align step ------------------------------------------------------------------


def _ids(pattern, num_tokens, num_experts, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    return _routing(num_tokens, num_experts, top_k, pattern, gen)[1]


@pytest.mark.parametrize("block_m", [4, 16])
@pytest.mark.parametrize(
    "pattern, num_tokens, num_experts, top_k",
    [
        ("random", 1, 8, 2),
        ("random", 37, 8, 2),
        ("empty_expert", 20, 6, 3),
        ("one_expert", 30, 4, 1),
    ],
)
def test_align_sorts_pairs_into_single_expert_blocks(
    pattern, num_tokens, num_experts, top_k, block_m, device
):
    ids = _ids(pattern, num_tokens, num_experts, top_k, seed=num_tokens).to(device)
    sorted_ids, expert_ids, post = moe_align_block_size(ids, block_m, num_experts)
    sorted_ids, expert_ids, post = sorted_ids.cpu(), expert_ids.cpu(), int(post.item())
    flat = ids.reshape(-1).cpu()
    pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    assert sorted_ids.numel() == max_padded_pairs(pairs, num_experts, block_m)
    assert expert_ids.numel() * block_m == sorted_ids.numel()
    assert post == int(((counts + block_m - 1) // block_m * block_m).sum())

    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs)), "every pair exactly once"
    assert bool((sorted_ids[sorted_ids >= pairs] == pairs).all()), "padding is the id T*K"
    assert bool((sorted_ids[post:] == pairs).all()) and bool(
        (expert_ids[post // block_m :] == -1).all()
    )

    blocks = sorted_ids[:post].view(-1, block_m)
    seen = []
    for block, expert in zip(blocks, expert_ids[: post // block_m].tolist(), strict=True):
        members = block[block < pairs]
        assert members.numel() > 0, "no block is only padding"
        assert bool((flat[members] == expert).all()), "a block holds one expert's pairs"
        assert members.tolist() == sorted(members.tolist()), "stable: pairs keep their order"
        seen.append(expert)
    assert seen == sorted(seen) and set(seen) == set(flat.tolist()), (
        "experts in order, empty ones skipped"
    )
