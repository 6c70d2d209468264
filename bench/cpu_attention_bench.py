"""The CPU decode attention kernel (kernels/cpu_attention.c) against the one at `--old-rev`.

For decode batches (one row per sequence) and speculative verifications (k+1 rows of
one sequence) at the embedded model's shape (9 query heads, 3 KV heads, head dim 64,
block 16): microseconds per call of each kernel, through the same Python wrapper,
interleaved rep by rep (cpu_quant_bench.time_interleaved), medians; and the largest
difference between their outputs. JSON: bench/results/cpu_attention.json.

    .venv/bin/python bench/cpu_attention_bench.py [--threads 1 2]
"""

from __future__ import annotations

import argparse
import ctypes
import os

import common
import torch
from cpu_quant_bench import library_at, time_interleaved
from llmservice.kernels import cpu_attention

HQ, HKV, D, BLOCK = 9, 3, 64, 16
CASES = [  # (rows, context of the last row, what it is)
    (1, 150, "decode batch 1"),
    (1, 450, "decode batch 1"),
    (5, 450, "verification k=4"),
    (8, 150, "decode batch 8"),
    (32, 150, "decode batch 32"),
]


def old_attention(rev: str):
    """qa_decode compiled from kernels/cpu_attention.c at `rev` (same compiler and flags)."""
    lib = library_at(rev, "cpu_attention")
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.qa_decode.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float, p, i32]
    lib.qa_decode.restype = i32

    def run(q, k_cache, v_cache, tables, lens, scale):
        out = torch.empty_like(q)
        lib.qa_decode(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                      tables.stride(0), lens.data_ptr(), q.shape[0], HQ, HKV, D, BLOCK, scale,
                      out.data_ptr(), torch.get_num_threads())  # fmt: skip
        return out

    return run


def batch(rows: int, context: int, verification: bool, seed: int):
    """q, pools, tables and lengths: a verification's rows share one sequence's table and
    see one more position each; a decode batch's rows are sequences of their own."""
    g = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK)
    seqs = 1 if verification else rows
    k = torch.randn(seqs * per_seq, BLOCK, HKV, D, generator=g)
    v = torch.randn(seqs * per_seq, BLOCK, HKV, D, generator=g)
    q = torch.randn(rows, HQ, D, generator=g)
    if verification:
        tables = torch.arange(per_seq, dtype=torch.int32).repeat(rows, 1)
        lens = torch.arange(context - rows + 1, context + 1, dtype=torch.int32)
    else:
        tables = torch.randperm(seqs * per_seq, generator=g).to(torch.int32).view(rows, per_seq)
        lens = torch.full((rows,), context, dtype=torch.int32)
    return q, k, v, tables.contiguous(), lens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100, help="calls per rep")
    ap.add_argument("--old-rev", default="7f52da2")
    args = ap.parse_args()
    old = old_attention(args.old_rev)
    rows_out = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows, context, what in CASES:
            q, k, v, tables, lens = batch(rows, context, what.startswith("verification"), seed=rows)
            scale = D**-0.5
            new_out = cpu_attention.paged_decode_attention(q, k, v, tables, lens, scale)
            diff = (new_out - old(q, k, v, tables, lens, scale)).abs().max().item()
            call = (q, k, v, tables, lens, scale)
            impls = {
                "old": lambda i, call=call: old(*call),
                "new": lambda i, call=call: cpu_attention.paged_decode_attention(*call),
            }
            ms = time_interleaved(impls, args.calls, args.reps)
            row = {"threads": threads, "rows": rows, "context": context, "what": what,
                   "us_old": ms["old"] * 1e3, "us_new": ms["new"] * 1e3,
                   "speedup": ms["old"] / ms["new"], "max_abs_diff": diff,
                   "load_average": os.getloadavg()[0]}  # fmt: skip
            rows_out.append(row)
            print(f"threads {threads} {what:17s} rows {rows:2d} ctx {context}: old {row['us_old']:7.1f} us, "
                  f"new {row['us_new']:7.1f} us, x{row['speedup']:.2f}, max diff {diff:.1e}", flush=True)  # fmt: skip
    common.write("cpu_attention", {"shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "block": BLOCK},
                                   "old_rev": args.old_rev, "rows": rows_out})  # fmt: skip


if __name__ == "__main__":
    main()
