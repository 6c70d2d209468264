"""Split-KV paged decode attention (Triton, interpreter on CPU) against the fp64 reference."""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_decode import (
    choose_num_splits,
    decode_workspace,
    paged_decode_attention,
)

ODD_LENGTHS = (1, 7, 129, 1000)


@pytest.fixture
def run_decode(paged_batch, reference_attention):
    """Decode `lengths` (one query token each) and compare with the fp64 reference."""

    def run(lengths, *, num_splits=None, **shape):
        batch = paged_batch([(1, n) for n in lengths], **shape)
        meta = batch.meta
        _, num_heads, head_dim = batch.q.shape
        num_kv_heads = batch.k_cache.shape[2]
        out = torch.full_like(batch.q, float("nan"))
        splits = num_splits or choose_num_splits(len(lengths), num_kv_heads, max(lengths), 4)
        workspace = decode_workspace(len(lengths), num_heads, head_dim, splits, batch.q.device)
        for buf in workspace:
            buf.fill_(float("nan"))
        result = paged_decode_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            meta.block_tables,
            meta.seq_lens,
            batch.scale,
            num_splits=splits,
            out=out,
            workspace=workspace,
        )
        assert result is out
        reference.assert_close(out, reference_attention(batch), batch.q.dtype)

    return run


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_every_block_size_with_odd_lengths(block_size, run_decode):
    run_decode(ODD_LENGTHS, block_size=block_size, seed=block_size)


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gqa_ratios_and_head_dims(group, head_dim, run_decode):
    run_decode((7, 129), group=group, num_kv_heads=1, head_dim=head_dim)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype, run_decode):
    run_decode((1, 129, 300), dtype=dtype, num_splits=3)


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_split_counts_including_empty_splits(num_splits, run_decode):
    # a 1-token sequence leaves all but one split empty; 129 tokens do not divide evenly
    run_decode((1, 129), num_splits=num_splits)


def test_split_merge_is_exact_across_many_splits(run_decode):
    run_decode((1000,), num_splits=16, group=8, num_kv_heads=1)


def test_choose_num_splits_fills_the_gpu_only_when_needed():
    # small batch, long context: split until ~2 waves of programs
    assert choose_num_splits(batch=1, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 33
    # large batch already fills the GPU
    assert choose_num_splits(batch=256, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 1
    # short contexts are not split below MIN_TOKENS_PER_SPLIT tokens per split
    assert choose_num_splits(batch=1, num_kv_heads=1, max_seq_len=300, num_sms=132) == 2
    assert choose_num_splits(batch=1, num_kv_heads=1, max_seq_len=1, num_sms=132) == 1


def test_many_query_heads_merge_in_several_head_blocks(run_decode):
    # 32 query heads: stage 2 merges them in two blocks of 16
    run_decode((129, 7), num_kv_heads=4, group=8, num_splits=3)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_full_sweep(block_size, group, head_dim, dtype, run_decode):
    for num_splits in (1, 4):
        run_decode(
            ODD_LENGTHS,
            block_size=block_size,
            num_kv_heads=2,
            group=group,
            head_dim=head_dim,
            dtype=dtype,
            num_splits=num_splits,
            seed=block_size * group + head_dim,
        )
