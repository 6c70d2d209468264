"""Small pieces shared by the Triton kernels: matmul and rounding helpers, host configs.

Why the helpers exist: Triton 3.7's interpreter (TRITON_INTERPRET=1, how every kernel is
tested on CPU) mishandles bf16 twice. It stores bf16 as uint16 and its `tl.dot`
multiplies those raw integers, so a bf16 matmul returns garbage; and its fp32 -> bf16
cast truncates instead of rounding to nearest-even, doubling the rounding error of every
bf16 store. With EMULATE_BF16 set (only ever under the interpreter with bf16 data) the
kernels widen bf16 dot operands to fp32 (exact) and round fp32 -> bf16 by integer
arithmetic, reproducing what compiled GPU code does natively. Compiled kernels get
EMULATE_BF16=False, so the workaround is compiled out of them.

fp32 dots ask for "ieee" precision so a GPU does not silently drop to TF32 (which would
break the 1e-4 fp32 tolerance); half-precision dots use the tensor cores as usual.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr):
    if EMULATE_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def round_to(x, dtype: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """fp32 x cast to `dtype`, rounding to nearest-even as the GPU does."""
    if EMULATE_BF16:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16
            x = bits.to(tl.float32, bitcast=True)  # exactly representable: the cast is exact
    return x.to(dtype)


def interpreting() -> bool:
    """True when @triton.jit builds interpreter functions (TRITON_INTERPRET is set now)."""
    return bool(triton.knobs.runtime.interpret)


def is_interpreted(kernel: object) -> bool:
    """Whether a decorated kernel runs in the interpreter (fixed at its module's import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def emulate_bf16(kernel: object, *dtypes: torch.dtype) -> bool:
    """EMULATE_BF16 for a launch of `kernel` touching tensors of `dtypes`."""
    return torch.bfloat16 in dtypes and is_interpreted(kernel)


def dot_config(kernel: object, dtype: torch.dtype) -> dict[str, object]:
    """The PRECISION / EMULATE_BF16 constexprs of an attention kernel over `dtype` data."""
    return {
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "EMULATE_BF16": emulate_bf16(kernel, dtype),
    }
