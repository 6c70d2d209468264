"""Paged prefill / extend attention (Triton, interpreter on CPU) against the fp64 reference.

Batches mix decodes (first) with prefill chunks: fresh prompts (query_len == seq_len)
and chunks on top of cached prefixes (query_len < seq_len), as chunked prefill and
prefix-cache hits produce. The kernel must write exactly the prefill rows.
"""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_prefill import paged_prefill_attention

# (query_len, seq_len): two decodes, a fresh odd-length prompt, chunks over cached prefixes
MIXED = [(1, 1), (1, 129), (7, 7), (20, 129), (5, 1000)]


@pytest.fixture
def run_prefill(paged_batch, reference_attention):
    """Attend the prefill chunks of `seqs` and compare with the fp64 reference."""

    def run(seqs, *, block_m=None, block_n=None, **shape):
        batch = paged_batch(seqs, **shape)
        meta = batch.meta
        nd = meta.num_decodes
        out = torch.full_like(batch.q, float("nan"))
        paged_prefill_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            batch.scale,
            max_query_len=max(meta.query_lens[nd:]),
            first_seq=nd,
            out=out,
            block_m=block_m,
            block_n=block_n,
        )
        ref = reference_attention(batch)
        assert torch.isnan(out[:nd]).all(), "decode rows belong to the decode kernel"
        reference.assert_close(out[nd:], ref[nd:], batch.q.dtype)

    return run


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_mixed_batch_every_block_size(block_size, run_prefill):
    run_prefill(MIXED, block_size=block_size, seed=block_size)


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gqa_ratios_and_head_dims(group, head_dim, run_prefill):
    run_prefill([(1, 7), (9, 9), (3, 40)], group=group, num_kv_heads=1, head_dim=head_dim)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype, run_prefill):
    run_prefill([(1, 33), (17, 17), (6, 70)], dtype=dtype)


def test_small_tiles_cross_the_causal_diagonal(run_prefill):
    # 16x16 tiles: many query tiles per chunk, prefix lengths that are not tile multiples,
    # so unmasked tiles, diagonal tiles and skipped tiles all occur
    run_prefill([(1, 100), (37, 37), (45, 61), (16, 16)], block_m=16, block_n=16)


def test_tile_size_not_a_multiple_of_block_size(run_prefill):
    run_prefill([(23, 71), (40, 40)], block_size=32, block_m=16, block_n=16)
    run_prefill([(23, 71), (40, 40)], block_size=8, block_m=32, block_n=32)


def test_only_decodes_writes_nothing(paged_batch):
    batch = paged_batch([(1, 5)], num_kv_heads=1, group=1, head_dim=64, block_size=8)
    out = torch.full_like(batch.q, float("nan"))
    meta = batch.meta
    paged_prefill_attention(
        batch.q, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens,
        meta.query_start_loc, batch.scale, max_query_len=1, first_seq=1, out=out,
    )  # fmt: skip
    assert torch.isnan(out).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_full_sweep(block_size, group, head_dim, dtype, run_prefill):
    run_prefill(
        MIXED + [(129, 129)],
        block_size=block_size,
        num_kv_heads=2,
        group=group,
        head_dim=head_dim,
        dtype=dtype,
        seed=block_size * group + head_dim,
    )


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_fresh_prompts(dtype, run_prefill):
    run_prefill(
        [(1, 600), (600, 600), (3, 600)],  # many BLOCK_M x BLOCK_N tiles; 1000 cost 30 s each
        block_size=16,
        num_kv_heads=1,
        group=8,
        head_dim=128,
        dtype=dtype,
    )
