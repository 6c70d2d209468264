"""The request models reject what OpenAI's schema rejects (wrong JSON types are never
coerced; each chat role has its required fields; stop, logit_bias and prompt lists are
bounded), and the ASGI guards answer 401 / 413 in OpenAI's shape before any handler."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from llmservice.server.api.guards import APIKeyMiddleware, BodyLimitMiddleware, key_matches
from llmservice.server.api.params import check_total_tokens, default_max_tokens
from llmservice.server.api.protocol import MAX_PROMPTS, ChatCompletionRequest, CompletionRequest
from llmservice.server.cli_args import api_key_from_env
from llmservice.server.engine.sampling_params import SamplingParams
from pydantic import ValidationError

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "field",
    [
        {"max_tokens": "16"}, {"max_tokens": 16.5}, {"n": 2.5}, {"n": True}, {"stream": 1},
        {"stream": "true"}, {"temperature": "0.5"}, {"seed": "1"}, {"stop": 5}, {"stop": ["a", 1]},
        {"user": 7}, {"ignore_eos": "yes"}, {"stream_options": {"include_usage": 1}},
        {"stop": ["a", "b", "c", "d", "e"]}, {"stop": "x" * 513}, {"stop": ""},
        {"logit_bias": {"50": 101}}, {"logit_bias": {"50": -101}}, {"logit_bias": {"50": 1.5}},
    ],
)
def test_wrong_types_and_limits_are_refused_not_coerced(field):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "hi", **field})
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": USER, **field})


def test_right_types_pass_and_an_integer_is_a_number():
    req = CompletionRequest.model_validate({"prompt": "hi", "temperature": 1, "top_p": 1, "stop": ["a"] * 4})
    assert req.temperature == 1.0 and req.max_tokens is None
    assert ChatCompletionRequest.model_validate({"messages": USER, "logit_bias": {"50": 100}}).logit_bias == {"50": 100}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user"},  # content is required
        {"role": "system", "content": None},
        {"role": "developer"},
        {"role": "tool", "content": "42"},  # tool_call_id is required
        {"role": "assistant"},  # content or tool_calls
        {"role": "assistant", "content": None},
        {"role": "function", "content": "x"},  # name is required
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "user", "content": 5},
        {"role": "wizard", "content": "x"},
    ],
)
def test_each_role_requires_openais_fields(message):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": [message]})


def test_valid_messages_of_every_role():
    messages = [
        {"role": "system", "content": "s"}, {"role": "developer", "content": [{"type": "text", "text": "d"}]},
        {"role": "user", "content": "u", "name": "n"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "function", "content": None, "name": "f"},
    ]
    assert len(ChatCompletionRequest.model_validate({"messages": messages}).messages) == 6


def test_batched_prompt_lists_are_bounded():
    CompletionRequest.model_validate({"prompt": ["a"] * MAX_PROMPTS})
    for prompt in (["a"] * (MAX_PROMPTS + 1), [[1]] * (MAX_PROMPTS + 1), [], [[]], ["a", 1]):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": prompt})


def test_n_times_max_tokens_within_the_context():
    check_total_tokens(4, 256, 1024)
    check_total_tokens(1, 4096, 1024)  # n == 1: the engine's prompt + max_tokens check applies
    with pytest.raises(Exception, match=r"n \(4\) x max_tokens \(257\) = 1028 exceeds max_model_len \(1024\)"):
        check_total_tokens(4, 257, 1024)


def test_max_tokens_default_is_capped_to_the_rest_of_the_context():
    unset = SamplingParams(max_tokens=None)
    assert default_max_tokens(unset, 100, 512, 64).max_tokens == 64
    assert default_max_tokens(unset, 500, 512, 64).max_tokens == 12
    assert default_max_tokens(unset, 100, 512, None).max_tokens is None
    assert default_max_tokens(SamplingParams(max_tokens=7), 100, 512, 64).max_tokens == 7


def test_api_key_comparison_and_env():
    assert key_matches(b"Bearer s3cret", "s3cret") and key_matches(b"bearer s3cret", "s3cret")
    assert not key_matches(b"Bearer s3cre", "s3cret") and not key_matches(None, "s3cret")
    assert not key_matches(b"Basic s3cret", "s3cret")
    assert api_key_from_env({"VLLM_API_KEY": "v"}) == "v"
    assert api_key_from_env({"VLLM_API_KEY": "v", "LLMSERVICE_API_KEY": "l"}) == "l"
    assert api_key_from_env({"VLLM_API_KEY": ""}) is None


async def _echo_app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def _call(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, path, **kwargs)

    return asyncio.run(go())


def _shaped(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status and err["message"] and err["type"] and "param" in err
    return err


def test_api_key_guard_leaves_probes_open():
    app = APIKeyMiddleware(_echo_app, "k")
    assert _call(app, "GET", "/health").status_code == 200
    assert _call(app, "GET", "/metrics").status_code == 200
    _shaped(_call(app, "POST", "/v1/completions", content=b"{}"), 401)
    _shaped(_call(app, "POST", "/v1/completions", headers={"Authorization": "Bearer no"}), 401)
    assert _call(app, "POST", "/v1/completions", headers={"Authorization": "Bearer k"}).status_code == 200


def test_body_limit_by_length_and_by_chunks():
    app = BodyLimitMiddleware(_echo_app, 1024)
    assert _call(app, "POST", "/v1/completions", content=b"x" * 1024).text == "1024"
    _shaped(_call(app, "POST", "/v1/completions", content=b"x" * 1025), 413)

    def chunks(n):
        async def gen():
            for _ in range(n):
                yield b"x" * 300
        return gen()

    assert _call(app, "POST", "/v1/completions", content=chunks(3)).text == "900"
    _shaped(_call(app, "POST", "/v1/completions", content=chunks(4)), 413)
