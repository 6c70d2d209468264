"""The in-kernel e4m3 codec (kernels/triton_fp8.py) against torch's float8_e4m3fn, bit for bit."""

import pytest
import torch
import triton
import triton.language as tl
from llmservice.kernels.kv_quant import FP8, FP8_MAX
from llmservice.kernels.triton_fp8 import e4m3_to_f32, f32_to_e4m3

BLOCK = 1024


@triton.jit
def _decode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, e4m3_to_f32(tl.load(src_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def _encode_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, f32_to_e4m3(tl.load(src_ptr + offs, mask=mask)), mask=mask)


def _decode(data: torch.Tensor) -> torch.Tensor:
    out = torch.full(data.shape, 123.0, device=data.device)
    _decode_kernel[(triton.cdiv(data.numel(), BLOCK),)](data, out, data.numel(), BLOCK=BLOCK)
    return out


def _encode(x: torch.Tensor) -> torch.Tensor:
    out = torch.full(x.shape, 0x55, dtype=torch.uint8, device=x.device)
    _encode_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def _torch_bytes(x: torch.Tensor) -> torch.Tensor:
    """What kv_quant.quantize stores: saturate to e4m3's range, then torch's cast."""
    return x.cpu().clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)


def test_every_byte_decodes_to_torchs_value(device):
    every = torch.arange(256, dtype=torch.uint8)
    got = _decode(every.to(device)).cpu()
    want = every.view(FP8).float()
    assert torch.equal(got.isnan(), want.isnan())
    assert int(got.isnan().sum()) == 2  # 0x7f and 0xff
    finite = ~want.isnan()
    # bit patterns, so -0.0 (0x80) must come back negative
    assert torch.equal(got[finite].view(torch.int32), want[finite].view(torch.int32))


def test_every_finite_value_encodes_to_its_own_byte(device):
    every = torch.arange(256, dtype=torch.uint8)
    values = every.view(FP8).float()
    finite = ~values.isnan()
    got = _encode(values[finite].to(device)).cpu()
    assert torch.equal(got, every[finite])


def _ties_and_edges() -> torch.Tensor:
    """Midpoints between neighbouring e4m3 values (ties), points just off them, the
    subnormal range, fp32 subnormals, the saturation edge and specials."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()  # 0 .. 448, ascending
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32
    nudge = mids.abs() * 2**-20 + 2**-30
    beyond = torch.tensor([448.0, 455.9, 456.0, 463.9, 464.0, 464.1, 479.0, 480.0, 500.0, 1e6, 3e38,
                           float("inf"), 2**-9, 2**-10, 2**-10 * 1.0001, 3 * 2**-11, 2**-12, 1e-30,
                           1e-40, 1e-45, 0.0])  # fmt: skip
    pos = torch.cat([mids, mids - nudge, mids + nudge, beyond])
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("case", ["ties_and_edges", "random"])
def test_encode_matches_torch_with_round_to_nearest_even_and_saturation(case, device):
    if case == "random":
        gen = torch.Generator().manual_seed(0)
        # magnitudes from deep subnormal to far past 448, every sign
        exponents = torch.randint(-16, 12, (200_000,), generator=gen).float()
        x = torch.randn(200_000, generator=gen) * torch.exp2(exponents)
    else:
        x = _ties_and_edges()
    got = _encode(x.to(device)).cpu()
    want = _torch_bytes(x)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:8]]


def test_nan_encodes_to_the_nan_bytes(device):
    x = torch.tensor([float("nan"), -float("nan")], device=device)
    got = _encode(x).cpu()
    assert sorted(got.tolist()) == [0x7F, 0xFF]
    assert got.view(FP8).float().isnan().all()
