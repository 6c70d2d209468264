"""What the kernel benchmark runs (the GPU plan and the CPU smoke plan) and how it times."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


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
