"""Seed 004 (chunked prefill): requests decoding while long prompts arrive.

p50 / p99 inter-token latency of the decoding requests with chunked prefill off vs on.
    .venv/bin/python bench/seed_chunked_prefill.py [--long-prompt 3000] [--chunk 64]
"""

from __future__ import annotations

import argparse
import random

import common
from llmservice.server.loadgen.stats import percentile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--long-prompt", type=int, default=3000)
    ap.add_argument("--long-requests", type=int, default=2)
    ap.add_argument("--decoders", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=120)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads)
    rng = random.Random(0)
    decoders = [[rng.randrange(200, 40000) for _ in range(16)] for _ in range(args.decoders)]
    longs = [[rng.randrange(200, 40000) for _ in range(args.long_prompt)] for _ in range(args.long_requests)]
    results = {}
    for chunked in (False, True):
        budget = args.chunk if chunked else args.long_prompt + args.decoders + 64
        eng = common.engine(enable_chunked_prefill=chunked, max_num_batched_tokens=budget, enable_prefix_caching=False,
                            max_model_len=args.long_prompt + args.decoders + 64)
        schedule = [(0.0, p, common.greedy(args.decode_tokens)) for p in decoders]
        schedule += [(0.5 + 1.0 * i, p, common.greedy(4)) for i, p in enumerate(longs)]
        trace = common.drive(eng, schedule)
        decoder_ids = [f"r{i}" for i in range(args.decoders)]
        itl = [b - a for r in decoder_ids for a, b in zip(trace.token_times[r], trace.token_times[r][1:], strict=False)]
        key = "chunked_on" if chunked else "chunked_off"
        results[key] = {
            "max_num_batched_tokens": budget,
            "decoder_itl_p50_s": percentile(itl, 50),
            "decoder_itl_p99_s": percentile(itl, 99),
            "decoder_itl_max_s": max(itl),
            "p99_over_p50": percentile(itl, 99) / percentile(itl, 50),
            "run": common.summary(trace),
        }
        r = results[key]
        print(f"{key}: ITL p50 {r['decoder_itl_p50_s'] * 1000:.0f} ms, p99 {r['decoder_itl_p99_s'] * 1000:.0f} ms, "
              f"max {r['decoder_itl_max_s'] * 1000:.0f} ms, p99/p50 {r['p99_over_p50']:.1f}")
    results["workload"] = {"decoders": args.decoders, "decode_tokens": args.decode_tokens,
                           "long_prompts": args.long_requests, "long_prompt_tokens": args.long_prompt}
    common.write("seed_chunked_prefill", results)
    common.bar_plot("seed_chunked_prefill", "Decode ITL while long prompts arrive", {
        "ITL p50 (ms)": {k: results[k]["decoder_itl_p50_s"] * 1000 for k in ("chunked_off", "chunked_on")},
        "ITL p99 (ms)": {k: results[k]["decoder_itl_p99_s"] * 1000 for k in ("chunked_off", "chunked_on")},
        "p99 / p50": {k: results[k]["p99_over_p50"] for k in ("chunked_off", "chunked_on")},
    })


if __name__ == "__main__":
    main()
