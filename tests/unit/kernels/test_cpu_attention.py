"""The CPU decode kernel that reads K/V in place (kernels/cpu_attention.c) vs the fp64 reference."""

import pytest
import torch
from llmservice.kernels import cpu_attention, cpu_native, reference, torch_ops
from llmservice.kernels.random_batch import make_paged_batch

pytestmark = pytest.mark.skipif(
    not cpu_native.available("cpu_attention"),
    reason=f"no C compiler: {cpu_native.error('cpu_attention')}",
)
DECODES = [(1, 1), (1, 7), (1, 129), (1, 1000), (1, 64), (1, 33)]


@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 128])
@pytest.mark.parametrize(
    ("kv_heads", "group", "head_dim"), [(2, 1, 64), (3, 3, 64), (1, 8, 128), (2, 4, 80)]
)
def test_decode_matches_reference(block_size, kv_heads, group, head_dim, reference_attention):
    batch = make_paged_batch(
        DECODES,
        num_kv_heads=kv_heads,
        group=group,
        head_dim=head_dim,
        block_size=block_size,
        seed=block_size,
    )
    meta = batch.meta
    got = cpu_attention.paged_decode_attention(
        batch.q, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens, batch.scale
    )
    want = reference_attention(batch)
    reference.assert_close(got, want, torch.float32)
    step = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    reference.assert_close(step, want, torch.float32)  # a decode-only step returns it directly


def test_reads_only_the_sequences_blocks(reference_attention):
    """Blocks outside the tables (and rows past each length) are NaN: none may leak in."""
    batch = make_paged_batch([(1, 5), (1, 40)], num_kv_heads=2, group=3, head_dim=64, block_size=16)
    meta = batch.meta
    used = torch.zeros(batch.k_cache.shape[0], 16, dtype=torch.bool)
    for i, n in enumerate(meta.seq_lens_host):
        for p in range(n):
            used[meta.block_tables[i, p // 16], p % 16] = True
    want = reference_attention(batch)
    for pool in (batch.k_cache, batch.v_cache):
        pool[~used] = float("nan")
    got = cpu_attention.paged_decode_attention(
        batch.q, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens, batch.scale
    )
    reference.assert_close(got, want, torch.float32)


def test_mixed_step_uses_it_and_agrees_with_the_gather_path(reference_attention):
    batch = make_paged_batch(
        [(1, 90), (1, 3), (6, 40)], num_kv_heads=3, group=3, head_dim=64, block_size=8
    )
    meta = batch.meta
    assert cpu_attention.supports(batch.q, batch.k_cache)
    got = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    gathered = torch_ops.paged_decode_attention(
        batch.q[:2],
        batch.k_cache,
        batch.v_cache,
        meta.block_tables,
        meta.seq_lens_host[:2],
        batch.scale,
    )
    reference.assert_close(got, reference_attention(batch), torch.float32)
    reference.assert_close(got[:2], gathered.double(), torch.float32)


def test_only_fp32_pools():
    batch = make_paged_batch(
        [(1, 9)], num_kv_heads=1, group=2, head_dim=64, block_size=8, dtype=torch.bfloat16
    )
    assert not cpu_attention.supports(batch.q, batch.k_cache)


def test_short_chunks_run_row_by_row_as_the_decodes_they_equal(reference_attention):
    """A verification of k+1 rows (and any chunk of <= SHORT_CHUNK_ROWS) goes through the
    decode kernel: close to the reference, and every row bit-identical to a plain decode
    at its own position; a longer chunk keeps the SDPA path."""
    seqs = [(1, 90), (1, 3), (5, 40), (torch_ops.SHORT_CHUNK_ROWS, 60), (torch_ops.SHORT_CHUNK_ROWS + 1, 70)]
    batch = make_paged_batch(seqs, num_kv_heads=3, group=3, head_dim=64, block_size=8, seed=3)
    meta = batch.meta
    got = torch_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    reference.assert_close(got, reference_attention(batch), torch.float32)
    row = 2
    for i, (qlen, total) in enumerate(seqs[2:4], start=2):
        for j in range(qlen):
            alone = cpu_attention.paged_decode_attention(
                batch.q[row : row + 1], batch.k_cache, batch.v_cache, meta.block_tables[i : i + 1],
                torch.tensor([total - qlen + j + 1], dtype=torch.int32), batch.scale,
            )  # fmt: skip
            assert torch.equal(got[row], alone[0]), (i, j)
            row += 1
