"""Kernel timings against the ceilings measured in the same run: device copy bandwidth
and the matmul rate; decode attention in GB/s, prefill attention in TFLOP/s."""

from __future__ import annotations

import os
import time

import torch
from kernel_metrics import causal_attention_flops
from kernel_plan import Plan, Timer
from llmservice.kernels import triton_decode
from llmservice.kernels.random_batch import make_paged_batch


def copy_bandwidth_gbps(plan: Plan, device: torch.device, timer: Timer) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(plan.copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer.ms(lambda: dst.copy_(src))
    return 2 * plan.copy_bytes / (ms * 1e-3) / 1e9


def matmul_tflops(plan: Plan, device: torch.device, timer: Timer) -> float:
    n = plan.matmul_n
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = timer.ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3) / 1e12


class DecodePool:
    """One randomly filled pool big enough for the largest decode case; each case draws
    a random (shuffled) set of its blocks, like a long-running server's allocator."""

    def __init__(self, plan: Plan, device: torch.device):
        s = plan.shape
        self.shape = s
        per_token = 2 * s.num_kv_heads * s.head_dim * s.dtype.itemsize
        blocks = max(
            b * -(-c // s.block_size) for b in plan.decode_batches for c in plan.decode_contexts
        )
        self.num_blocks = min(blocks, plan.max_kv_bytes // (per_token * s.block_size))
        shape = (self.num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
        self.k = torch.empty(shape, device=device, dtype=s.dtype).normal_()
        self.v = torch.empty(shape, device=device, dtype=s.dtype).normal_()
        self.device = device
        self.per_token = per_token

    def fits(self, batch: int, context: int) -> bool:
        return batch * -(-context // self.shape.block_size) <= self.num_blocks

    def case(self, batch: int, context: int):
        s = self.shape
        nb = -(-context // s.block_size)
        perm = torch.randperm(self.num_blocks, device=self.device)[: batch * nb]
        tables = perm.view(batch, nb).to(torch.int32)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=self.device)
        q = torch.randn(batch, s.num_heads, s.head_dim, device=self.device).to(s.dtype)
        return q, tables, seq_lens


def bench_decode(
    plan: Plan, device: torch.device, timer: Timer, deadline: float
) -> tuple[list, list, list]:
    s = plan.shape
    pool = DecodePool(plan, device)
    rows, tuning, ablation = [], [], []
    for batch in plan.decode_batches:
        for context in plan.decode_contexts:
            if not pool.fits(batch, context):
                rows.append({"batch": batch, "context": context, "skipped": "exceeds KV budget"})
                continue
            if time.monotonic() > deadline:
                rows.append({"batch": batch, "context": context, "skipped": "time budget"})
                continue
            q, tables, seq_lens = pool.case(batch, context)
            out = torch.empty_like(q)
            splits = triton_decode.choose_num_splits(
                batch, s.num_kv_heads, context, _num_sms(device)
            )
            ws = triton_decode.decode_workspace(batch, s.num_heads, s.head_dim, splits, device)

            def run(q=q, tables=tables, seq_lens=seq_lens, out=out, ws=ws, splits=splits):
                triton_decode.paged_decode_attention(
                    q, pool.k, pool.v, tables, seq_lens, s.head_dim**-0.5,
                    num_splits=splits, out=out, workspace=ws,
                )  # fmt: skip

            ms = timer.ms(run)
            moved = batch * context * pool.per_token + 2 * q.numel() * q.element_size()
            rows.append(
                {
                    "batch": batch,
                    "context": context,
                    "num_splits": splits,
                    "ms": ms,
                    "GBps": moved / (ms * 1e-3) / 1e9,
                }
            )

    probe_b, probe_c = _probe_case(plan)
    if pool.fits(probe_b, probe_c):
        q, tables, seq_lens = pool.case(probe_b, probe_c)
        out = torch.empty_like(q)
        moved = probe_b * probe_c * pool.per_token
        for warps, stages in plan.tuning:
            ms = timer.ms(
                lambda w=warps, st=stages: triton_decode.paged_decode_attention(
                    q,
                    pool.k,
                    pool.v,
                    tables,
                    seq_lens,
                    s.head_dim**-0.5,
                    max_seq_len=probe_c,
                    out=out,
                    num_warps=w,
                    num_stages=st,
                )  # fmt: skip
            )
            tuning.append(
                {
                    "batch": probe_b,
                    "context": probe_c,
                    "num_warps": warps,
                    "num_stages": stages,
                    "ms": ms,
                    "GBps": moved / (ms * 1e-3) / 1e9,
                }
            )

    long_c = max(plan.decode_contexts)
    if pool.fits(1, long_c):
        q, tables, seq_lens = pool.case(1, long_c)
        out = torch.empty_like(q)
        auto = triton_decode.choose_num_splits(1, s.num_kv_heads, long_c, _num_sms(device))
        for splits in sorted({1, auto}):
            ms = timer.ms(
                lambda sp=splits: triton_decode.paged_decode_attention(
                    q, pool.k, pool.v, tables, seq_lens, s.head_dim**-0.5, num_splits=sp, out=out
                )
            )
            ablation.append(
                {
                    "batch": 1,
                    "context": long_c,
                    "num_splits": splits,
                    "ms": ms,
                    "GBps": long_c * pool.per_token / (ms * 1e-3) / 1e9,
                }
            )
    return rows, tuning, ablation


def _probe_case(plan: Plan) -> tuple[int, int]:
    batches = [b for b in plan.decode_batches if b >= 32] or plan.decode_batches
    contexts = [c for c in plan.decode_contexts if c >= 4096] or plan.decode_contexts
    return batches[min(1, len(batches) - 1)], contexts[min(1, len(contexts) - 1)]


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def bench_prefill(plan: Plan, device: torch.device, timer: Timer, deadline: float) -> list[dict]:
    from llmservice.kernels import ops

    s = plan.shape
    rows = []
    for name, seqs in plan.prefill_cases:
        if time.monotonic() > deadline:
            rows.append({"case": name, "skipped": "time budget"})
            continue
        batch = make_paged_batch(
            seqs, num_kv_heads=s.num_kv_heads, group=s.group, head_dim=s.head_dim,
            block_size=s.block_size, dtype=s.dtype, device=device, seed=3, spare_blocks=0,
        )  # fmt: skip
        os.environ["LLMSERVICE_KERNELS"] = "triton"
        try:
            ms = timer.ms(
                lambda b=batch: ops.paged_attention(b.q, b.k_cache, b.v_cache, b.meta, b.scale)
            )
        finally:
            os.environ.pop("LLMSERVICE_KERNELS", None)
        flops = causal_attention_flops(seqs, s.num_heads, s.head_dim)
        rows.append(
            {
                "case": name,
                "tokens": sum(q for q, _ in seqs),
                "ms": ms,
                "TFLOPs": flops / (ms * 1e-3) / 1e12,
            }
        )
        del batch
    return rows
