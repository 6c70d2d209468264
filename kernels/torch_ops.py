"""Fast torch implementations of the hot-path ops, used on CPU (and as the fallback).

Decode attention: on fp32 CPU pools the C kernel of cpu_attention.py reads K/V in place
through the block tables; otherwise batched matmuls over K/V gathered through them;
prefill chunks are one SDPA each (there are few per step). fp8 pools (kv_quant.py) are
dequantized as they are gathered, so they always take the gathering path. The causal rule for a
chunk: new token i of a sequence with context length L and q new tokens sits at
position L - q + i and sees positions 0..L - q + i.

A short chunk (at most SHORT_CHUNK_ROWS tokens: a speculative verification of k+1
positions, a small prefill chunk) goes to the decode kernel instead, each of its rows as
a decode of its own context length (L - q + i + 1): no gathered copy, one call with the
step's decodes, and each row computes exactly what a plain decode at that position
would, so speculation changes no logit.
"""

import torch
import torch.nn.functional as F
from llmservice.kernels import cpu_attention, cpu_fused, kv_quant
from llmservice.kernels.metadata import AttentionMetadata

SHORT_CHUNK_ROWS = 17  # 1 + the most speculative tokens a request verifies (spec_config.py)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new K/V rows [T, Hkv, D] into the paged pools [N, bs, Hkv, D] (quantized
    for fp8 pools)."""
    if kv_quant.is_quantized(k_cache):
        kv_quant.write(k_cache, key, slot_mapping)
        kv_quant.write(v_cache, value, slot_mapping)
        return
    if cpu_fused.cache_fits(key, value, k_cache, v_cache):
        cpu_fused.cache_write(key, value, k_cache, v_cache, slot_mapping)
        return
    num_blocks, block_size, hkv, d = k_cache.shape
    k_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, key)
    v_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, value)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Contiguous [length, Hkv, D] copy of one sequence's K or V in `dtype`."""
    block_size = cache.shape[1]
    nblocks = (length + block_size - 1) // block_size
    blocks = kv_quant.select_blocks(cache, block_table[:nblocks].long(), dtype)
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def _sdpa(q, k, v, scale, mask=None, is_causal=False):
    # q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D]; enable_gqa avoids materializing repeated K/V heads
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


DECODE_GROUP = 16  # sequences per length-sorted group in the CPU decode path


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens_host: list[int],
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: q [B, Hq, D] -> out [B, Hq, D].

    Sequences are sorted by length and handled in groups of DECODE_GROUP, each gathered
    only up to its own longest sequence: padding every sequence to the batch's longest
    context made the K/V gather (memory traffic) several times larger than the GEMMs.
    """
    bsz = q.shape[0]
    if bsz <= DECODE_GROUP:
        return _decode_group(q, k_cache, v_cache, block_tables[:bsz], seq_lens_host, scale)
    order = sorted(range(bsz), key=seq_lens_host.__getitem__)
    out = torch.empty_like(q)
    for start in range(0, bsz, DECODE_GROUP):
        rows = order[start : start + DECODE_GROUP]
        index = torch.tensor(rows, device=q.device)
        out[index] = _decode_group(
            q.index_select(0, index),
            k_cache,
            v_cache,
            block_tables.index_select(0, index),
            [seq_lens_host[r] for r in rows],
            scale,
        )
    return out


def _decode_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens_host: list[int],
    scale: float,
) -> torch.Tensor:
    """K/V are gathered once with a block-granular index_select (rows stay contiguous),
    then each KV head's query group runs two batched matmuls on strided views: no K/V
    repeated per query head and no transposed copies (~2x faster on CPU than advanced
    indexing plus a permuted matmul, ~5x faster than SDPA over repeated heads)."""
    bsz, hq, d = q.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    max_len = max(seq_lens_host)
    nblocks = (max_len + block_size - 1) // block_size
    width = nblocks * block_size
    flat_blocks = block_tables[:, :nblocks].reshape(-1).long()
    k = kv_quant.select_blocks(k_cache, flat_blocks, q.dtype).view(bsz, width, hkv * d)
    v = kv_quant.select_blocks(v_cache, flat_blocks, q.dtype).view(bsz, width, hkv * d)
    lens = torch.tensor(seq_lens_host, device=q.device)
    pad = (torch.arange(width, device=q.device)[None, :] >= lens[:, None])[:, None, :]  # [B, 1, W]
    out = torch.empty_like(q)
    for h in range(hkv):
        heads = slice(h * group, (h + 1) * group)
        dims = slice(h * d, (h + 1) * d)
        scores = (
            torch.bmm(q[:, heads, :], k[:, :, dims].transpose(1, 2)).float() * scale
        )  # [B, G, W]
        scores.masked_fill_(pad, float("-inf"))
        probs = scores.softmax(-1).to(v.dtype)
        out[:, heads, :] = torch.bmm(probs, v[:, :, dims])
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """One sequence's chunk of q_len new tokens q [q_len, Hq, D] over its paged context."""
    q_len = q.shape[0]
    k = gather_kv(k_cache, block_table, seq_len, q.dtype).transpose(0, 1).unsqueeze(0)
    v = gather_kv(v_cache, block_table, seq_len, q.dtype).transpose(0, 1).unsqueeze(0)
    qq = q.transpose(0, 1).unsqueeze(0)
    if q_len == seq_len:
        out = _sdpa(qq, k, v, scale, is_causal=True)
    else:
        pos_q = torch.arange(seq_len - q_len, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= pos_q[:, None]
        out = _sdpa(qq, k, v, scale, mask=mask[None, None])
    return out.squeeze(0).transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention for a mixed batch q [T, Hq, D] laid out as described by `meta`."""
    nd = meta.num_decodes
    native = cpu_attention.supports(q, k_cache)
    if native and nd == meta.num_seqs:  # a decode-only step: no copy into a second output
        rows = cpu_attention.DecodeRows.of_step(meta)  # once per step, for every layer
        return cpu_attention.decode(q, k_cache, v_cache, rows, scale)
    out = torch.empty_like(q)
    short, rows = _decode_rows_plan(meta) if native else ([], None)
    if rows is not None:  # reads the pool in place: no gather
        index, prepared = rows
        res = cpu_attention.decode(q.index_select(0, index), k_cache, v_cache, prepared, scale)
        out.index_copy_(0, index, res)
    elif nd:
        out[:nd] = paged_decode_attention(
            q[:nd], k_cache, v_cache, meta.block_tables, meta.seq_lens_host[:nd], scale
        )
    done = {i for i, _ in short}
    start = nd
    for i in range(nd, meta.num_seqs):
        qlen = meta.query_lens[i]
        if i not in done:
            out[start : start + qlen] = paged_prefill_attention(
                q[start : start + qlen],
                k_cache,
                v_cache,
                meta.block_tables[i],
                meta.seq_lens_host[i],
                scale,
            )
        start += qlen
    return out


def _short_chunks(meta: AttentionMetadata) -> list[tuple[int, int]]:
    """(sequence, first row) of the chunks the decode kernel takes row by row."""
    chunks, start = [], meta.num_decodes
    for i in range(meta.num_decodes, meta.num_seqs):
        qlen = meta.query_lens[i]
        if qlen <= SHORT_CHUNK_ROWS:
            chunks.append((i, start))
        start += qlen
    return chunks


def _decode_rows_plan(meta: AttentionMetadata) -> tuple[list[tuple[int, int]], tuple | None]:
    """The short chunks, and the decode kernel's (rows, block tables, lengths) for the
    decodes and every row of them (None: no such row). Built on the first layer and kept in
    `meta.derived` for the others: the same for every layer of the step."""
    plan = meta.derived.get("decode_rows")
    if plan is not None:
        return plan
    nd, short = meta.num_decodes, _short_chunks(meta)
    rows, tables, lens = [torch.arange(nd)], [meta.block_tables[:nd]], [meta.seq_lens[:nd]]
    for i, first in short:
        qlen, total = meta.query_lens[i], meta.seq_lens_host[i]
        rows.append(torch.arange(first, first + qlen))
        tables.append(meta.block_tables[i : i + 1].expand(qlen, -1))
        lens.append(torch.arange(total - qlen + 1, total + 1, dtype=meta.seq_lens.dtype))
    decode_rows = None
    if nd or short:
        index = torch.cat(rows)
        decode_rows = (index, cpu_attention.DecodeRows.of(torch.cat(tables), torch.cat(lens), len(index)))
    plan = meta.derived["decode_rows"] = (short, decode_rows)
    return plan


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if cpu_fused.supports(x, weight):
        return cpu_fused.rms_norm(x, weight, eps)
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x; return (rms_norm(residual), residual). Saves one pass over memory."""
    if cpu_fused.supports(x, residual, weight) and residual.is_contiguous():
        return cpu_fused.fused_add_rms_norm(x, residual, weight, eps)
    residual.add_(x)
    return rms_norm(residual, weight, eps), residual


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> None:
    """In-place NeoX-style (rotate-half, HF Llama) rotary on q [T, Hq, D] and k [T, Hkv, D].

    cos_sin_cache is [max_positions, D] = cat(cos, sin) over the D/2 frequencies.
    """
    if cpu_fused.supports(q, k, cos_sin_cache) and cpu_fused.rotary_fits(q, k):
        cpu_fused.rotary_embedding(positions, q, k, cos_sin_cache)
        return
    cs = cos_sin_cache.index_select(0, positions)
    half = cs.shape[-1] // 2
    cos = cs[:, None, :half].to(q.dtype)
    sin = cs[:, None, half:].to(q.dtype)
    for t in (q, k):
        x1 = t[..., :half].clone()
        x2 = t[..., half:]
        t[..., :half] = x1 * cos - x2 * sin
        t[..., half:] = x2 * cos + x1 * sin


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for the fused gate_up projection's output [..., 2n] -> [..., n]."""
    if cpu_fused.supports(gate_up):
        return cpu_fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
