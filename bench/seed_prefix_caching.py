"""Seed mistake 3 (prefix caching): a 1500-token shared system prompt + short user turns.

TTFT of the first vs later requests (sequential), and throughput of a concurrent batch,
with prefix caching off vs on.
    .venv/bin/python bench/seed_prefix_caching.py [--system-tokens 1500] [--batch 8]
"""

from __future__ import annotations

import argparse
import random
import statistics

import common


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--sequential", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads)
    rng = random.Random(0)
    system = [rng.randrange(200, 40000) for _ in range(args.system_tokens)]

    def turn():
        return system + [rng.randrange(200, 40000) for _ in range(rng.randint(8, 24))]

    results = {}
    for caching in (False, True):
        eng = common.engine(enable_prefix_caching=caching, max_num_batched_tokens=2048, kv_cache_memory_gib=1.0)
        ttfts = []
        for _ in range(args.sequential):
            trace = common.drive(eng, [(0.0, turn(), common.greedy(1))])
            ttfts.append(trace.ttft()[0])
        trace = common.drive(eng, [(0.0, turn(), common.greedy(16)) for _ in range(args.batch)])
        key = "caching_on" if caching else "caching_off"
        results[key] = {
            "ttft_first_s": ttfts[0],
            "ttft_later_mean_s": statistics.fmean(ttfts[1:]),
            "ttft_all_s": ttfts,
            "batch": common.summary(trace),
            "prefix_hit_rate": eng.scheduler.stats.prefix_hits / max(1, eng.scheduler.stats.prefix_queries),
        }
        print(f"{key}: TTFT first {ttfts[0] * 1000:.0f} ms, later {results[key]['ttft_later_mean_s'] * 1000:.0f} ms, "
              f"batch {results[key]['batch']['output_tok_per_s']:.1f} tok/s")
    on, off = results["caching_on"], results["caching_off"]
    results["ttft_speedup_later_vs_first_on"] = on["ttft_first_s"] / on["ttft_later_mean_s"]
    results["ttft_speedup_on_vs_off"] = off["ttft_later_mean_s"] / on["ttft_later_mean_s"]
    results["throughput_gain_on_vs_off"] = on["batch"]["output_tok_per_s"] / off["batch"]["output_tok_per_s"] - 1
    results["workload"] = {"system_prompt_tokens": args.system_tokens, "user_turn_tokens": "8-24",
                           "sequential_requests": args.sequential, "batch_requests": args.batch, "batch_output_tokens": 16}
    common.write("seed_prefix_caching", results)
    common.bar_plot("seed_prefix_caching", f"Prefix caching, {args.system_tokens}-token system prompt", {
        "TTFT later requests (ms)": {k: results[k]["ttft_later_mean_s"] * 1000 for k in ("caching_off", "caching_on")},
        "TTFT first request (ms)": {k: results[k]["ttft_first_s"] * 1000 for k in ("caching_off", "caching_on")},
        "batch output tok/s": {k: results[k]["batch"]["output_tok_per_s"] for k in ("caching_off", "caching_on")},
    })


if __name__ == "__main__":
    main()
