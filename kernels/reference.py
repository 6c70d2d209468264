"""Float64 references for every hot-path kernel, written for clarity, not speed.

Tests compare both the Triton kernels and the torch path against these. Each one is a
direct transcription of the maths (explicit per-sequence loops, no fused tricks) so a
reader can check it by eye; float64 makes its own rounding negligible next to the
tolerances under test (1e-4 relative for fp32, 1e-2 for fp16/bf16).
"""

import torch


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def gather_sequence(cache: torch.Tensor, block_table: list[int], length: int) -> torch.Tensor:
    """Token rows [length, Hkv, D] of one sequence, read token by token via its block table."""
    block_size = cache.shape[1]
    rows = [cache[block_table[p // block_size], p % block_size] for p in range(length)]
    return torch.stack(rows) if rows else cache.new_zeros((0, *cache.shape[2:]))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Causal attention of a flat batch q [T, Hq, D] over paged K/V, in float64.

    Sequence i owns query_lens[i] consecutive rows of q; its context has seq_lens[i]
    tokens, the last query_lens[i] of which are the new ones, so new token j sits at
    position seq_lens[i] - query_lens[i] + j and sees positions 0..that.
    """
    q64, k64, v64 = _f64(q), _f64(k_cache), _f64(v_cache)
    tables = block_tables.tolist()
    hq, hkv = q.shape[1], k_cache.shape[2]
    group = hq // hkv
    out = torch.empty_like(q64)
    start = 0
    for i, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        k = gather_sequence(k64, tables[i], slen).repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = gather_sequence(v64, tables[i], slen).repeat_interleave(group, dim=1)
        qi = q64[start : start + qlen]  # [qlen, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        pos_q = torch.arange(slen - qlen, slen)[:, None]
        visible = torch.arange(slen)[None, :] <= pos_q  # [qlen, L]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start : start + qlen] = torch.einsum("hqk,khd->qhd", probs, v)
        start += qlen
    return out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches after writing token t into slot slot_mapping[t] (negative: skipped)."""
    k_out, v_out = _f64(k_cache).clone(), _f64(v_cache).clone()
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_out[slot // block_size, slot % block_size] = _f64(key[t])
        v_out[slot // block_size, slot % block_size] = _f64(value[t])
    return k_out, v_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = _f64(x)
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * _f64(weight)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), the pair the fused kernel must produce."""
    summed = _f64(x) + _f64(residual)
    return rms_norm(summed, weight, eps), summed


def rotary_embedding(
    positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor
) -> torch.Tensor:
    """Rotate-half (NeoX / HF Llama) rotary of x [T, H, D] at the given positions."""
    x64 = _f64(x)
    half = x.shape[-1] // 2
    cs = _f64(cos_sin_cache)[positions.cpu().long()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x64[..., :half], x64[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def lora_add(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scalings: torch.Tensor,
    row_slots: list[int],
    widths: tuple[int, ...],
    out: torch.Tensor,
) -> torch.Tensor:
    """`out` after adding each row's LoRA delta, the contract of triton_lora.add_lora: a
    row of slot s >= 0 gets scalings[s] * x @ A_m[s]^T @ B_m[s]^T in module m's columns,
    where A_m is rows m*R..(m+1)*R of a [slots, n*R, in] and B_m columns of b [slots,
    sum(widths), R] starting at the module's offset; slot -1 rows are unchanged."""
    result = _f64(out).clone()
    rank = b.shape[2]
    for row, slot in enumerate(row_slots):
        if slot < 0:
            continue
        col = 0
        for m, width in enumerate(widths):
            a_m = _f64(a[slot, m * rank : (m + 1) * rank])
            b_m = _f64(b[slot, col : col + width])
            result[row, col : col + width] += float(scalings[slot]) * (b_m @ (a_m @ _f64(x[row])))
            col += width
    return result


def moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The mixture-of-experts MLP [T, H] in float64: out[t] = sum_k topk_weights[t, k] *
    w2[e] @ (silu(gate) * up), gate / up = the first / last I rows of w13[e] times x[t],
    e = topk_ids[t, k]; one expert at a time over the pairs routed to it."""
    x64, w13_64, w2_64 = _f64(x), _f64(w13), _f64(w2)
    weights, ids = _f64(topk_weights), topk_ids.detach().cpu().long()
    inter = w13.shape[1] // 2
    out = torch.zeros_like(x64)
    for e in range(w13.shape[0]):
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        rows = x64[tokens]
        gate = rows @ w13_64[e, :inter].T
        up = rows @ w13_64[e, inter:].T
        down = (torch.nn.functional.silu(gate) * up) @ w2_64[e].T
        out.index_add_(0, tokens, down * weights[tokens, slots][:, None])
    return out


def rotary_cos_sin_cache(max_positions: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The [max_positions, head_dim] cat(cos, sin) table the rotary op expects, in float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


# max|out - ref| / max|ref| allowed per dtype (fp32 <= 1e-4, fp16/bf16 <= 1e-2)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst absolute error over the largest reference magnitude; any NaN counts as inf.

    Normalising by the largest magnitude, not elementwise, because attention outputs
    have entries near zero whose elementwise relative error means nothing.
    """
    out64, ref64 = _f64(out), _f64(ref)
    if out64.shape != ref64.shape:
        raise ValueError(f"shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}")
    if torch.isnan(out64).any():
        return float("inf")
    return float((out64 - ref64).abs().max() / ref64.abs().max().clamp_min(1e-30))


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = relative_error(out, ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.3e} > {TOLERANCE[dtype]:.0e} ({dtype})"
