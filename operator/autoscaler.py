"""How many replicas an LLMService should have, from its pods' engine metrics. Pure.

Three signals, each answering "how many replicas would bring me to my target":

    desired_i = ceil(N x current_i / target_i)

with N the Ready pods and current_i the mean over the pods that could be scraped (a pod
whose scrape failed is assumed to carry the average load, so one broken endpoint neither
stops scaling nor halves the estimate):

- KV cache usage (0..1) against `kvCacheUsageTarget`;
- waiting requests per replica against `waitingRequestsPerReplica`;
- preemptions per minute per replica against `preemptionsPerMinutePerReplica` — the
  signal no peer uses, and the one that says the KV cache is too small for the load
  (a full cache alone is normal for a busy vLLM-style engine).

An answer within ±10% of the current `spec.replicas` keeps it. The recommendation is the
largest answer, clamped to [minReplicas, maxReplicas]. Scaling up goes straight to the
recommendation (KubeAI #229: one pod at a time took hours). Scaling down happens only
when every recommendation over the last `scaleDownStabilizationSeconds` was below the
current count — to the highest of them, and by at most half per step (oscillating load
cannot flap). Pods that are Pending or still starting are capacity already requested:
`spec.replicas` counts them, so they cause no extra scale-up; they are never scraped,
and on the way down each is assumed to run at the target (as the HPA does with pods
that have no metrics), so they never look idle. With no pod scraped the last decision
is held.

Everything here is a function of its arguments (time included), so the decision table
in tests/unit/operator/test_autoscaler*.py covers it without a cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 0.1  # a signal within ±10% of its target asks for no change

# ScalingActive condition reasons
METRICS_AVAILABLE = "MetricsAvailable"
NO_READY_PODS = "NoReadyPods"
NO_METRICS = "NoMetrics"


@dataclass(frozen=True)
class AutoscalingPolicy:
    """`spec.autoscaling`, with the CRD's defaults (a unit test keeps them equal)."""

    enabled: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    preemptions_per_minute_per_replica: float = 5.0
    kv_cache_usage_target: float = 0.8
    waiting_requests_per_replica: float = 5.0
    scale_up_stabilization_seconds: float = 0.0
    scale_down_stabilization_seconds: float = 300.0
    interval_seconds: float = 15.0
    scale_to_zero_after_seconds: float = 600.0  # with min_replicas 0 (autoscale_zero.py)
    scale_to_zero: str = "delete"  # or "sleep": idle pods sleep instead of going away

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AutoscalingPolicy:
        data = data or {}
        d = cls()

        def get(key: str, default: Any) -> Any:
            value = data.get(key)
            return default if value is None else value

        return cls(
            enabled=bool(get("enabled", d.enabled)),
            min_replicas=int(get("minReplicas", d.min_replicas)),
            max_replicas=int(get("maxReplicas", d.max_replicas)),
            preemptions_per_minute_per_replica=float(
                get("preemptionsPerMinutePerReplica", d.preemptions_per_minute_per_replica)
            ),
            kv_cache_usage_target=float(get("kvCacheUsageTarget", d.kv_cache_usage_target)),
            waiting_requests_per_replica=float(
                get("waitingRequestsPerReplica", d.waiting_requests_per_replica)
            ),
            scale_up_stabilization_seconds=float(
                get("scaleUpStabilizationSeconds", d.scale_up_stabilization_seconds)
            ),
            scale_down_stabilization_seconds=float(
                get("scaleDownStabilizationSeconds", d.scale_down_stabilization_seconds)
            ),
            interval_seconds=float(get("intervalSeconds", d.interval_seconds)),
            scale_to_zero_after_seconds=float(
                get("scaleToZeroAfterSeconds", d.scale_to_zero_after_seconds)
            ),
            scale_to_zero=str(get("scaleToZero", d.scale_to_zero)),
        )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class PodMetrics:
    """What one scraped pod reported; None where the pod did not say (yet)."""

    kv_cache_usage: float | None = None
    waiting_requests: float | None = None
    preemptions_per_minute: float | None = None  # None until the second scrape of a pod


@dataclass(frozen=True)
class Observation:
    """One tick's view of an LLMService."""

    current_replicas: int  # spec.replicas: what was already asked for (pending pods included)
    ready_pods: int  # Ready and not terminating: the pods that carry the load
    pending_pods: int = 0  # exist but not Ready yet (unscheduled, pulling, loading weights)
    scraped: tuple[PodMetrics, ...] = ()  # successful scrapes of Ready pods
    scrape_failures: tuple[str, ...] = ()  # "pod-a: timed out" for Ready pods that failed


@dataclass(frozen=True)
class History:
    """Past recommendations, for the stabilization windows.

    `since` is when this operator started recommending for the object: a window is only
    trusted once it is fully covered (after a restart nothing scales down for a window).
    """

    since: float | None = None
    entries: tuple[tuple[float, int], ...] = ()  # (time, recommendation)


@dataclass(frozen=True)
class Signal:
    """One signal's answer, as it goes into status.signals."""

    name: str  # "preemptions" | "kvCacheUsage" | "waitingRequests"
    current: float  # mean per Ready pod over the scraped pods
    target: float
    desired: int

    def describe(self, replicas: int) -> str:
        """'preemptions 12.0/min/replica > 5 → 3 replicas'."""
        ratio = self.current / self.target
        sign = ">" if ratio > 1 + TOLERANCE else "<" if ratio < 1 - TOLERANCE else "≈"
        return f"{LABELS[self.name](self.current)} {sign} {self.target:g} → {_replicas(replicas)}"


LABELS = {
    "preemptions": lambda v: f"preemptions {v:.1f}/min/replica",
    "kvCacheUsage": lambda v: f"KV cache usage {v:.2f}",
    "waitingRequests": lambda v: f"waiting requests {v:.1f}/replica",
}


@dataclass(frozen=True)
class Decision:
    replicas: int  # what spec.replicas should be now
    recommendation: int | None  # this tick's clamped answer; None when held for lack of metrics
    signals: tuple[Signal, ...]
    reason: str  # why `replicas` (the Event and lastScaleReason when it changed)
    active: bool  # ScalingActive
    active_reason: str
    active_message: str
    history: History = field(default_factory=History)

    @property
    def winner(self) -> Signal | None:
        return max(self.signals, key=lambda s: s.desired) if self.signals else None


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _ceil(x: float) -> int:
    """ceil() that ignores float noise: 3 x 0.4 / 0.4 must be 3, not 4."""
    return math.ceil(x - 1e-9)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _answer(obs: Observation, need: float) -> int:
    """Replicas for one signal, given `need` = N x current / target (replicas' worth of load).

    Compared with spec.replicas, which already counts the pods still starting: within ±10%
    of it, keep it; above, exactly what the load needs (no extra for pods on their way);
    below, the starting pods are assumed to be at the target (never idle), so they are
    only given up when the Ready pods' load alone says so.
    """
    current = obs.current_replicas
    if current > 0 and abs(need / current - 1) <= TOLERANCE:
        return current
    if need > current:
        return _ceil(need)
    return min(current, _ceil(need + obs.pending_pods))


def signal_answers(policy: AutoscalingPolicy, obs: Observation) -> tuple[Signal, ...]:
    """Each signal's desired replica count; a signal no scraped pod reports is left out."""
    scraped = obs.scraped
    series = (
        ("preemptions", [m.preemptions_per_minute for m in scraped],
         policy.preemptions_per_minute_per_replica),
        ("kvCacheUsage", [m.kv_cache_usage for m in scraped], policy.kv_cache_usage_target),
        ("waitingRequests", [m.waiting_requests for m in scraped],
         policy.waiting_requests_per_replica),
    )  # fmt: skip
    answers = []
    for name, raw, target in series:
        values = [v for v in raw if v is not None]
        if not values:
            continue
        current = _mean(values)
        desired = _answer(obs, obs.ready_pods * current / target)
        answers.append(Signal(name, current, target, desired))
    return tuple(answers)


def _held(
    policy: AutoscalingPolicy, obs: Observation, history: History, reason: str, message: str
) -> Decision:
    replicas = policy.clamp(obs.current_replicas)
    why = f"holding {_replicas(obs.current_replicas)}: {message}"
    if replicas != obs.current_replicas:
        bounds = f"[{policy.min_replicas}, {policy.max_replicas}]"
        why = f"spec.replicas {obs.current_replicas} is outside {bounds} → {_replicas(replicas)}"
    return Decision(replicas, None, (), why, False, reason, message, history)


def _window(history: History, now: float, seconds: float) -> list[int] | None:
    """Recommendations within the last `seconds`, or None if the window is not covered yet."""
    if history.since is None or now - history.since < seconds:
        return None
    return [r for t, r in history.entries if now - t <= seconds]


def _stabilize(
    policy: AutoscalingPolicy, current: int, recommendation: int, history: History, now: float
) -> tuple[int, str]:
    """Apply the windows and the halving rule: (replicas, why they differ from the answer)."""
    if not policy.min_replicas <= current <= policy.max_replicas:
        bounded = policy.clamp(current)  # the bounds changed: follow them at once
        return (
            bounded,
            f"spec.replicas {current} is outside [{policy.min_replicas}, {policy.max_replicas}]",
        )
    if recommendation > current:
        if policy.scale_up_stabilization_seconds <= 0:
            return recommendation, ""
        window = _window(history, now, policy.scale_up_stabilization_seconds)
        if window is None or min(window) <= current:
            return current, (
                f"scale-up waits until every recommendation of the last "
                f"{policy.scale_up_stabilization_seconds:g}s is higher"
            )
        lowest = min(window)
        note = f"the lowest recommendation of the last {policy.scale_up_stabilization_seconds:g}s"
        return lowest, note if lowest != recommendation else ""
    if recommendation < current:
        window = _window(history, now, policy.scale_down_stabilization_seconds)
        if window is None or max(window) >= current:
            return current, (
                f"scale-down waits until every recommendation of the last "
                f"{policy.scale_down_stabilization_seconds:g}s is lower"
            )
        highest, floor = max(window), _ceil(current / 2)
        if highest < floor:
            return floor, "at most half per step"
        note = (
            f"the highest recommendation of the last {policy.scale_down_stabilization_seconds:g}s"
        )
        return highest, note if highest != recommendation else ""
    return current, ""


def decide(policy: AutoscalingPolicy, obs: Observation, history: History, now: float) -> Decision:
    """This tick's decision for one LLMService (`now` in seconds, any monotonic clock)."""
    if obs.ready_pods == 0:
        pending = f" ({obs.pending_pods} starting)" if obs.pending_pods else ""
        return _held(
            policy, obs, history, NO_READY_PODS, f"no Ready pod to read metrics from{pending}"
        )
    if not obs.scraped:
        failures = "; ".join(obs.scrape_failures) or "no pod was scraped"
        return _held(
            policy, obs, history, NO_METRICS, f"no Ready pod's /metrics could be read: {failures}"
        )
    signals = signal_answers(policy, obs)
    if not signals:
        return _held(
            policy, obs, history, NO_METRICS,
            "the scraped /metrics have none of vllm:kv_cache_usage_perc, "
            "vllm:num_requests_waiting, vllm:num_preemptions_total",
        )  # fmt: skip
    raw = max(s.desired for s in signals)
    recommendation = policy.clamp(raw)
    keep = max(policy.scale_up_stabilization_seconds, policy.scale_down_stabilization_seconds)
    history = History(
        since=history.since if history.since is not None else now,
        entries=tuple((t, r) for t, r in history.entries if now - t <= keep)
        + ((now, recommendation),),
    )
    replicas, note = _stabilize(policy, obs.current_replicas, recommendation, history, now)
    winner = max(signals, key=lambda s: s.desired)
    reason = winner.describe(raw)
    if recommendation != raw:
        bound = "maxReplicas" if raw > recommendation else "minReplicas"
        reason += f", limited to {bound} {recommendation}"
    if note:
        reason += f"; {note}: {replicas}"
    scraped = f"{len(obs.scraped)} of {obs.ready_pods} Ready pods scraped"
    if obs.pending_pods:
        scraped += f", {obs.pending_pods} starting"
    if obs.scrape_failures:
        scraped += f"; skipped {'; '.join(obs.scrape_failures)}"
    return Decision(
        replicas=replicas,
        recommendation=recommendation,
        signals=signals,
        reason=reason,
        active=True,
        active_reason=METRICS_AVAILABLE,
        active_message=f"{scraped}; recommending {recommendation} ({winner.name})",
        history=history,
    )
