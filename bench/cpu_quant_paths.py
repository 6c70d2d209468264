"""Where the packed matmul's `direct` path should hand over to `tiled`.

For each thread count and activation-row count M: ms per Q4_1 matrix of the model's
gate_up shape (3072 x 576) for the 4-row direct kernel built from `--old-rev` (the kernel
before 8-row passes), today's `direct` and today's `tiled`, cycling through 56 matrices so
the weights come from memory, interleaved rep by rep (the order rotating); medians. Every path is checked to
give the old kernel's bits. JSON: bench/results/cpu_quant_paths.json.

    .venv/bin/python bench/cpu_quant_paths.py [--m 1 5 8 9 16] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import os

import common
import torch
from cpu_quant_bench import old_kernel, random_blocks, time_interleaved
from llmservice.kernels import cpu_quant
from llmservice.kernels.cpu_quant import Q4_1, Packed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 5, 6, 8, 9, 12, 16, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--old-rev", default="1f99969")
    args = ap.parse_args()
    n, k = 3072, 576
    packed = [Packed(Q4_1, random_blocks(Q4_1, n, k, seed=i), k) for i in range(56)]
    old = old_kernel(args.old_rev)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m in args.m:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            ref = old(x, packed[0])
            impls = {
                "old_direct": lambda i, x=x: old(x, packed[i]),
                "direct": lambda i, x=x: cpu_quant.matmul(x, packed[i], path="direct"),
                "tiled": lambda i, x=x: cpu_quant.matmul(x, packed[i], path="tiled"),
            }
            same = all(torch.equal(f(0), ref) for f in impls.values())
            ms = time_interleaved(impls, len(packed), args.reps)
            row = {"threads": threads, "m": m, "chosen": cpu_quant.choose_path(m),
                   **{f"ms_{name}": v for name, v in ms.items()}, "same_bits": same,
                   "load_average": os.getloadavg()[0]}  # fmt: skip
            rows.append(row)
            print(f"threads {threads} M {m:3d} ({row['chosen']:6s}): "
                  + "  ".join(f"{name} {v:.3f}" for name, v in ms.items())
                  + f" ms  bits {'same' if same else 'DIFFER'}", flush=True)  # fmt: skip
    common.write("cpu_quant_paths", {"shape": [n, k], "kind": "Q4_1", "rows": rows})


if __name__ == "__main__":
    main()
