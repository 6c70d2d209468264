"""Checks every HTTP request passes before routing: the API key and the body size.

Both are plain ASGI middleware so that they answer before FastAPI reads a byte of the
body: a 100 MB body gets 413 from its Content-Length (or once the streamed bytes pass
the limit), and a request without the key never reaches a handler. Errors have the
OpenAI shape like every other error of the server.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from llmservice.server.api.errors import error_body

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

# Probes and scrapers carry no key (vLLM leaves these open too).
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version"})


async def _send_error(send: Callable, status: int, message: str, param: str | None = None,
                      headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message, param)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def key_matches(authorization: bytes | None, api_key: str) -> bool:
    """`Bearer KEY`, compared in constant time (no timing hint about the key)."""
    if authorization is None:
        return False
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(token.strip(), api_key.encode())


def needs_key(path: str) -> bool:
    return path not in OPEN_PATHS


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and needs_key(scope.get("path", "")):
            if not key_matches(_header(scope, b"authorization"), self.api_key):
                await _send_error(
                    send, 401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _message(self, size: int | None) -> str:
        got = f"{size} bytes" if size is not None else "more bytes"
        return f"the request body has {got}, more than this server accepts ({self.max_bytes} bytes)"

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(send, 413, self._message(int(length)))
            return
        if length is not None:
            await self.app(scope, receive, send)  # the HTTP server holds it to its length
            return
        # Chunked: read up to the limit here (FastAPI would read it all anyway), then replay.
        chunks: list[dict] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                chunks.append(message)
                break
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await _send_error(send, 413, self._message(None))
                return
            chunks.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> dict:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)
