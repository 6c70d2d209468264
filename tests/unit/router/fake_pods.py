"""Fake model pods for router tests and bench/router.py: a fixed SSE stream, no model.

Each pod answers /v1/chat/completions and /v1/completions with a fixed stream of
`chunks` SSE events (or one JSON body when `stream` is false), reports its requests in
flight as vllm:num_requests_running on /metrics, and records the prefix keys it saw
so tests can count cache hits (a key seen before on the same pod is a hit).
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field

from aiohttp import web
from llmservice.router.prefix_key import prefix_key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FakePod:
    name: str
    chunks: int = 4
    delay_s: float = 0.0
    running: int = 0
    requests: int = 0
    seen: set[bytes] = field(default_factory=set)
    hits: int = 0
    port: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakePod:
        app = web.Application()
        app.router.add_post("/v1/{kind}", self._answer)
        app.router.add_post("/v1/chat/{kind}", self._answer)
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=f"vllm:num_requests_running{{model_name=\"m\"}} {self.running}\n"
                                 f"vllm:num_requests_waiting{{model_name=\"m\"}} 0\n")  # fmt: skip

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        key = prefix_key(body, 256)
        if key is not None:
            self.hits += key in self.seen
            self.seen.add(key)
        self.running += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.delay_s)
                return web.json_response({"pod": self.name, "choices": [{"text": "ok"}]})
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "X-Pod": self.name}
            )
            await response.prepare(request)
            for i in range(self.chunks):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s / self.chunks)
                await response.write(f"data: {json.dumps({'pod': self.name, 'i': i})}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            self.running -= 1
