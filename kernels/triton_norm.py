"""RMSNorm and fused residual-add + RMSNorm in Triton, one program per row.

Every decoder layer does `residual += x; h = rms_norm(residual)` twice. Unfused that is
three passes over the hidden states (add, square-mean, scale); fused it is one read of
x and residual, one write of residual and one of h. Rounding follows the torch path
(`torch_ops.rms_norm`, the HF Llama convention): the sum is rounded to the residual's
dtype, the normalisation is computed in fp32, rounded to the input dtype, then scaled by
the weight.
"""

import torch
import triton
import triton.language as tl
from llmservice.kernels.triton_common import emulate_bf16, round_bf16


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    hidden,
    eps,
    ADD_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        r_ptrs = residual_ptr + row * stride_r + offs
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        summed = x.to(tl.float32) + r.to(tl.float32)
        if EMULATE_BF16:
            summed = round_bf16(summed)
        summed = summed.to(r.dtype)
        tl.store(r_ptrs, summed, mask=mask)
        x = summed
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / hidden
    normed = xf * tl.rsqrt(mean_sq + eps)
    if EMULATE_BF16:
        normed = round_bf16(normed)
    normed = normed.to(x.dtype)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    y = normed.to(tl.float32) * w.to(tl.float32)
    if EMULATE_BF16:
        y = round_bf16(y)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A [rows, H] view of a tensor written in place (2-D keeps its row stride, else dense)."""
    return t if t.dim() == 2 else t.view(-1, t.shape[-1])


def _launch(x, residual, weight, eps, out):
    hidden = x.shape[-1]
    x2 = x if x.dim() == 2 and x.stride(-1) == 1 else x.reshape(-1, hidden).contiguous()
    out2 = _rows(out)
    rows = x2.shape[0]
    if rows == 0:
        return
    r2 = _rows(residual) if residual is not None else x2
    assert x2.stride(-1) == 1 and r2.stride(-1) == 1 and weight.is_contiguous()
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(rows,)](
        x2,
        r2,
        weight,
        out2,
        x2.stride(0),
        r2.stride(0),
        out2.stride(0),
        hidden,
        eps,
        ADD_RESIDUAL=residual is not None,
        BLOCK=block,
        EMULATE_BF16=emulate_bf16(_rms_norm_kernel, x.dtype, r2.dtype, out.dtype),
        num_warps=min(max(block // 256, 1), 16),
    )


def _out_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, weight.dtype)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., H] -> x / rms(x) * weight."""
    if out is None:
        out = torch.empty(x.shape, dtype=_out_dtype(x, weight), device=x.device)
    _launch(x, None, weight, eps, out)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place); return (rms_norm(residual), residual)."""
    if out is None:
        out = torch.empty(residual.shape, dtype=_out_dtype(residual, weight), device=x.device)
    _launch(x, residual, weight, eps, out)
    return out, residual
