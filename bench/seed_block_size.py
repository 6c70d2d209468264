"""Seed mistake 1 (block size): short answers, fixed KV memory; block 32 vs 16 vs 8.

Measures the time-averaged number of concurrently running requests and throughput when the KV
pool (not max_num_seqs) is the limit. Our allocator is lazy (a request holds
ceil(tokens / block_size) blocks, never a worst-case reservation), so the only waste
a block size causes is the unfilled tail of each request's last block.
    .venv/bin/python bench/seed_block_size.py [--requests 96] [--kv-tokens 2048]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--kv-tokens", type=int, default=1024, help="KV pool size in tokens, the same for every block size")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads)
    rng = random.Random(0)
    # e-commerce bot (seed): 90% of answers 15-20 tokens; short user turns
    work = [([rng.randrange(200, 40000) for _ in range(rng.randint(4, 12))],
             rng.randint(15, 20) if rng.random() < 0.9 else rng.randint(21, 60)) for _ in range(args.requests)]
    results = {}
    for bs in (32, 16, 8):
        eng = common.engine(block_size=bs, num_gpu_blocks_override=args.kv_tokens // bs, max_model_len=512,
                            max_num_seqs=256, enable_prefix_caching=False)
        trace = common.drive(eng, [(0.0, p, common.greedy(o)) for p, o in work])
        results[f"block_{bs}"] = common.summary(trace)
        r = results[f"block_{bs}"]
        print(f"block {bs:>3}: mean concurrent {r['mean_running']:.1f} (max {r['max_running']}), {r['output_tok_per_s']:.1f} tok/s")
    b32, b16 = results["block_32"], results["block_16"]
    results["concurrency_gain_16_vs_32"] = b16["mean_running"] / b32["mean_running"] - 1
    results["throughput_gain_16_vs_32"] = b16["output_tok_per_s"] / b32["output_tok_per_s"] - 1
    results["workload"] = {"requests": args.requests, "prompt_tokens": "4-12", "answer_tokens": "90% 15-20, 10% 21-60",
                           "kv_pool_tokens": args.kv_tokens}
    common.write("seed_block_size", results)
    common.bar_plot("seed_block_size", "Block size, short answers, fixed KV memory", {
        "mean concurrent requests": {k: v["mean_running"] for k, v in results.items() if k.startswith("block_")},
        "output tok/s": {k: v["output_tok_per_s"] for k, v in results.items() if k.startswith("block_")},
    })


if __name__ == "__main__":
    main()
