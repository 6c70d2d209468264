"""RMSNorm and fused residual add + RMSNorm (Triton, interpreter on CPU) against fp64."""

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.triton_norm import fused_add_rms_norm, rms_norm

EPS = 1e-5


def _inputs(rows, hidden, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(device=device, dtype=dtype)
    residual = torch.randn(rows, hidden, generator=gen).to(device=device, dtype=dtype)
    weight = (1.0 + 0.5 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [576, 64, 1000])
def test_rms_norm(dtype, hidden, device):
    x, _, weight = _inputs(7, hidden, dtype, device, seed=hidden)
    out = torch.full_like(x, float("nan"))
    assert rms_norm(x, weight, EPS, out=out) is out
    reference.assert_close(out, reference.rms_norm(x, weight, EPS), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [576, 1000])
def test_fused_add_rms_norm_updates_residual_in_place(dtype, hidden, device):
    x, residual, weight = _inputs(5, hidden, dtype, device, seed=hidden + 1)
    want_out, want_residual = reference.fused_add_rms_norm(x, residual, weight, EPS)
    x_before = x.clone()
    out = torch.full_like(x, float("nan"))

    got_out, got_residual = fused_add_rms_norm(x, residual, weight, EPS, out=out)

    assert got_out is out and got_residual is residual
    reference.assert_close(residual, want_residual, dtype)
    reference.assert_close(out, want_out, dtype)
    assert torch.equal(x, x_before), "x is an input only"


def test_three_dimensional_input(device):
    x, _, weight = _inputs(6, 128, torch.float32, device, seed=3)
    x3 = x.view(2, 3, 128)
    reference.assert_close(
        rms_norm(x3, weight, EPS), reference.rms_norm(x3, weight, EPS), torch.float32
    )
