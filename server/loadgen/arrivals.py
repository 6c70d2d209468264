"""Request arrival times as vLLM's benchmark draws them (pure).

Gaps follow gamma(shape=burstiness, scale=1/(rate*burstiness)): mean gap 1/rate at any
burstiness; burstiness 1 is a Poisson process, < 1 burstier, > 1 more regular. The
gaps are then rescaled so the whole schedule spans num_prompts/rate, so runs with
different seeds or burstiness offer the same average load. rate = inf sends all at once.
"""

from __future__ import annotations

import math
import random


def arrival_offsets(num: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request is sent (non-decreasing)."""
    if num <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * num
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"request rate ({rate}) and burstiness ({burstiness}) must be > 0")
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    offsets, t = [], 0.0
    for _ in range(num):
        t += rng.gammavariate(burstiness, theta)
        offsets.append(t)
    target = num / rate
    scale = target / offsets[-1] if offsets[-1] > 0 else 1.0
    return [o * scale for o in offsets]
