"""The server's own limits (vocab, context, queue bound) appear in the generated schema,
and the cross-field rules of protocol.py are stated as JSON Schema."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from llmservice.server.api.openapi_limits import ServerLimits, server_limits
from llmservice.server.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
)
from pydantic import ValidationError


def _schema() -> dict:
    app = FastAPI()

    @app.post("/c")
    def c(body: CompletionRequest): ...

    @app.post("/chat")
    def chat(body: ChatCompletionRequest): ...

    @app.post("/d")
    def d(body: DetokenizeRequest): ...

    return server_limits(app.openapi(), ServerLimits(vocab_size=100, max_model_len=64, max_engine_requests=8))


def test_token_ids_context_and_n_are_bounded_by_the_server():
    models = _schema()["components"]["schemas"]
    assert models["DetokenizeRequest"]["properties"]["tokens"]["items"] == {"type": "integer", "minimum": 0, "maximum": 99}
    prompt = models["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert prompt[0]["minLength"] == 1
    assert prompt[1]["items"]["maximum"] == 99 and prompt[3]["items"]["items"]["maximum"] == 99
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = models[name]["properties"]
        assert props["max_tokens"]["anyOf"][0]["maximum"] == 64
        assert props["n"]["maximum"] == 8


def test_cross_field_rules_are_in_the_schema_and_still_strict():
    chat = ChatCompletionRequest.model_json_schema()
    needs = [rule["then"]["required"] for rule in chat["allOf"]]
    assert needs == [["stream"], ["logprobs"]]
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "n": 2.0})  # strict JSON types stay
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": ""})
    props = CompletionRequest.model_json_schema()["properties"]
    assert props["echo"]["const"] is False and props["logit_bias"]["maxProperties"] == 0
