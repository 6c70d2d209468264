"""The limits that depend on how the server was started, written into /openapi.json.

protocol.py states the fixed limits (OpenAI's `n` <= 128, 4 stop strings, ...). Others
come from the model and the flags: token ids lie in [0, vocab size), a completion may
ask for at most --max-model-len tokens, and one request may not need more engine
requests than --max-waiting-requests. `server_limits` adds them to the generated schema
(a pure function of the schema and the numbers) so that a client or a fuzzer reading the
document sees the bounds the handlers enforce.

Two limits stay in prose (JSON Schema cannot compare fields): prompt tokens + max_tokens
<= max_model_len, and n x max_tokens <= max_model_len.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI


@dataclass(frozen=True)
class ServerLimits:
    vocab_size: int
    max_model_len: int
    max_engine_requests: int | None  # --max-waiting-requests


def _branches(prop: dict[str, Any]) -> list[dict[str, Any]]:
    return prop.get("anyOf", [prop])


def _bound_token_ids(node: dict[str, Any], vocab_size: int) -> None:
    """Every integer array (nested or not) under `node` holds token ids."""
    for branch in _branches(node):
        if branch.get("type") != "array":
            continue
        items = branch.get("items", {})
        if items.get("type") == "integer":
            items.update(minimum=0, maximum=vocab_size - 1)
        else:
            _bound_token_ids(items, vocab_size)


def _cap_integer(prop: dict[str, Any], maximum: int) -> None:
    for branch in _branches(prop):
        if branch.get("type") == "integer":
            branch["maximum"] = min(branch.get("maximum", maximum), maximum)


def server_limits(schema: dict[str, Any], limits: ServerLimits) -> dict[str, Any]:
    """`schema` (the generated OpenAPI document) with the server's own bounds, in place."""
    models = schema.get("components", {}).get("schemas", {})
    context = f"; prompt tokens + max_tokens <= {limits.max_model_len} and n x max_tokens <= {limits.max_model_len}"
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = models.get(name, {}).get("properties", {})
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                _cap_integer(props[field], limits.max_model_len)
                props[field]["description"] = props[field].get("description", "") + context
        if limits.max_engine_requests is not None and "n" in props:
            _cap_integer(props["n"], limits.max_engine_requests)
        if "prompt" in props:
            _bound_token_ids(props["prompt"], limits.vocab_size)
    for name in ("DetokenizeRequest",):
        props = models.get(name, {}).get("properties", {})
        if "tokens" in props:
            _bound_token_ids(props["tokens"], limits.vocab_size)
    return schema


def with_server_limits(app: FastAPI, state: Any) -> None:
    """Serve the document with `state`'s limits (built once, on the first request)."""
    generate = app.openapi
    limits = ServerLimits(
        vocab_size=state.tokenizer.tokenizer.vocab_size,
        max_model_len=state.max_model_len,
        max_engine_requests=state.max_waiting_requests,
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = server_limits(generate(), limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
