"""Scale to zero: after `scaleToZeroAfterSeconds` without a request, 0 replicas, or with
`scaleToZero: sleep` every Ready pod put to sleep (pods kept, GPU memory freed). Pure.

Only with `minReplicas: 0` (the router then holds the next request and sets replicas
back to 1, see router/wake.py). A request is seen in the pods' own metrics: a pod
with requests running or waiting, or whose `vllm:request_success_total` grew since
its last scrape. The idle clock starts again when the operator starts watching (after
a restart nothing goes to zero for a whole window), when replicas leave 0 (a wake),
when the first pod becomes Ready, and at every request seen. It never scales to zero while a pod is starting or a Ready
pod could not be scraped: "no metrics" is not "no requests".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from llmservice.operator.autoscaler import AutoscalingPolicy, Decision, Observation

SCALED_TO_ZERO = "ScaledToZero"
DELETE, SLEEP = "delete", "sleep"  # spec.autoscaling.scaleToZero


@dataclass(frozen=True)
class PodActivity:
    uid: str
    running: float | None
    waiting: float | None
    requests_total: float | None  # vllm:request_success_total, summed


@dataclass(frozen=True)
class Idleness:
    last_activity: float  # monotonic seconds
    replicas: int  # spec.replicas at the last look
    ready: int = 0  # Ready pods at the last look
    totals: dict[str, float] = field(default_factory=dict)  # pod uid -> request counter
    last_request_time: str | None = None  # wall clock, for status.lastRequestTime


def observe(
    idle: Idleness | None,
    pods: Iterable[PodActivity],
    current: int,
    now: float,
    wall: str,
    ready: int = 0,
) -> Idleness:
    """The idle clock after one scrape (`ready`: the Ready pods now)."""
    pods = list(pods)
    totals = {p.uid: p.requests_total for p in pods if p.requests_total is not None}
    if idle is None:
        return Idleness(now, current, ready, totals)
    busy = any((p.running or 0) > 0 or (p.waiting or 0) > 0 for p in pods) or any(
        uid in idle.totals and total != idle.totals[uid] for uid, total in totals.items()
    )
    # A wake, or a first pod just Ready (it could not have had a request yet).
    fresh = (idle.replicas == 0 and current > 0) or (idle.ready == 0 and ready > 0)
    last = now if busy or fresh or current == 0 else idle.last_activity
    return Idleness(last, current, ready, totals, wall if busy else idle.last_request_time)


def zero_due(policy: AutoscalingPolicy, obs: Observation, idle: Idleness, now: float) -> bool:
    return (
        policy.enabled
        and policy.min_replicas == 0
        and obs.current_replicas > 0
        and obs.ready_pods > 0
        and obs.pending_pods == 0
        and not obs.scrape_failures
        and now - idle.last_activity >= policy.scale_to_zero_after_seconds
    )


def apply(
    policy: AutoscalingPolicy, obs: Observation, idle: Idleness, decision: Decision, now: float
) -> Decision:
    """The decision, or 0 replicas when the idle window has passed (scaleToZero delete)."""
    if policy.scale_to_zero == SLEEP or not zero_due(policy, obs, idle, now):
        return decision
    idle_for = now - idle.last_activity
    reason = (
        f"no request for {idle_for:.0f}s (scaleToZeroAfterSeconds {policy.scale_to_zero_after_seconds:g})"
        " → 0 replicas; the router holds the next request and scales back from zero"
    )
    return replace(decision, replicas=0, reason=reason)


def pods_to_sleep(
    policy: AutoscalingPolicy, obs: Observation, idle: Idleness, now: float,
    sleep_levels: Mapping[str, float | None],
) -> tuple[str, ...]:
    """With scaleToZero sleep, once the idle window has passed: the Ready pods (uid ->
    llmservice:engine_sleep_level) still awake. A pod that does not report the level is
    not the bundled server and is left alone."""
    if policy.scale_to_zero != SLEEP or not zero_due(policy, obs, idle, now):
        return ()
    return tuple(sorted(uid for uid, level in sleep_levels.items() if level == 0))


def all_asleep(sleep_levels: Mapping[str, float | None]) -> bool:
    return bool(sleep_levels) and all((level or 0) > 0 for level in sleep_levels.values())


def condition(
    policy: AutoscalingPolicy, replicas: int, idle: Idleness, now: float, asleep: bool = False
) -> dict[str, str] | None:
    """The ScaledToZero condition, for objects that may scale to zero only (`asleep`: every
    Ready pod sleeps)."""
    if not (policy.enabled and policy.min_replicas == 0):
        return None
    if policy.scale_to_zero == SLEEP and asleep:
        return {
            "type": SCALED_TO_ZERO, "status": "True", "reason": "Asleep",
            "message": f"{replicas} pod(s) asleep after no request for "
            f"{policy.scale_to_zero_after_seconds:g}s (scaleToZero sleep): KV cache freed and "
            "weights in host memory; the router wakes a pod for the next request",
        }  # fmt: skip
    if replicas == 0:
        return {
            "type": SCALED_TO_ZERO, "status": "True", "reason": "Idle",
            "message": "0 replicas after no request for "
            f"{policy.scale_to_zero_after_seconds:g}s; the next request is held by the router "
            "and scales the service back from zero",
        }  # fmt: skip
    idle_for = max(0.0, now - idle.last_activity)
    return {
        "type": SCALED_TO_ZERO, "status": "False", "reason": "Serving",
        "message": f"{replicas} replica(s); idle for {idle_for:.0f}s of the "
        f"{policy.scale_to_zero_after_seconds:g}s (scaleToZeroAfterSeconds) before "
        + ("its pods sleep" if policy.scale_to_zero == SLEEP else "scaling to zero"),
    }  # fmt: skip
