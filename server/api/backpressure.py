"""Admission under load (pure): accept, 503 with Retry-After, or 400.

A bounded queue keeps the server's memory and every client's wait bounded: past
`--max-waiting-requests` new work is refused at once with 503 so that a load balancer
or client retries elsewhere, instead of piling up requests that would time out anyway.
One HTTP request that alone needs more engine requests than the bound (large `n`, many
prompts) could never be admitted, so it is a 400, not a 503.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    status: int  # 200 admit, 400 never admissible, 503 retry later
    message: str = ""
    retry_after_s: int = 0


def retry_after_seconds(waiting: int, running: int) -> int:
    """A rough wait hint: one second per batch of queued work ahead, within [1, 60]."""
    batches = waiting / max(running, 1)
    return max(1, min(60, math.ceil(batches)))


def admission_decision(waiting: int, new: int, limit: int | None, running: int = 0) -> Admission:
    if limit is None:
        return Admission(200)
    if new > limit:
        return Admission(
            400,
            f"this request needs {new} engine requests (n x prompts), more than "
            f"--max-waiting-requests {limit} allows; lower n or split the prompts",
        )
    if waiting + new > limit:
        return Admission(
            503,
            f"the server is overloaded: {waiting} requests are waiting (limit {limit}); retry later",
            retry_after_seconds(waiting, running),
        )
    return Admission(200)
