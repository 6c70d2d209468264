"""e4m3 (float8_e4m3fn) bytes <-> fp32 in Triton, with integer and float ops only.

The fp8 KV pools (kv_quant.py) reach the Triton kernels as uint8 views, and the kernels
decode and encode the bytes themselves instead of loading `tl.float8e4nv` and casting.
Triton 3.7's interpreter (TRITON_INTERPRET=1, how the kernels are tested on CPU) gets
those casts wrong: it reads the NaN bytes 0x7f/0xff as +-480, and its fp32 -> e4m3
rounding drops the carry when the mantissa rounds up into the next exponent (127.2
becomes 64, not 128). Integer ops mean the same thing to the interpreter and to a GPU,
so what the CPU tests check is what a GPU runs, and the bytes equal torch's
float8_e4m3fn conversions (tests/unit/kernels/test_triton_fp8.py checks every byte).

e4m3fn: sign, 4-bit exponent (bias 7), 3-bit mantissa; exponent 0 is subnormal
(m * 2**-9); no infinities; 0x7f and 0xff are NaN; the largest finite value is 448.
"""

import triton
import triton.language as tl
from llmservice.kernels.triton_common import round_bf16

E4M3_NAN = tl.constexpr(0x7F)
E4M3_MAX_BYTE = tl.constexpr(0x7E)  # 448
F32_448_BITS = tl.constexpr(0x43E00000)
F32_INF_BITS = tl.constexpr(0x7F800000)
EXP_BIAS_SHIFT = tl.constexpr(0x3C000000)  # (127 - 7) << 23: e4m3 exponent -> fp32 exponent
SUBNORMAL_UNIT = tl.constexpr(0.001953125)  # 2**-9: one mantissa step at exponent 0


@triton.jit
def e4m3_to_f32(byte):
    """uint8 e4m3 bytes -> their fp32 values (exact; NaN bytes -> NaN, 0x80 -> -0.0)."""
    bits = byte.to(tl.int32)
    mag = bits & 0x7F
    # a normal e4m3 (exponent e, mantissa m) is fp32 bits ((e + 120) << 23) | (m << 20)
    normal = ((mag << 20) + EXP_BIAS_SHIFT).to(tl.float32, bitcast=True)
    subnormal = (mag & 7).to(tl.float32) * SUBNORMAL_UNIT
    value = tl.where(mag < 8, subnormal, normal)
    value = tl.where(mag == E4M3_NAN, float("nan"), value)
    # the sign as a bit (negation is 0 - x here, which would turn 0x80 into +0.0)
    return (value.to(tl.int32, bitcast=True) | ((bits & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_e4m3(x):
    """fp32 -> uint8 e4m3 bytes: round to nearest even, |x| > 448 (and inf) saturated to
    +-448, NaN -> 0x7f/0xff. Equals torch's `x.clamp(-448, 448).to(float8_e4m3fn)`."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    abits = bits & 0x7FFFFFFF
    exp = abits >> 23
    # normal range (fp32 exponent >= 121, i.e. >= 2**-6): round the 23-bit mantissa to 3
    # bits, ties to even; a mantissa that rounds up carries into the exponent
    rounded = (abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20
    normal = rounded - 0x3C0  # EXP_BIAS_SHIFT >> 20
    # subnormal range: m = round(significand * 2**(exp - 141)), ties to even; the shift is
    # capped at 31 (no 32-bit shift is defined past that, and 24-bit significands give 0 there)
    significand = (abits & 0x7FFFFF) | 0x800000
    shift = tl.minimum(141 - exp, 31)
    shift = tl.maximum(shift, 1)  # lanes of the normal range: any valid shift, unused
    kept = significand >> shift
    rest = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    kept += ((rest > half) | ((rest == half) & ((kept & 1) == 1))).to(tl.int32)
    mag = tl.where(exp < 121, kept, normal)
    mag = tl.where(abits > F32_448_BITS, E4M3_MAX_BYTE, mag)
    mag = tl.where(abits > F32_INF_BITS, E4M3_NAN, mag)
    return (sign | mag).to(tl.uint8)


@triton.jit
def load_kv_tile(k_ptrs, v_ptrs, mask, k_scale, v_scale, q_ptr, KV_FP8: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """A K and a V tile as the attention dots read them. fp8 pools: e4m3 bytes times the
    pool's scale, rounded to q's dtype (what the torch path reads); else the pool's values."""
    if KV_FP8:
        k = e4m3_to_f32(tl.load(k_ptrs, mask=mask, other=0)) * k_scale
        v = e4m3_to_f32(tl.load(v_ptrs, mask=mask, other=0)) * v_scale
        if EMULATE_BF16:
            k = round_bf16(k)
            v = round_bf16(v)
        else:
            k = k.to(q_ptr.dtype.element_ty)
            v = v.to(q_ptr.dtype.element_ty)
    else:
        k = tl.load(k_ptrs, mask=mask, other=0.0)
        v = tl.load(v_ptrs, mask=mask, other=0.0)
        if EMULATE_BF16:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
    return k, v
