"""Small pieces shared by the Triton kernels: matmul and rounding helpers, host configs.

Why the helpers exist: Triton 3.7's interpreter (TRITON_INTERPRET=1, how every kernel is
tested on CPU) mishandles bf16 twice. It stores bf16 as uint16 and its `tl.dot`
multiplies those raw integers, so a bf16 matmul returns garbage; and its fp32 -> bf16
cast truncates instead of rounding to nearest-even, doubling the rounding error of every
bf16 store. With the EMULATE_BF16 constexpr set (only ever under the interpreter with
bf16 data) the kernels widen bf16 dot operands to fp32 right after loading them (exact;
the dot then runs in fp32) and round fp32 -> bf16 with `round_bf16` before each store,
reproducing the GPU's rounding. Compiled kernels get EMULATE_BF16=False, so the
workaround is compiled out of them.

The workaround is written inline at each site behind `if EMULATE_BF16:` rather than in
jit helper functions the kernels always call: the interpreter re-patches triton.language
on every device-function call (~3 ms each), which made the interpreted engine step
several times slower.

fp32 dots ask for "ieee" precision so a GPU does not silently drop to TF32 (which would
break the 1e-4 fp32 tolerance); half-precision dots use the tensor cores as usual.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """fp32 x rounded to the nearest-even bf16 value, still as fp32 (so a cast is exact)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16
    return bits.to(tl.float32, bitcast=True)


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
    emulate = emulate_bf16(kernel, dtype)
    return {
        "PRECISION": "ieee" if dtype == torch.float32 or emulate else "tf32",
        "EMULATE_BF16": emulate,
    }
