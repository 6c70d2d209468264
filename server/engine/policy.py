"""Scheduling policy as pure functions: who is admitted next, who is preempted.

fcfs: earliest arrival first; the preemption victim is the latest arrival.
priority (vLLM semantics): lower value first, arrival breaks ties; the victim is the
  highest value (latest arrival among equals). Aging prevents starvation: a waiting
  request's effective priority is `priority - aging_per_s * seconds_waited`. Since every
  waiting request ages at the same rate, this orders requests exactly as if a request of
  priority p had arrived p / aging_per_s seconds later than it did: at the default
  1.0/s a priority-10 request is served before every priority-0 request that arrived
  more than 10 s after it. Its wait is therefore bounded by 10 s plus the time to serve
  the higher-priority work that arrived in those 10 s, however long the stream lasts.
max_queue_delay_ms (a bound on queueing delay): a request that has waited longer than this is
  admitted before every request that has not, oldest first, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmservice.server.engine.request import Request
from llmservice.server.engine.swap_space import PreemptionCosts


def effective_priority(req: Request, now: float, aging_per_s: float) -> float:
    return req.priority - aging_per_s * max(0.0, now - req.arrival_time)


def admission_key(
    req: Request,
    now: float,
    policy: str,
    aging_per_s: float = 1.0,
    max_queue_delay_ms: float | None = None,
) -> tuple:
    """Sort key for waiting requests: smallest is admitted first."""
    if max_queue_delay_ms is not None and (now - req.arrival_time) * 1000.0 > max_queue_delay_ms:
        return (0, 0.0, req.arrival_time)
    if policy == "priority":
        return (1, effective_priority(req, now, aging_per_s), req.arrival_time)
    return (1, 0.0, req.arrival_time)


def next_to_admit(
    waiting: Iterable[Request],
    now: float,
    policy: str,
    aging_per_s: float = 1.0,
    max_queue_delay_ms: float | None = None,
) -> Request | None:
    return min(
        waiting,
        key=lambda r: admission_key(r, now, policy, aging_per_s, max_queue_delay_ms),
        default=None,
    )


def pick_victim(running: list[Request], policy: str) -> Request:
    """The running request to preempt when KV blocks run out."""
    if policy == "priority":
        return max(running, key=lambda r: (r.priority, r.arrival_time))
    return max(running, key=lambda r: r.arrival_time)


def choose_preemption(
    mode: str,
    num_computed_tokens: int,
    costs: PreemptionCosts,
    swap_blocks_needed: int,
    swap_blocks_free: int,
) -> str:
    """'swap' or 'recompute' for one victim.

    swap falls back to recompute when the CPU swap pool cannot hold the victim (or it has
    no KV yet). auto compares the costs measured at start-up (PreemptionCosts): the
    marginal prefill time of the victim's computed tokens vs a swap's fixed latency plus
    their KV bytes over the copy bandwidth, out and back in.
    """
    if mode == "recompute" or num_computed_tokens == 0 or swap_blocks_needed > swap_blocks_free:
        return "recompute"
    if mode == "swap":
        return "swap"
    return "swap" if costs.recompute_cost(num_computed_tokens) > costs.swap_cost(num_computed_tokens) else "recompute"
