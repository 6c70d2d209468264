"""Seeded synthetic workloads shared by the benchmarks.

sharegpt_like: ShareGPT's conversation lengths are roughly log-normal (prompt median
around a few hundred tokens, answers a couple of hundred, long tails). This CPU runs a
135M model at a few hundred tokens/s, so the same shape is scaled down 4x: prompt
lengths ~ LogNormal(ln 64, 0.9) clipped to [4, 512], output lengths ~ LogNormal(ln 48,
0.8) clipped to [2, 256]. Token ids are drawn uniformly from the normal vocabulary
(ignore_eos makes the content irrelevant to the amount of work).
"""

from __future__ import annotations

import math
import random


def sharegpt_like(num_requests: int, seed: int = 0, vocab: tuple[int, int] = (200, 48000)) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        p = int(min(512, max(4, rng.lognormvariate(math.log(64), 0.9))))
        o = int(min(256, max(2, rng.lognormvariate(math.log(48), 0.8))))
        out.append(([rng.randrange(*vocab) for _ in range(p)], o))
    return out
