"""Read the engine metrics of an LLMService's pods: fetch, parse, turn counters into rates.

Every Ready pod's `/metrics` is fetched concurrently with a short timeout, so one slow or
dead pod costs at most the timeout and never stalls the others (AIBrix #1032 fetched
one by one and stopped scaling when one pod failed). The text is parsed with
prometheus-client's own parser. KV usage is read from `vllm:kv_cache_usage_perc` or,
for older vLLM versions, `vllm:gpu_cache_usage_perc` (the rename silently broke AIBrix's
KV scaling, aibrix PR#2057). The preemption rate is the delta of the
`vllm:num_preemptions_total` counter between two scrapes of the same pod; a counter that
went down means the container restarted, and its new value is the increase since then
(Prometheus' `rate()` rule).

Parsing and rates are pure (`parse_metrics`, `PreemptionRates`); only `scrape_pods` does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmservice.pod_address import Rewrite, host_of

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # vLLM < 0.10
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
SLEEP_LEVEL = "llmservice:engine_sleep_level"  # 0 awake; the bundled server only (sleep mode)
SUCCESS = "vllm:request_success_total"  # requests finished: scale to zero's activity signal
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class PodTarget:
    """A pod of an LLMService, as the autoscaler sees it."""

    uid: str
    name: str
    ip: str | None
    port: int
    ready: bool
    terminating: bool
    oom_restarts: int = 0  # container restarts whose last termination was OOMKilled (the advisor)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}/metrics"

    @property
    def starting(self) -> bool:
        """Capacity already asked for: Pending, pulling, or loading its weights."""
        return not self.ready and not self.terminating


def pod_target(body: dict[str, Any], rewrite: Rewrite | None = None) -> PodTarget:
    """From a Pod object: its IP (rewritten by `rewrite`, see llmservice.pod_address), the
    container port named `http` (else the first), Ready."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    port = DEFAULT_PORT
    ports = [p for c in spec.get("containers") or [] for p in c.get("ports") or []]
    named = [p for p in ports if p.get("name") == "http"]
    if named or ports:
        port = int((named or ports)[0]["containerPort"])
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    oom = sum(
        int(c.get("restartCount") or 0)
        for c in status.get("containerStatuses") or []
        if ((c.get("lastState") or {}).get("terminated") or {}).get("reason") == "OOMKilled"
    )
    return PodTarget(
        uid=meta.get("uid", meta.get("name", "")),
        name=meta.get("name", ""),
        ip=host_of(status["podIP"], rewrite) if status.get("podIP") else None,
        port=port,
        ready=ready and status.get("phase") == "Running",
        terminating=bool(meta.get("deletionTimestamp")),
        oom_restarts=oom,
    )


@dataclass(frozen=True)
class Sample:
    """One pod's engine metrics at one moment."""

    kv_cache_usage: float | None
    waiting_requests: float | None
    running_requests: float | None
    preemptions_total: float | None
    requests_total: float | None = None  # vllm:request_success_total over finished_reason
    sleep_level: float | None = None  # llmservice:engine_sleep_level (sleep mode)


def parse_metrics(text: str) -> Sample:
    """Prometheus text -> the values the autoscaler reads (summed over label sets).

    KV usage is the largest value over label sets (one engine per pod reports one).
    Raises ValueError on text that is not the Prometheus exposition format.
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(float(sample.value))

    def total(name: str) -> float | None:
        return sum(values[name]) if name in values else None

    kv = values.get(KV_USAGE) or values.get(KV_USAGE_OLD)
    return Sample(
        kv_cache_usage=max(kv) if kv else None,
        waiting_requests=total(WAITING),
        running_requests=total(RUNNING),
        preemptions_total=total(PREEMPTIONS),
        requests_total=total(SUCCESS),
        sleep_level=max(values[SLEEP_LEVEL]) if SLEEP_LEVEL in values else None,
    )


class PreemptionRates:
    """Per-pod counter memory: preemptions per minute between two scrapes of one pod."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # pod uid -> (counter, time)

    def update(self, uid: str, counter: float | None, now: float) -> float | None:
        """The rate since this pod's previous scrape; None on its first scrape."""
        if counter is None:
            return None
        previous = self._last.get(uid)
        self._last[uid] = (counter, now)
        if previous is None or now <= previous[1]:
            return None
        before, then = previous
        increase = counter - before if counter >= before else counter  # reset: restarted at 0
        return increase * 60.0 / (now - then)

    def forget_except(self, uids: Iterable[str]) -> None:
        """Drop pods that are gone, so the memory does not grow with pod churn."""
        keep = set(uids)
        for uid in [u for u in self._last if u not in keep]:
            del self._last[uid]


@dataclass(frozen=True)
class ScrapeResult:
    target: PodTarget
    sample: Sample | None
    error: str | None = None
    text: str | None = None  # the page itself, for the advisor's rules


async def scrape_pod(client: httpx.AsyncClient, target: PodTarget, timeout: float) -> ScrapeResult:
    try:
        response = await client.get(target.url, timeout=timeout)
        response.raise_for_status()
        return ScrapeResult(target, parse_metrics(response.text), text=response.text)
    except httpx.TimeoutException:
        return ScrapeResult(target, None, f"{target.name}: timed out after {timeout:g}s")
    except httpx.HTTPStatusError as exc:
        return ScrapeResult(target, None, f"{target.name}: HTTP {exc.response.status_code}")
    except httpx.HTTPError as exc:
        return ScrapeResult(target, None, f"{target.name}: {type(exc).__name__} {exc}".strip())
    except ValueError as exc:
        return ScrapeResult(target, None, f"{target.name}: unparseable /metrics ({exc})")


async def scrape_pods(
    client: httpx.AsyncClient, targets: Iterable[PodTarget], timeout: float
) -> list[ScrapeResult]:
    """All targets at once; each either a sample or an error, never an exception."""
    return list(await asyncio.gather(*(scrape_pod(client, t, timeout) for t in targets)))
