"""Seed mistake 4 (max_model_len vs batched tokens): the same KV memory at max_model_len
8192 vs 2048, with and without chunked prefill: concurrency and throughput.

Our scheduler allocates KV lazily, so max_model_len reserves nothing per request; it
sets the admission limit, the memory plan's 'concurrent sequences at full length', and,
without chunked prefill, a step budget of at least max_model_len tokens.
    .venv/bin/python bench/seed_max_model_len.py [--requests 48]
"""

from __future__ import annotations

import argparse
import random

import common


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--kv-gib", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads)
    rng = random.Random(0)
    work = [([rng.randrange(200, 40000) for _ in range(rng.randint(32, 256))], rng.randint(16, 64)) for _ in range(args.requests)]
    results = {}
    for mml in (8192, 2048):
        for chunked in (False, True):
            eng = common.engine(max_model_len=mml, kv_cache_memory_gib=args.kv_gib, enable_chunked_prefill=chunked,
                                max_num_batched_tokens=512 if chunked else mml, max_num_seqs=256, enable_prefix_caching=False)
            trace = common.drive(eng, [(0.0, p, common.greedy(o)) for p, o in work])
            key = f"mml_{mml}_{'chunked' if chunked else 'whole'}"
            results[key] = {**common.summary(trace), "plan_max_concurrent_at_max_len": eng.memory_plan.max_concurrent_at_max_len,
                            "num_blocks": eng.memory_plan.num_blocks}
            print(f"{key}: plan says {eng.memory_plan.max_concurrent_at_max_len} seqs at full length; ran {trace.max_running} "
                  f"concurrently; {results[key]['output_tok_per_s']:.1f} tok/s")
    results["workload"] = {"requests": args.requests, "prompt_tokens": "32-256", "output_tokens": "16-64", "kv_gib": args.kv_gib}
    common.write("seed_max_model_len", results)
    keys = [k for k in results if k.startswith("mml_")]
    common.bar_plot("seed_max_model_len", "max_model_len 8192 vs 2048, same KV memory", {
        "plan: seqs at full length": {k[4:]: results[k]["plan_max_concurrent_at_max_len"] for k in keys},
        "measured max concurrent": {k[4:]: results[k]["max_running"] for k in keys},
        "output tok/s": {k[4:]: results[k]["output_tok_per_s"] for k in keys},
    })


if __name__ == "__main__":
    main()
