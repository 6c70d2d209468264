"""The Triton KV write, decode and prefill kernels on fp8 pools (interpreter on CPU)
against what the CPU engine does with them: kv_quant.quantize for the bytes written, and
attention over the dequantized pools (the fp64 reference and the torch path). Both read
the same bytes times the same scales, so they agree to fp32 rounding, far inside e4m3's
own error (~3 %): a kernel that skipped a scale or misread a byte would fail."""

import dataclasses

import pytest
import torch
from llmservice.kernels import kv_quant, reference, torch_ops
from llmservice.kernels.random_batch import PagedBatch
from llmservice.kernels.triton_cache import reshape_and_cache
from llmservice.kernels.triton_decode import paged_decode_attention
from llmservice.kernels.triton_prefill import paged_prefill_attention

# fp32: what fp32 accumulation in another order leaves; half precision: the usual bound
FP8_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _fp8_pool(pool: torch.Tensor, gain: float) -> torch.Tensor:
    """pool * gain stored as e4m3 with the scale the engine's calibration would give it."""
    values = pool.float() * gain
    scale = kv_quant.scale_for(float(values.abs().max()))
    quantized = kv_quant.quantize(values, scale)
    kv_quant.set_scale(quantized, scale)
    return quantized


def _fp8_batch(batch: PagedBatch) -> PagedBatch:
    """The batch with e4m3 pools; V is scaled up first so K and V have different scales."""
    return dataclasses.replace(
        batch, k_cache=_fp8_pool(batch.k_cache, 1.0), v_cache=_fp8_pool(batch.v_cache, 5.0)
    )


def _dequantized(pool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return kv_quant.dequantize(pool.cpu(), kv_quant.scale_of(pool), dtype)


def _check(out: torch.Tensor, batch: PagedBatch, rows: slice) -> None:
    """Rows of `out` against the fp64 reference and the torch path over the same bytes."""
    meta, dtype = batch.meta, batch.q.dtype
    want = reference.paged_attention(batch.q, _dequantized(batch.k_cache, dtype), _dequantized(batch.v_cache, dtype),
                                     meta.block_tables, meta.seq_lens_host, meta.query_lens, batch.scale)  # fmt: skip
    cpu_meta = dataclasses.replace(meta, block_tables=meta.block_tables.cpu(), seq_lens=meta.seq_lens.cpu(),
                                   query_start_loc=meta.query_start_loc.cpu(), slot_mapping=meta.slot_mapping.cpu())  # fmt: skip
    k_cpu, v_cpu = batch.k_cache.cpu(), batch.v_cache.cpu()
    kv_quant.set_scale(k_cpu, kv_quant.scale_of(batch.k_cache))
    kv_quant.set_scale(v_cpu, kv_quant.scale_of(batch.v_cache))
    torch_path = torch_ops.paged_attention(batch.q.cpu(), k_cpu, v_cpu, cpu_meta, batch.scale)
    tolerance = FP8_TOLERANCE[dtype]
    for name, ref in (("fp64 reference", want), ("torch path", torch_path)):
        err = reference.relative_error(out[rows], ref[rows])
        assert err <= tolerance, f"{name}: relative error {err:.3e} > {tolerance:.0e} ({dtype})"


@pytest.fixture
def fp8_decode(paged_batch):
    def run(lengths, *, num_splits, **shape):
        batch = _fp8_batch(paged_batch([(1, n) for n in lengths], **shape))
        meta = batch.meta
        out = torch.full_like(batch.q, float("nan"))
        paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens, batch.scale,
                               num_splits=num_splits, out=out)  # fmt: skip
        _check(out, batch, slice(None))

    return run


@pytest.fixture
def fp8_prefill(paged_batch):
    def run(seqs, *, block_m=None, block_n=None, **shape):
        batch = _fp8_batch(paged_batch(seqs, **shape))
        meta = batch.meta
        nd = meta.num_decodes
        out = torch.full_like(batch.q, float("nan"))
        paged_prefill_attention(batch.q, batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens,
                                meta.query_start_loc, batch.scale, max_query_len=max(meta.query_lens[nd:]),
                                first_seq=nd, out=out, block_m=block_m, block_n=block_n)  # fmt: skip
        assert torch.isnan(out[:nd]).all(), "decode rows belong to the decode kernel"
        _check(out, batch, slice(nd, None))

    return run


@pytest.mark.parametrize(("block_size", "num_splits"), [(8, 3), (32, 1), (128, 2)])
def test_decode_odd_lengths_block_sizes_and_splits(block_size, num_splits, fp8_decode):
    fp8_decode((1, 7, 129, 300), num_splits=num_splits, block_size=block_size, seed=block_size)


def test_decode_gqa_group_of_eight_head_dim_128(fp8_decode):
    fp8_decode((9, 130), num_splits=2, group=8, num_kv_heads=1, head_dim=128)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_half_precision_model(dtype, fp8_decode):
    fp8_decode((1, 129), num_splits=2, dtype=dtype)


# decodes, a fresh prompt, chunks on cached prefixes
MIXED = [(1, 1), (1, 129), (7, 7), (20, 129), (5, 300)]


@pytest.mark.parametrize("block_size", [8, 32, 128])
def test_prefill_mixed_batch_block_sizes(block_size, fp8_prefill):
    fp8_prefill(MIXED, block_size=block_size, seed=block_size)


def test_prefill_gqa_and_small_tiles_across_the_diagonal(fp8_prefill):
    fp8_prefill([(1, 7), (9, 9), (3, 40)], group=8, num_kv_heads=1, head_dim=128)
    fp8_prefill([(37, 37), (45, 61)], block_m=16, block_n=16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_half_precision_model(dtype, fp8_prefill):
    fp8_prefill([(1, 33), (17, 17), (6, 70)], dtype=dtype)


POISON = 0x5A


@pytest.mark.parametrize("block_size", [8, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cache_write_stores_exactly_kv_quants_bytes(block_size, dtype, device):
    num_blocks, hkv, d, tokens = 5, 3, 64, 9
    gen = torch.Generator().manual_seed(block_size)
    qkv = torch.randn(tokens, 6 * hkv * d, generator=gen)
    qkv[:, 4 * hkv * d :: 7] *= 300.0  # past the calibrated range: saturated, not NaN
    qkv[:, 4 * hkv * d + 3 :: 11] *= 1e-4  # e4m3 subnormals and ties between them
    qkv = qkv.to(device=device, dtype=dtype)
    # strided column slices of a fused QKV output, as the model makes them
    _, key, value = qkv.split([4 * hkv * d, hkv * d, hkv * d], dim=-1)
    key, value = key.view(tokens, hkv, d), value.view(tokens, hkv, d)
    shape = (num_blocks, block_size, hkv, d)
    k_cache = torch.full(shape, POISON, dtype=torch.uint8, device=device).view(kv_quant.FP8)
    v_cache = torch.full(shape, POISON, dtype=torch.uint8, device=device).view(kv_quant.FP8)
    kv_quant.set_scale(k_cache, 0.0123)
    kv_quant.set_scale(v_cache, 0.0456)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[4] = -1  # a padding token writes nothing

    reshape_and_cache(key, value, k_cache, v_cache, slots.to(device))

    for cache, rows, scale in ((k_cache, key, 0.0123), (v_cache, value, 0.0456)):
        want = torch.full(shape, POISON, dtype=torch.uint8).view(-1, hkv, d)
        keep = slots >= 0
        want[slots[keep]] = kv_quant.quantize(rows.cpu()[keep], scale).view(torch.uint8)
        got = cache.cpu().view(torch.uint8).view(-1, hkv, d)
        assert torch.equal(got, want)
        written = got[slots[keep]] & 0x7F
        # values past the range saturate to 448 (0x7e), never NaN (0x7f)
        assert (written == 0x7E).any() and not (written == 0x7F).any()
