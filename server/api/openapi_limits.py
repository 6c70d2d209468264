"""The limits that depend on how the server was started, written into /openapi.json.

protocol.py states the fixed limits (OpenAI's `n` <= 128, 4 stop strings, ...). Others
come from the model and the flags: token ids lie in [0, vocab size), a completion may
ask for at most --max-model-len tokens, and one request may not need more engine
requests than --max-waiting-requests, and a non-zero priority needs --scheduling-policy
priority. `server_limits` adds them to the generated schema
(a pure function of the schema and the numbers) so that a client or a fuzzer reading the
document sees the bounds the handlers enforce.

Chat's max_tokens is bounded only where it counts: a max_completion_tokens that is set
takes its place (OpenAI's rule), and then max_tokens is not read at all. The Responses
API's max_output_tokens is bounded as completions' max_tokens is.

The rules JSON Schema cannot state (it neither counts tokens nor multiplies or compares
fields) are in the descriptions and in the 400 response's: prompt tokens + max_tokens
<= max_model_len, n x max_tokens <= max_model_len, best_of == n, and that a grammar,
regex or JSON schema must compile.
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
    scheduling_policy: str = "fcfs"


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


def _capped_unless_set(model: dict[str, Any], field: str, overridden_by: str, maximum: int) -> None:
    """`field` <= maximum where `overridden_by` is absent or null (else `field` is unused)."""
    capped = {"anyOf": [{"type": "integer", "maximum": maximum}, {"type": "null"}]}
    model.setdefault("allOf", []).append({
        "if": {"properties": {overridden_by: {"type": "null"}}},
        "then": {"properties": {field: capped}},
    })


def server_limits(schema: dict[str, Any], limits: ServerLimits) -> dict[str, Any]:
    """`schema` (the generated OpenAPI document) with the server's own bounds, in place."""
    models = schema.get("components", {}).get("schemas", {})
    context = f"; prompt tokens + max_tokens <= {limits.max_model_len} and n x max_tokens <= {limits.max_model_len}"
    one_answer = f"; prompt tokens + max_output_tokens <= {limits.max_model_len}"
    for name in ("CompletionRequest", "ChatCompletionRequest", "ResponsesRequest"):
        model = models.get(name, {})
        props = model.get("properties", {})
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if field not in props:
                continue
            rule = one_answer if field == "max_output_tokens" else context  # /v1/responses has no n
            props[field]["description"] = props[field].get("description", "") + rule
            if field == "max_tokens" and "max_completion_tokens" in props:
                _capped_unless_set(model, field, "max_completion_tokens", limits.max_model_len)
            else:
                _cap_integer(props[field], limits.max_model_len)
        if limits.max_engine_requests is not None and "n" in props:
            _cap_integer(props["n"], limits.max_engine_requests)
        if limits.scheduling_policy != "priority" and "priority" in props:
            props["priority"].update(minimum=0, maximum=0)
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
        scheduling_policy=state.scheduling_policy,
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = server_limits(generate(), limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
