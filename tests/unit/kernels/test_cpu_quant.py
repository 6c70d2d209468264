"""The packed GGUF matmul kernels (kernels/cpu_quant.c) against dequantize-then-matmul.

The reference dequantizer is the loader's (server/model/dequant.py), which is what HF
parity was established with; matmuls are compared with a float64 product of the same
weights, so the only allowed difference is fp32 summation order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from llmservice.kernels import cpu_native, cpu_quant
from llmservice.kernels.cpu_quant import Q4_0, Q4_1, Q8_0, Packed
from llmservice.server.model.dequant import dequantize_q4_0, dequantize_q4_1, dequantize_q8_0

pytestmark = pytest.mark.skipif(
    not cpu_native.available(), reason=f"no C compiler: {cpu_native.error()}"
)
REFERENCE = {Q4_0: dequantize_q4_0, Q4_1: dequantize_q4_1, Q8_0: dequantize_q8_0}
KINDS = [pytest.param(k, id=n) for k, n in ((Q4_0, "q4_0"), (Q4_1, "q4_1"), (Q8_0, "q8_0"))]


def random_blocks(kind: int, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random quant bytes with finite fp16 scales (and mins) of realistic size."""
    g = torch.Generator().manual_seed(seed)
    nb, bb = cols // 32, cpu_quant.BLOCK_BYTES[kind]
    raw = torch.randint(0, 256, (rows * nb, bb), dtype=torch.uint8, generator=g)
    scale = (torch.rand(rows * nb, generator=g) * 0.02 + 1e-4) * torch.where(
        torch.rand(rows * nb, generator=g) < 0.1, -1, 1
    )
    raw[:, 0:2] = scale.half().view(torch.uint8).view(-1, 2)
    if kind == Q4_1:
        raw[:, 2:4] = (
            (-torch.rand(rows * nb, generator=g) * 0.15).half().view(torch.uint8).view(-1, 2)
        )
    return raw.view(rows, nb * bb).contiguous()


def reference_weights(kind: int, raw: torch.Tensor, cols: int) -> torch.Tensor:
    return REFERENCE[kind](raw.numpy()).reshape(raw.shape[0], cols)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (7, 96), (33, 576), (5, 1536), (130, 64)])
def test_dequantize_is_bit_exact(kind, rows, cols):
    raw = random_blocks(kind, rows, cols, seed=rows * cols)
    assert torch.equal(
        cpu_quant.dequantize(Packed(kind, raw, cols)), reference_weights(kind, raw, cols)
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["direct", "tiled", "dequant_gemm"])
@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (7, 96), (33, 1536)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 17])
def test_matmul_matches_dequantize_then_matmul(kind, path, rows, cols, m):
    raw = random_blocks(kind, rows, cols, seed=rows + cols + m)
    w = reference_weights(kind, raw, cols).double()
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
    y = cpu_quant.matmul(x, Packed(kind, raw, cols), path=path)
    assert y.shape == (m, rows) and y.dtype == torch.float32
    assert rel_err(y, x.double() @ w.T) <= 1e-5


@pytest.mark.parametrize("path", ["direct", "tiled", "dequant_gemm"])
def test_bias_leading_dims_and_strided_rows(path):
    raw = random_blocks(Q4_1, 12, 64)
    w = reference_weights(Q4_1, raw, 64).double()
    bias = torch.randn(12, 2)[:, 0]  # not contiguous either
    x = torch.randn(2, 3, 128)[..., :64]  # rows not contiguous: a stride of 128
    y = cpu_quant.matmul(x, Packed(Q4_1, raw, 64), bias, path=path)
    assert y.shape == (2, 3, 12)
    assert rel_err(y, x.double() @ w.T + bias.double()) <= 1e-5
    assert cpu_quant.matmul(torch.empty(0, 64), Packed(Q4_1, raw, 64)).shape == (0, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_embedding_rows_and_slices(kind):
    raw = random_blocks(kind, 40, 96)
    p = Packed(kind, raw, 96)
    w = reference_weights(kind, raw, 96)
    ids = torch.tensor([[0, 39], [7, 7]])
    assert torch.equal(cpu_quant.embedding(ids, p), w[ids])
    order = torch.tensor([3, 1, 2, 0])
    assert torch.equal(cpu_quant.dequantize(p.select_rows(order)), w[order])
    assert torch.equal(cpu_quant.dequantize(p.narrow_cols(32, 64)), w[:, 32:96])
    with pytest.raises(IndexError):
        cpu_quant.embedding(torch.tensor([40]), p)


def test_refuses_what_it_cannot_compute():
    raw = random_blocks(Q8_0, 4, 64)
    p = Packed(Q8_0, raw, 64)
    with pytest.raises(ValueError, match="multiple of the 32"):
        Packed(Q8_0, raw, 60)
    with pytest.raises(ValueError, match="unsupported block type"):
        Packed(6, raw, 64)
    with pytest.raises(ValueError, match="does not hold"):
        Packed(Q4_0, raw, 64)
    with pytest.raises(ValueError, match="fall on 32-element blocks"):
        p.narrow_cols(16, 32)
    with pytest.raises(TypeError, match="fp32 CPU activations"):
        cpu_quant.matmul(torch.randn(1, 64, dtype=torch.float64), p)
    with pytest.raises(ValueError, match="features"):
        cpu_quant.matmul(torch.randn(1, 32), p)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gives_the_same_bits_whatever_the_batch(kind):
    """Batch invariance: row r of x @ W.T is bit-identical alone, at any position of a
    batch of any size, which the engine's exact-equality tests rely on."""
    raw = random_blocks(kind, 50, 576)
    p = Packed(kind, raw, 576)
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(1))
    full = cpu_quant.matmul(x, p)
    for rows in (slice(5, 6), slice(0, 3), slice(2, 7), slice(1, 70)):
        assert torch.equal(cpu_quant.matmul(x[rows], p), full[rows]), rows
    assert cpu_quant.choose_path(1) == "direct" and cpu_quant.choose_path(2048) == "tiled"
    # a verification of 8 positions takes one direct pass; from there by thread count
    assert [cpu_quant.choose_path(m, threads=1) for m in (8, 9)] == ["direct", "tiled"]
    assert [cpu_quant.choose_path(m, threads=2) for m in (16, 17)] == ["direct", "tiled"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "cols"), [(1, 64), (5, 96), (13, 576), (34, 1536)])
@pytest.mark.parametrize("m", [1, 3, 6, 9, 31, 130])
def test_tiled_odd_shapes_match_dequantize_then_matmul(kind, rows, cols, m):
    """Rows not a multiple of the weight tile, activation rows not a multiple of the row
    tile, K of 2 to 48 blocks; bias added."""
    raw = random_blocks(kind, rows, cols, seed=rows * 7 + cols + m)
    w = reference_weights(kind, raw, cols).double()
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m + 1))
    bias = torch.randn(rows)
    y = cpu_quant.matmul(x, Packed(kind, raw, cols), bias, path="tiled")
    assert y.shape == (m, rows)
    assert rel_err(y, x.double() @ w.T + bias.double()) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "cols"), [(7, 96), (50, 576), (5, 1536)])
def test_tiled_has_the_direct_bits_for_every_batch_size(kind, rows, cols):
    """One summation order for every M: a row's result is bit-identical computed alone
    (M = 1, direct) or inside a batch of 1-130 rows at any position, whichever path the
    batch size picks, and the tiled and direct kernels agree bit for bit."""
    raw = random_blocks(kind, rows, cols, seed=rows + cols)
    p = Packed(kind, raw, cols)
    bias = torch.randn(rows)
    x = torch.randn(130, cols, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([cpu_quant.matmul(x[i : i + 1], p, bias) for i in range(130)])
    assert torch.equal(cpu_quant.matmul(x, p, bias, path="direct"), alone)
    for m in range(1, 131):
        assert torch.equal(cpu_quant.matmul(x[:m], p, bias), alone[:m]), m
        assert torch.equal(
            cpu_quant.matmul(x[130 - m :], p, bias, path="tiled"), alone[130 - m :]
        ), m


@pytest.mark.parametrize("m", [3, 70])  # direct, tiled
def test_threads_give_the_same_result(m):
    raw = random_blocks(Q4_1, 67, 576)
    x = torch.randn(m, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_quant.matmul(x, Packed(Q4_1, raw, 576))
        torch.set_num_threads(2)
        two = cpu_quant.matmul(x, Packed(Q4_1, raw, 576))
        torch.set_num_threads(3)  # more threads than weight tiles of some chunks
        three = cpu_quant.matmul(x, Packed(Q4_1, raw[:5].contiguous(), 576))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # rows are independent: threads only split them
    assert torch.equal(three, one[:, :5])


def test_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSERVICE_CACHE", str(tmp_path))
    first = cpu_native.build()
    assert first.parent == tmp_path / "kernels" and first.exists()
    mtime = first.stat().st_mtime_ns
    assert cpu_native.build() == first and first.stat().st_mtime_ns == mtime
    assert np.fromfile(first, dtype=np.uint8, count=4).tobytes() == b"\x7fELF"
