"""The server's own limits (vocab, context, queue bound, scheduling policy) appear in the
generated schema, and the cross-field rules of protocol.py are stated as JSON Schema that
a validator agrees with."""

from __future__ import annotations

import jsonschema
import pytest
from fastapi import FastAPI
from llmservice.server.api.errors import APIError
from llmservice.server.api.openapi_limits import ServerLimits, server_limits
from llmservice.server.api.params import chat_params, structured_spec
from llmservice.server.api.protocol import (
    GENERATION_RESPONSES,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
)
from llmservice.server.api.tools import plan_tools
from pydantic import ValidationError

USER = [{"role": "user", "content": "hi"}]


def _schema(scheduling_policy: str = "fcfs") -> dict:
    app = FastAPI()

    @app.post("/c", responses=GENERATION_RESPONSES)
    def c(body: CompletionRequest) -> None: ...

    @app.post("/chat")
    def chat(body: ChatCompletionRequest) -> None: ...

    @app.post("/d")
    def d(body: DetokenizeRequest) -> None: ...

    limits = ServerLimits(vocab_size=100, max_model_len=64, max_engine_requests=8, scheduling_policy=scheduling_policy)
    return server_limits(app.openapi(), limits)


def _valid(schema: dict, model: str, body: dict) -> bool:
    """`body` against the document's `model` (its $refs resolve within the document)."""
    root = {**schema["components"]["schemas"][model], "components": schema["components"]}
    return jsonschema.Draft202012Validator(root).is_valid(body)


def test_token_ids_context_and_n_are_bounded_by_the_server():
    models = _schema()["components"]["schemas"]
    assert models["DetokenizeRequest"]["properties"]["tokens"]["items"] == {"type": "integer", "minimum": 0, "maximum": 99}
    prompt = models["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert prompt[0]["minLength"] == 1
    assert prompt[1]["items"]["maximum"] == 99 and prompt[3]["items"]["items"]["maximum"] == 99
    assert models["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 64
    assert models["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["anyOf"][0]["maximum"] == 64
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert models[name]["properties"]["n"]["maximum"] == 8


def test_chat_max_tokens_is_bounded_only_when_it_is_the_one_read():
    schema = _schema()
    assert _valid(schema, "ChatCompletionRequest", {"messages": USER, "max_tokens": 64})
    assert not _valid(schema, "ChatCompletionRequest", {"messages": USER, "max_tokens": 65})
    assert not _valid(schema, "ChatCompletionRequest", {"messages": USER, "max_tokens": 65, "max_completion_tokens": None})
    # max_completion_tokens wins (OpenAI's rule): max_tokens is then not read at all
    assert _valid(schema, "ChatCompletionRequest", {"messages": USER, "max_tokens": 10**6, "max_completion_tokens": 8})


def test_priority_is_zero_unless_the_server_schedules_by_priority():
    assert _schema()["components"]["schemas"]["CompletionRequest"]["properties"]["priority"]["maximum"] == 0
    assert _schema()["components"]["schemas"]["CompletionRequest"]["properties"]["priority"]["minimum"] == 0
    priority = _schema("priority")["components"]["schemas"]["CompletionRequest"]["properties"]["priority"]
    assert priority["minimum"] == -(2**31) and priority["maximum"] == 2**31 - 1


@pytest.mark.parametrize(("body", "valid"), [
    ({"structured_outputs": {"regex": "a+"}}, True),
    ({"structured_outputs": {"json_object": True, "regex": None}}, True),
    ({"structured_outputs": {}}, False),
    ({"structured_outputs": {"json_object": False}}, False),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, False),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, True),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, False),
    ({"response_format": {"type": "json_schema"}}, False),
    ({"tool_choice": "required"}, False),
    ({"tool_choice": "none"}, True),
    ({"top_logprobs": 2}, False),
    ({"stream_options": {"include_usage": True}}, False),
])
def test_cross_field_rules_in_the_schema_agree_with_the_models(body, valid):
    assert _valid(_schema("priority"), "ChatCompletionRequest", {"messages": USER, **body}) == valid
    if not valid:  # what the schema refuses the server refuses too (models or handlers)
        try:
            req = ChatCompletionRequest.model_validate({"messages": USER, **body})
        except ValidationError:
            return
        with pytest.raises(APIError):  # the first check that refuses it ends the request
            chat_params(req, "priority")
            structured_spec(req)
            plan_tools(req)


def test_an_integral_number_is_an_integer_and_wrong_types_stay_refused():
    req = CompletionRequest.model_validate({"prompt": [1.0, 2], "n": 2.0, "max_tokens": 16.0, "best_of": 2.0})
    assert (req.prompt, req.n, req.max_tokens) == ([1, 2], 2, 16) and type(req.n) is int
    for bad in ({"n": 2.5}, {"n": True}, {"n": "2"}, {"prompt": [1.5]}, {"prompt": ""}):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": "x", **bad})


def test_a_seed_is_an_integer_json_carries_exactly():
    assert CompletionRequest.model_validate({"prompt": "x", "seed": 2**53 - 1}).seed == 2**53 - 1
    assert CompletionRequest.model_validate({"prompt": "x", "seed": -(2**53 - 1)}).seed == -(2**53 - 1)
    for seed in (2**53, -(2**53), 2**63):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": "x", "seed": seed})


def test_unsupported_fields_and_streaming_are_documented():
    schema = _schema()
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["echo"]["const"] is False and props["logit_bias"]["maxProperties"] == 0
    ok = schema["paths"]["/c"]["post"]["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    assert ok["text/event-stream"]["schema"]["required"] == ["data"]
