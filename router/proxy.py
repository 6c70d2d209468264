"""The HTTP proxy: pick a pod, stream its answer through untouched, hold at zero pods.

A request's body is read whole (a prompt is small next to its answer) and parsed once
for its prefix key and its `model` (a LoRA adapter's name picks the pods that hold it); the answer is streamed back chunk by chunk as it arrives, SSE included,
with the pod's status and headers (hop-by-hop headers dropped, no re-compression).
A connection error before the pod's first byte retries once on another pod; once
bytes flowed, an error ends the response (the client sees a truncated stream, as it
would talking to the pod). With no Ready pod the request is held: at most
`max_held` at once (past it 503 + Retry-After), up to `hold_timeout_s` (then 504
saying the model is starting), and with `waker` set each held request pokes the
scale-from-zero check. A pod that answers it is asleep is woken, and the request sent
to it again (pod_wake.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from llmservice.router.metrics import RouterMetrics
from llmservice.router.pod_wake import PodWaker, is_asleep
from llmservice.router.pool import PodPool
from llmservice.router.prefix_key import prefix_key
from llmservice.router.routing import RETRY, Choice
from llmservice.router.wake import Waker

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE",
              "Trailers", "Transfer-Encoding", "Upgrade", "Host", "Content-Length")
)  # fmt: skip
OWN_PATHS = ("/healthz", "/readyz", "/metrics")


@dataclass(frozen=True)
class RouterConfig:
    service: str = ""  # the LLMService name (messages, the wake target)
    policy: str = "prefix"  # or "round-robin" (the baseline)
    load_factor: float = 1.25
    prefix_tokens: int = 256
    max_held: int = 100
    hold_timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    retry_after_s: int = 5


def error(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> web.Response:
    """OpenAI's error shape, as the server answers."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status, headers=headers)


class _Busy(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


class Router:
    def __init__(
        self, config: RouterConfig, pool: PodPool | None = None, waker: Waker | None = None
    ) -> None:
        self.config = config
        self.pool = pool or PodPool()
        self.waker = waker
        self.metrics = RouterMetrics()
        self.pod_waker = PodWaker(lambda pod: self.metrics.pod_wake_ups.labels(pod).inc())
        self.held = 0
        self.in_flight = 0
        self.draining = False
        self.session: aiohttp.ClientSession | None = None

    # --- app ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, trust_env=False
        )

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _healthz(self, _: web.Request) -> web.Response:
        """Liveness: the process answers (no pod needed: at zero it holds)."""
        return web.json_response(
            {"status": "ok", "pods": len(self.pool.endpoints), "held": self.held}
        )

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ready"})

    async def _metrics(self, _: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.metrics.pods.set(len(self.pool.endpoints))
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    # --- proxy -------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        try:
            body = await request.read()
            key, model = None, None
            if self.config.policy != "round-robin" and body and request.method == "POST":
                try:
                    parsed = json.loads(body)
                except (ValueError, UnicodeDecodeError):
                    parsed = None  # not JSON: the pod answers 400 itself
                key = prefix_key(parsed, self.config.prefix_tokens)
                model = request_model(parsed)
            try:
                choice = await self._pick(key, model)
            except _Busy as busy:
                self.metrics.requests.labels("", str(busy.response.status)).inc()
                return busy.response
            return await self._forward(request, body, key, model, choice)
        finally:
            self.in_flight -= 1

    async def _pick(
        self, key: bytes | None, model: str | None, exclude: frozenset[str] = frozenset()
    ) -> Choice:
        """A pod now, or after holding the request until one is Ready."""
        cfg = self.config
        choice = self.pool.pick(key, cfg.policy, cfg.load_factor, exclude, model)
        if choice is not None:
            return choice
        if self.held >= cfg.max_held:
            raise _Busy(error(
                503, f"{cfg.service or 'the model'} has no Ready replica and {self.held} requests "
                f"are already waiting for one (router.maxHeldRequests); retry later",
                "service_unavailable", {"Retry-After": str(cfg.retry_after_s)},
            ))  # fmt: skip
        self.held += 1
        self.metrics.held.inc()
        started = time.monotonic()
        deadline = started + cfg.hold_timeout_s
        try:
            while True:
                if self.waker is not None:
                    self.waker.poke()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Busy(error(
                        504, f"{cfg.service or 'the model'} is starting (scaled from zero or "
                        f"no Ready replica): no replica was Ready within {cfg.hold_timeout_s:g}s "
                        "(router.holdTimeoutSeconds); retry shortly", "timeout",
                        {"Retry-After": str(cfg.retry_after_s)},
                    ))  # fmt: skip
                await self.pool.wait_changed(min(left, 1.0))
                choice = self.pool.pick(key, cfg.policy, cfg.load_factor, exclude, model)
                if choice is not None:
                    return choice
        finally:
            self.held -= 1
            self.metrics.held.dec()
            self.metrics.hold_seconds.observe(time.monotonic() - started)

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        key: bytes | None,
        model: str | None,
        choice: Choice,
    ) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        tried: set[str] = set()
        woken: set[str] = set()
        while True:
            pod, adapter = choice.pod, choice.adapter
            self.metrics.decisions.labels(choice.reason).inc()
            url = self.pool.endpoints[pod].url + request.path_qs
            self.pool.started(pod, adapter)
            try:
                try:
                    upstream = await self.session.request(
                        request.method, url, data=body, headers=headers, timeout=timeout,
                        allow_redirects=False,
                    )  # fmt: skip
                except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                    # Before the first byte: nothing reached the client; one retry elsewhere.
                    self.metrics.upstream_errors.labels(pod).inc()
                    self.pool.mark_failed(pod)
                    tried.add(pod)
                    retry = None
                    if len(tried) == 1:
                        retry = self.pool.pick(
                            key, self.config.policy, self.config.load_factor, frozenset(tried),
                            model,
                        )  # fmt: skip
                    if retry is None or retry.pod in tried:
                        self.metrics.requests.labels(pod, "502").inc()
                        return error(
                            502, f"pod {pod} did not accept the connection: {exc}", "bad_gateway"
                        )
                    choice = Choice(retry.pod, RETRY, retry.adapter)
                    continue
                if is_asleep(upstream.status, upstream.headers) and pod not in woken:
                    # A pod put to sleep (scaleToZero: sleep): wake it, then send it again.
                    seen_at = time.monotonic()
                    upstream.release()
                    woken.add(pod)
                    auth = {k: v for k, v in headers.items() if k.lower() == "authorization"}
                    base = self.pool.endpoints[pod].url
                    if await self.pod_waker.wake(self.session, pod, base, auth, seen_at):
                        continue
                    upstream = await self.session.request(
                        request.method, url, data=body, headers=headers, timeout=timeout,
                        allow_redirects=False,
                    )  # fmt: skip
                return await self._stream(request, upstream, pod)
            finally:
                self.pool.finished(pod, adapter)

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, pod: str
    ) -> web.StreamResponse:
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers.add(k, v)
            if upstream.content_length is not None and "chunked" not in upstream.headers.get(
                "Transfer-Encoding", ""
            ):
                response.content_length = upstream.content_length
            self.metrics.requests.labels(pod, str(upstream.status)).inc()
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientError, asyncio.CancelledError) as exc:
                # The client left (the pod sees its connection close and aborts the
                # request) or the pod died mid-stream (the client sees a cut stream).
                log.debug("stream from %s ended early: %r", pod, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            return response


def request_model(body: Any) -> str | None:
    """The `model` field of a parsed OpenAI request body."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def describe(router: Router) -> dict[str, Any]:
    """A snapshot for logs and tests."""
    return {
        "pods": sorted(router.pool.endpoints),
        "held": router.held,
        "in_flight": router.in_flight,
    }
