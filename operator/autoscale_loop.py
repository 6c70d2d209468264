"""The autoscaling loop: scrape each LLMService's pods, decide, write `/scale` and status.

It runs as one asyncio task per operator process, started by a `@kopf.on.startup`
handler and cancelled by `@kopf.on.cleanup`; it reads kopf's in-memory indexes (the
LLMServices, and the IP / port / readiness of their pods) every half second and
evaluates each LLMService with `autoscaling.enabled` once per its `intervalSeconds`.
Why not a kopf timer or daemon on LLMService: both are per-object handlers, and kopf
adds a finalizer to every object that has one, so deleting an LLMService would wait for
the operator (and hang if it is down). The status publisher is event-driven for the
same reason (docs/operator.md).

Per evaluation: fetch every Ready pod's /metrics concurrently (scrape.py), turn counters
into rates, call `autoscaler.decide` (pure), then
- write `spec.replicas` through the scale subresource when the decision differs (the
  reconciler makes the Deployment follow) and post an `Autoscaled` Event with the reason;
- hand `status.signals`, `desiredReplicas`, `lastScaleTime`, `lastScaleReason` and the
  `ScalingActive` condition to the status publisher, which writes them together with
  its own fields (one writer per object; a merge patch replaces the conditions list).
With `autoscaling.enabled: false` nothing here reads or writes `/scale`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from llmservice.operator import autoscale_zero as zero
from llmservice.operator import telemetry as tm
from llmservice.operator.advisor import loop_hook
from llmservice.operator.advisor.service_advice import ServiceAdvisor
from llmservice.operator.advisor.service_advice import enabled as advisor_enabled
from llmservice.operator.api_key import read_api_key
from llmservice.operator.autoscaler import (
    AutoscalingPolicy,
    Decision,
    History,
    Observation,
    PodMetrics,
    decide,
)
from llmservice.operator.kube import Kube, path_for
from llmservice.operator.pod_sleep import SLEEP_LEVEL, sleep_pods
from llmservice.operator.publish import Observed, StatusPublisher
from llmservice.operator.scrape import PodTarget, PreemptionRates, scrape_pods
from llmservice.operator.spec import API_VERSION, KIND, PLURAL, LLMServiceSpec

log = logging.getLogger(__name__)

Key = tuple[str, str]
SCALING_ACTIVE = "ScalingActive"
DISABLED = "AutoscalingDisabled"
DISABLED_MESSAGE = (
    "autoscaling.enabled is false: spec.replicas belongs to kubectl scale, an HPA or KEDA"
)
COMPONENT = "llmservice-operator"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def scrape_timeout(policy: AutoscalingPolicy) -> float:
    """Short, and inside the interval: half of it, between 1 s and 2 s (a loaded node can
    take several hundred ms to answer a local /metrics; a timeout is a skipped pod)."""
    return min(2.0, max(1.0, policy.interval_seconds / 2))


def signals_status(decision: Decision, obs: Observation, scraped: list[PodMetrics]) -> dict:
    """`status.signals`: totals for the printer columns, and each signal's answer."""
    out: dict[str, Any] = {
        "pods": {
            "ready": obs.ready_pods,
            "scraped": len(obs.scraped),
            "starting": obs.pending_pods,
        },
        "perSignal": {
            s.name: {
                "current": round(s.current, 3),
                "target": s.target,
                "desiredReplicas": s.desired,
            }
            for s in decision.signals
        },
    }
    if decision.recommendation is not None:
        out["recommendation"] = decision.recommendation
    kv = [m.kv_cache_usage for m in scraped if m.kv_cache_usage is not None]
    if kv:
        mean = sum(kv) / len(kv)
        out["kvCacheUsage"] = round(mean, 3)
        out["kvCacheUsagePercent"] = round(mean * 100)
    rates = [m.preemptions_per_minute for m in scraped if m.preemptions_per_minute is not None]
    if rates:
        out["preemptionsPerMinute"] = round(sum(rates), 1)
    waiting = [m.waiting_requests for m in scraped if m.waiting_requests is not None]
    if waiting:
        out["waitingRequests"] = round(sum(waiting), 1)
    return out


def condition(status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": SCALING_ACTIVE, "status": status, "reason": reason, "message": message[:1024]}


def _disabled_conditions(body: dict[str, Any]) -> list[dict[str, str]]:
    """Autoscaling off: ScalingActive says so if it was ever on; never created otherwise."""
    conditions = (body.get("status") or {}).get("conditions") or []
    if any(c.get("type") == SCALING_ACTIVE for c in conditions):
        return [condition("False", DISABLED, DISABLED_MESSAGE)]
    return []


def event_manifest(body: dict[str, Any], type_: str, reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Event about an LLMService (what `kubectl describe` lists)."""
    meta, stamp = body["metadata"], utc_now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


@dataclass
class _State:
    """What the loop remembers about one LLMService between evaluations."""

    history: History = field(default_factory=History)
    rates: PreemptionRates = field(default_factory=PreemptionRates)
    next_due: float = 0.0
    busy: bool = False
    active: bool | None = None
    warned: bool = False  # a ScalingInactive Warning is standing
    last_scale_time: str | None = None
    last_scale_reason: str | None = None
    advisor: ServiceAdvisor = field(default_factory=ServiceAdvisor)
    idle: zero.Idleness | None = None  # the scale-to-zero clock (autoscale_zero.py)


@dataclass(frozen=True)
class Sources:
    """Where the loop looks (kopf's live indexes, wrapped as plain callables)."""

    services: Callable[[], Iterable[tuple[Key, dict[str, Any]]]]
    targets: Callable[[Key], list[PodTarget]]
    observe: Callable[[Key], Observed | None]


class AutoscaleLoop:
    def __init__(
        self,
        kube: Callable[[], Kube],
        publisher: StatusPublisher,
        *,
        clock: Callable[[], float] = time.monotonic,
        period: float = 0.5,
        settle_seconds: float = 2.0,
    ) -> None:
        self._kube = kube
        self._publisher = publisher
        self._clock = clock
        self._period = period
        self._settle = settle_seconds  # let kopf's indexes fill before the first judgement
        self._states: dict[Key, _State] = {}
        self._advice_only: dict[Key, _State] = {}  # autoscaling off, advisor on
        self._tasks: set[asyncio.Task[None]] = set()
        self.last_pass: float | None = None
        self.task: asyncio.Task[None] | None = None

    def health(self) -> dict[str, Any]:
        """For kopf's /healthz probe: fails (500) if the loop died or stopped passing."""
        if self.task is not None and self.task.done():
            raise RuntimeError(f"the autoscaling loop stopped: {self.task!r}")
        age = None if self.last_pass is None else round(self._clock() - self.last_pass, 1)
        if age is not None and age > 60:
            raise RuntimeError(f"the autoscaling loop has not run for {age}s")
        return {"services": len(self._states), "lastPassSecondsAgo": age}

    async def run(self, sources: Sources) -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per scrape
        await asyncio.sleep(self._settle)
        async with httpx.AsyncClient(trust_env=False) as client:
            try:
                while True:
                    self._pass(sources, client)
                    self.last_pass = self._clock()
                    await asyncio.sleep(self._period)
            finally:
                for task in list(self._tasks):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def _pass(self, sources: Sources, client: httpx.AsyncClient) -> None:
        now = self._clock()
        seen: set[Key] = set()
        for key, body in sources.services():
            seen.add(key)
            policy = AutoscalingPolicy.from_dict((body.get("spec") or {}).get("autoscaling"))
            if not policy.enabled:
                self._disabled(key, body, sources)
                self._advise_only(key, body, policy, sources, client, now)
                continue
            self._advice_only.pop(key, None)
            state = self._states.setdefault(key, _State())
            if state.busy or now < state.next_due:
                continue
            state.busy = True
            # Keep the cadence (no drift), but never try to catch up on missed ticks.
            state.next_due += policy.interval_seconds
            if state.next_due <= now:
                state.next_due = now + policy.interval_seconds
            self._spawn(
                self._safely(
                    "autoscaling",
                    key,
                    state,
                    functools.partial(self.evaluate, key, body, policy, state, sources, client),
                    count_tick=True,
                )
            )
        for key in [k for k in self._states if k not in seen]:
            del self._states[key]  # deleted: the publisher forgets it in the delete handler
        for key in [k for k in self._advice_only if k not in seen]:
            del self._advice_only[key]

    def _disabled(self, key: Key, body: dict[str, Any], sources: Sources) -> None:
        """Switched off (or never on): say so once if ScalingActive is still there."""
        state = self._states.pop(key, None)
        conditions = (body.get("status") or {}).get("conditions") or []
        stale = any(
            c.get("type") == SCALING_ACTIVE and c.get("reason") != DISABLED for c in conditions
        )
        if state is None and not stale:
            return
        self._spawn(
            self._publish(
                key,
                body,
                sources,
                {"signals": None, "desiredReplicas": None},
                [condition("False", DISABLED, DISABLED_MESSAGE)],
            )
        )

    def _advise_only(
        self,
        key: Key,
        body: dict[str, Any],
        policy: AutoscalingPolicy,
        sources: Sources,
        client: httpx.AsyncClient,
        now: float,
    ) -> None:
        """Autoscaling off: still scrape once per interval for the advisor (default on)."""
        if not advisor_enabled(body.get("spec")):
            if self._advice_only.pop(key, None) is not None:
                self._spawn(
                    self._publish(
                        key,
                        body,
                        sources,
                        {"signals": None, "desiredReplicas": None, "advice": None},
                        _disabled_conditions(body),
                    )
                )
            return
        state = self._advice_only.setdefault(key, _State())
        if state.busy or now < state.next_due:
            return
        state.busy = True
        state.next_due = now + policy.interval_seconds
        self._spawn(
            self._safely(
                "advising",
                key,
                state,
                functools.partial(self._advise, key, body, policy, state, sources, client),
            )
        )

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _publish(
        self,
        key: Key,
        body: dict[str, Any],
        sources: Sources,
        fields: dict[str, Any],
        conditions: list[dict[str, str]],
    ) -> Coroutine[Any, Any, None]:
        """Hand our fields to the publisher now (its one writer per object); the returned
        coroutine publishes them (awaited, or spawned as a task)."""
        self._publisher.set_extra(key, fields, conditions)
        return asyncio.to_thread(
            self._publisher.publish, key, lambda: sources.observe(key), self._emitter(body)
        )

    async def _safely(
        self,
        what: str,
        key: Key,
        state: _State,
        work: Callable[[], Awaitable[object]],
        *,
        count_tick: bool = False,
    ) -> None:
        """Run one pass for one LLMService: a failure is a log line, retried next interval."""
        started = self._clock()
        try:
            await work()
        except Exception:
            log.exception("%s %s/%s failed; retrying next interval", what, *key)
        finally:
            state.busy = False
            if count_tick:
                tm.TICKS.labels(*key).inc()
                tm.TICK_SECONDS.observe(self._clock() - started)

    async def _advise(
        self,
        key: Key,
        body: dict[str, Any],
        policy: AutoscalingPolicy,
        state: _State,
        sources: Sources,
        client: httpx.AsyncClient,
    ) -> None:
        """Autoscaling off, advisor on: scrape, run the rules, publish the advice alone."""
        ready = [p for p in sources.targets(key) if p.ready and p.ip and not p.terminating]
        results = await scrape_pods(client, ready, scrape_timeout(policy))
        fields, events = loop_hook.advise(state.advisor, body, results, self._clock())
        for type_, message in events:
            await self._event(body, type_, loop_hook.EVENT_REASON, message)
        await self._publish(
            key,
            body,
            sources,
            {"signals": None, "desiredReplicas": None, **fields},
            _disabled_conditions(body),
        )

    async def evaluate(
        self,
        key: Key,
        body: dict[str, Any],
        policy: AutoscalingPolicy,
        state: _State,
        sources: Sources,
        client: httpx.AsyncClient,
    ) -> Decision | None:
        """One evaluation of one LLMService; None if it is gone."""
        namespace, name = key
        pods = [p for p in sources.targets(key) if not p.terminating]
        ready = [p for p in pods if p.ready and p.ip]
        results = await scrape_pods(client, ready, scrape_timeout(policy))
        scraped_at = self._clock()
        scraped: list[PodMetrics] = []
        failures: list[str] = []
        for result in results:
            tm.SCRAPES.labels(*key).inc()
            if result.sample is None:
                tm.SCRAPE_ERRORS.labels(*key).inc()
                failures.append(result.error or result.target.name)
                continue
            sample = result.sample
            rate = state.rates.update(result.target.uid, sample.preemptions_total, scraped_at)
            scraped.append(PodMetrics(sample.kv_cache_usage, sample.waiting_requests, rate))
        state.rates.forget_except(p.uid for p in pods)

        scale_path = path_for(API_VERSION, PLURAL, namespace, name) + "/scale"
        scale = await asyncio.to_thread(self._kube().get, scale_path)
        if scale is None:
            return None
        current = int((scale.get("spec") or {}).get("replicas", 0))
        observation = Observation(
            current_replicas=current,
            ready_pods=len(ready),
            pending_pods=len(pods) - len(ready),
            scraped=tuple(scraped),
            scrape_failures=tuple(failures),
        )
        decision = decide(policy, observation, state.history, scraped_at)
        state.history = decision.history
        activity = [
            zero.PodActivity(r.target.uid, r.sample.running_requests, r.sample.waiting_requests,
                             r.sample.requests_total)
            for r in results if r.sample is not None
        ]  # fmt: skip
        state.idle = zero.observe(state.idle, activity, current, scraped_at, utc_now(), len(ready))
        decision = zero.apply(policy, observation, state.idle, decision, scraped_at)
        sleep_levels = {r.target.uid: r.sample.sleep_level for r in results if r.sample is not None}
        to_sleep = zero.pods_to_sleep(policy, observation, state.idle, scraped_at, sleep_levels)
        if to_sleep:
            sleep_levels = await self._sleep(body, [r.target for r in results if r.target.uid in to_sleep],
                                             sleep_levels, now=scraped_at, idle=state.idle, policy=policy)

        if decision.replicas != current:
            await asyncio.to_thread(
                self._kube().merge_patch, scale_path, {"spec": {"replicas": decision.replicas}}
            )
            state.last_scale_time, state.last_scale_reason = utc_now(), decision.reason
            direction = "up" if decision.replicas > current else "down"
            log.info(
                "%s/%s: %d -> %d replicas: %s",
                namespace,
                name,
                current,
                decision.replicas,
                decision.reason,
            )
            await self._event(
                body,
                "Normal",
                "Autoscaled",
                f"Scaled from {current} to {decision.replicas} replicas: {decision.reason}",
            )
        else:
            direction = "none" if decision.recommendation is not None else "held"
        tm.DECISIONS.labels(namespace, name, direction).inc()
        tm.DESIRED_REPLICAS.labels(*key).set(decision.replicas)

        if state.active and not decision.active:  # not at creation: no pod is Ready yet then
            await self._event(body, "Warning", "ScalingInactive", decision.active_message)
            state.warned = True
        elif decision.active and state.warned:
            await self._event(body, "Normal", "ScalingActive", decision.active_message)
            state.warned = False
        state.active = decision.active

        fields: dict[str, Any] = {
            "signals": signals_status(decision, observation, scraped),
            "desiredReplicas": decision.replicas,
        }
        if state.last_scale_time:
            fields["lastScaleTime"] = state.last_scale_time
            fields["lastScaleReason"] = state.last_scale_reason
        if state.idle.last_request_time:
            fields["lastRequestTime"] = state.idle.last_request_time
        advice, advice_events = loop_hook.advise(state.advisor, body, results, scraped_at)
        fields.update(advice)
        for type_, message in advice_events:
            await self._event(body, type_, loop_hook.EVENT_REASON, message)
        status = "True" if decision.active else "False"
        conditions = [condition(status, decision.active_reason, decision.active_message)]
        to_zero = zero.condition(
            policy, decision.replicas, state.idle, scraped_at, zero.all_asleep(sleep_levels)
        )
        if to_zero is not None:
            conditions.append(to_zero)
        await self._publish(key, body, sources, fields, conditions)
        return decision

    async def _sleep(
        self,
        body: dict[str, Any],
        targets: list[PodTarget],
        levels: dict[str, float | None],
        now: float,
        idle: zero.Idleness,
        policy: AutoscalingPolicy,
    ) -> dict[str, float | None]:
        """scaleToZero sleep: put the idle pods to sleep; the sleep levels after it."""
        namespace = body["metadata"]["namespace"]
        api_key = None
        ref = LLMServiceSpec.from_dict(body.get("spec") or {}).engine.api_key_secret
        try:
            if ref is not None:
                api_key = await asyncio.to_thread(read_api_key, self._kube(), namespace, ref)
        except ValueError as exc:
            slept, problems = [], [f"cannot put pods to sleep: {exc}"]
        else:
            async with httpx.AsyncClient(trust_env=False) as client:
                problems = await sleep_pods(client, targets, api_key)
            failed = {line.partition(":")[0] for line in problems}
            slept = [t for t in targets if t.name not in failed]
        if slept:
            await self._event(
                body, "Normal", "Slept",
                f"Put {len(slept)} pod(s) to sleep after no request for {now - idle.last_activity:.0f}s "
                f"(scaleToZero sleep, scaleToZeroAfterSeconds {policy.scale_to_zero_after_seconds:g}): "
                "KV cache freed, weights in host memory; the router wakes a pod for the next request",
            )  # fmt: skip
        for line in problems:
            await self._event(body, "Warning", "SleepFailed", line)
        return {**levels, **{t.uid: float(SLEEP_LEVEL) for t in slept}}

    def _emitter(self, body: dict[str, Any]) -> Callable[[str, str, str], None]:
        """Post Events straight to the API: kopf.event() needs a per-object handler's context.

        Also handed to the publisher, which may emit other loops' condition changes
        (Ready, Degraded, ...) when our publish request is the one that runs.
        """

        def emit(type_: str, reason: str, message: str) -> None:
            manifest = event_manifest(body, type_, reason, message)
            path = path_for("v1", "events", body["metadata"]["namespace"])
            try:
                self._kube().request("POST", path, body=manifest)
            except Exception as exc:  # an Event is worth a log line, not a failed decision
                log.warning("could not post the %s Event: %s", reason, exc)

        return emit

    async def _event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await asyncio.to_thread(self._emitter(body), type_, reason, message)
