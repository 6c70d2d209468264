"""What the autoscaler scenario records (the LLMService and every pod's /metrics, every
0.25 s) and what it reads from the record: the reaction time and the replica path."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from llmservice.operator.scrape import parse_metrics

if TYPE_CHECKING:
    from tests.support.clients import Kubectl


@dataclass
class Timeline:
    """Samples (seconds since start) of the LLMService and of each pod's metrics."""

    t0: float = field(default_factory=time.monotonic)
    service: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    first_pod: str | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def mark(self, what: str) -> None:
        self.marks[what] = self.now()
        print(f"[{self.marks[what]:7.2f}s] {what}", flush=True)


class Recorder(threading.Thread):
    def __init__(self, k: Kubectl, name: str, timeline: Timeline, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.k, self.name, self.timeline, self.period = k, name, timeline, period
        self.stop = threading.Event()
        self.client = httpx.Client(trust_env=False, timeout=1.0)

    def run(self) -> None:
        while not self.stop.is_set():
            t = self.timeline.now()
            with contextlib.suppress(Exception):
                body = self.k.llms(self.name)
                status = body.get("status") or {}
                self.timeline.service.append(
                    {
                        "t": t,
                        "replicas": body["spec"]["replicas"],
                        "readyReplicas": status.get("readyReplicas", 0),
                        "signals": status.get("signals") or {},
                        "lastScaleReason": status.get("lastScaleReason"),
                    }
                )
                for pod in self.k.pods(self.name):
                    ip = (pod.get("status") or {}).get("podIP")
                    if not ip or pod["metadata"].get("deletionTimestamp"):
                        continue
                    with contextlib.suppress(Exception):
                        s = parse_metrics(self.client.get(f"http://{ip}:8000/metrics").text)
                        self.timeline.pods.append(
                            {
                                "t": t,
                                "pod": pod["metadata"]["name"],
                                "preemptions_total": s.preemptions_total,
                                "kv_cache_usage": s.kv_cache_usage,
                                "waiting": s.waiting_requests,
                                "running": s.running_requests,
                            }
                        )
            self.stop.wait(self.period)


def first_change(samples: list[dict[str, Any]], key: str, after: float = 0.0) -> float | None:
    start = next((s[key] for s in samples if s["t"] >= after), None)
    return next((s["t"] for s in samples if s["t"] >= after and s[key] != start), None)


def first_preemption(pods: list[dict[str, Any]], pod: str) -> float | None:
    mine = [p for p in pods if p["pod"] == pod and p["preemptions_total"] is not None]
    if not mine:
        return None
    base = mine[0]["preemptions_total"]
    return next((p["t"] for p in mine if p["preemptions_total"] > base), None)


def analyse(tl: Timeline, interval: int) -> dict[str, Any]:
    crossed = first_preemption(tl.pods, tl.first_pod) if tl.first_pod else None
    patched = first_change(tl.service, "replicas", after=tl.marks.get("load started", 0.0))
    stopped = tl.marks.get("load stopped", float("inf"))
    reasons = [s["lastScaleReason"] for s in tl.service if s["lastScaleReason"]]
    after_load = [s for s in tl.service if s["t"] >= stopped]
    reaction = None if crossed is None or patched is None else round(patched - crossed, 2)
    return {
        "threshold_crossed_s": crossed,
        "replicas_patched_s": patched,
        "reaction_time_s": reaction,
        "reaction_time_intervals": None if reaction is None else round(reaction / interval, 2),
        "max_replicas": max((s["replicas"] for s in tl.service), default=None),
        "scale_up_reason": next((r for r in reasons if " > " in r), None),
        "final_replicas": after_load[-1]["replicas"] if after_load else None,
        "back_to_1_after_load_stopped_s": next(
            (round(s["t"] - stopped, 2) for s in after_load if s["replicas"] == 1), None
        ),
    }
