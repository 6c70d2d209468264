"""Seed mistake 1 (block size): short answers, fixed KV memory; block 32 vs 16 vs 8.

Measures the number of concurrently running requests while the KV pool (not demand or
max_num_seqs) is the limit -- time-weighted over the steps that left requests waiting --
and throughput, for the seed's case (answers 15-20 tokens) and its rule (5-10 tokens). Our allocator is lazy (a request holds
ceil(tokens / block_size) blocks, never a worst-case reservation), so the only waste
a block size causes is the unfilled tail of each request's last block.
    .venv/bin/python bench/seed_block_size.py [--requests 96] [--kv-tokens 2048]
"""

from __future__ import annotations

import argparse
import random

import common
from block_size_estimate import lazy_allocation_estimate

WORKLOADS = {
    # the seed's case: an e-commerce bot, 90% of answers 15-20 tokens, short user turns
    "answers_15_20": {"prompt_tokens": (4, 12), "answer_tokens": (15, 20), "long_tail": (21, 60)},
    # the seed's rule: "short answers (5-10 tokens) with block 32 waste 60-80% of memory"
    "answers_5_10": {"prompt_tokens": (3, 6), "answer_tokens": (5, 10), "long_tail": (11, 20)},
}


def make_work(spec: dict, n: int, rng: random.Random) -> list[tuple[list[int], int]]:
    """90% of answers in the main range, 10% in the long tail."""
    work = []
    for _ in range(n):
        prompt = [rng.randrange(200, 40000) for _ in range(rng.randint(*spec["prompt_tokens"]))]
        answer = rng.randint(*spec["answer_tokens"]) if rng.random() < 0.9 else rng.randint(*spec["long_tail"])
        work.append((prompt, answer))
    return work


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--kv-tokens", type=int, default=1024, help="KV pool size in tokens, the same for every block size")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads)
    results: dict = {}
    for name, spec in WORKLOADS.items():
        work = make_work(spec, args.requests, random.Random(0))
        res: dict = {}
        for bs in (32, 16, 8):
            eng = common.engine(block_size=bs, num_gpu_blocks_override=args.kv_tokens // bs, max_model_len=512,
                                max_num_seqs=256, enable_prefix_caching=False)
            trace = common.drive(eng, [(0.0, p, common.greedy(o)) for p, o in work])
            r = res[f"block_{bs}"] = {**common.summary(trace), "preemptions": eng.scheduler.stats.num_preemptions,
                                      "lazy_allocation_estimate": lazy_allocation_estimate(work, bs, args.kv_tokens)}
            print(f"{name} block {bs:>3}: concurrent while KV-bound {r['saturated_mean_running']:.1f} "
                  f"(lazy-allocation estimate {r['lazy_allocation_estimate']:.1f}, max {r['max_running']}), "
                  f"{r['output_tok_per_s']:.1f} tok/s, {r['preemptions']} preemptions")
        b32, b16 = res["block_32"], res["block_16"]
        res["concurrency_gain_16_vs_32"] = b16["saturated_mean_running"] / b32["saturated_mean_running"] - 1
        res["estimate_gain_16_vs_32"] = b16["lazy_allocation_estimate"] / b32["lazy_allocation_estimate"] - 1
        res["peak_concurrency_gain_16_vs_32"] = b16["max_running"] / b32["max_running"] - 1
        res["throughput_gain_16_vs_32"] = b16["output_tok_per_s"] / b32["output_tok_per_s"] - 1
        res["workload"] = {"requests": args.requests, **spec, "kv_pool_tokens": args.kv_tokens}
        results[name] = res
    common.write("seed_block_size", results)
    panels = {}
    for name, res in results.items():
        if name not in WORKLOADS:
            continue
        blocks = {k: v for k, v in res.items() if k.startswith("block_")}
        panels[f"{name}: running while KV-bound"] = {k: v["saturated_mean_running"] for k, v in blocks.items()}
        panels[f"{name}: output tok/s"] = {k: v["output_tok_per_s"] for k, v in blocks.items()}
    common.bar_plot("seed_block_size", "Block size, short answers, fixed KV memory", panels)


if __name__ == "__main__":
    main()
