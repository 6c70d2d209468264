"""Scripted vLLM `/metrics` on the IPs of kwok-mode pods (the fake kubelet runs no process
for them), so the real operator's autoscaler scrapes what a test sets: the page is
tests/support/metrics_pods.py's, with a preemption counter that grows at the scripted rate.

A thread lists the namespace's pods and serves each new pod IP on the pod's port; a failed
list (the API server down) is retried on the next poll, and pods already served go on
answering, as real pods would.
"""

from __future__ import annotations

import http.server
import threading
import time
from dataclasses import replace
from typing import Any

from kubernetes import client

from tests.support.metrics_pods import RateCounter, Script, render

POLL_SECONDS = 0.2


class ScriptedPodMetrics:
    def __init__(self, core: client.CoreV1Api, namespace: str, port: int = 8000) -> None:
        self.core = core
        self.namespace = namespace
        self.port = port
        self.script = Script()
        self.scrapes = 0
        self._counters: dict[str, RateCounter] = {}
        self._pod_scrapes: dict[str, int] = {}
        self._servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="pod-metrics")

    def set(self, **changes: Any) -> None:
        """Change the script of every pod (a new preemption rate counts from now on)."""
        with self._lock:
            self.script = replace(self.script, **changes)
            now = time.monotonic()
            for counter in self._counters.values():
                counter.retarget(self.script.preemptions_per_minute, now)

    def page(self, ip: str) -> str:
        with self._lock:
            now = time.monotonic()
            counter = self._counters.setdefault(
                ip, RateCounter(since=now, rate_per_minute=self.script.preemptions_per_minute)
            )
            self.scrapes += 1
            n = self._pod_scrapes[ip] = self._pod_scrapes.get(ip, 0) + 1
            # n: the pod's finished requests so far are 20 per scrape (Script.answer_tokens)
            return render(self.script, counter.read(now), self.script.kv_cache_usage, n)

    def __enter__(self) -> ScriptedPodMetrics:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for server in self._servers.values():
            server.shutdown()
            server.server_close()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                pods = self.core.list_namespaced_pod(self.namespace, _request_timeout=2).items
            except Exception:  # the API server is down: keep serving, list again later
                continue
            for pod in pods:
                ip = pod.status.pod_ip if pod.status else None
                if ip and ip not in self._servers:
                    self._serve(ip)

    def _serve(self, ip: str) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                body = owner.page(ip).encode() if self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # not a line per scrape
                pass

        server = http.server.ThreadingHTTPServer((ip, self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name=f"metrics-{ip}").start()
        self._servers[ip] = server
