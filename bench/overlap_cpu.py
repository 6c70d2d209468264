"""Does overlapped scheduling pay on this CPU? Offline generate, --async-scheduling on vs
off (and the static decode inputs), alternating order, the same greedy workload; prints
output tok/s per run and the on/off ratio of the medians. It decides the CPU default
(overlap.resolve_async_scheduling; docs/engine.md has the figures).

    python bench/overlap_cpu.py --requests 16 --output 32 --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import common
import torch

MODES = {
    "off": dict(async_scheduling=False),
    "on": dict(async_scheduling=True),
    "on_static": dict(async_scheduling=True, static_decode_inputs=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    common.add_model_args(ap)
    args = ap.parse_args()
    common.setup(args.threads, args)
    rng = random.Random(0)
    prompts = [[rng.randrange(200, 40000) for _ in range(rng.randint(16, 96))] for _ in range(args.requests)]
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.repeats):
        order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
        for mode in order:
            eng = common.engine(max_model_len=512, max_step_ms=0, num_threads=args.threads, **MODES[mode])
            t0 = time.perf_counter()
            outs = eng.generate(prompts, common.greedy(args.output))
            dt = time.perf_counter() - t0
            rates[mode].append(sum(len(o.token_ids) for o in outs) / dt)
            print(f"{mode}: {rates[mode][-1]:.1f} tok/s", flush=True)
    med = {m: statistics.median(r) for m, r in rates.items()}
    print(json.dumps({"threads": torch.get_num_threads(), "tok_per_s": rates, "median": med,
                      "ratio_on_off": med["on"] / med["off"], "ratio_on_static_off": med["on_static"] / med["off"]}))  # fmt: skip


if __name__ == "__main__":
    main()
