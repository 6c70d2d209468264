"""Request bodies -> SamplingParams: OpenAI/vLLM defaults and the 400 rules."""

from __future__ import annotations

import pytest
from llmservice.server.api.errors import APIError
from llmservice.server.api.params import chat_params, child_params, completion_params
from llmservice.server.api.protocol import ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def test_completion_defaults_follow_openai():
    sp = completion_params(CompletionRequest(prompt="x"), "fcfs")
    assert sp.max_tokens == 16 and sp.temperature == 1.0 and sp.top_p == 1.0 and sp.logprobs is None


def test_chat_max_tokens_defaults_to_none_meaning_rest_of_context():
    assert chat_params(ChatCompletionRequest(messages=MSG), "fcfs").max_tokens is None
    req = ChatCompletionRequest(messages=MSG, max_tokens=5, max_completion_tokens=7)
    assert chat_params(req, "fcfs").max_tokens == 7


def test_tiny_temperature_is_greedy():
    sp = completion_params(CompletionRequest(prompt="x", temperature=1e-9), "fcfs")
    assert sp.temperature == 0.0 and sp.greedy


def test_priority_needs_priority_policy():
    with pytest.raises(APIError) as e:
        completion_params(CompletionRequest(prompt="x", priority=2), "fcfs")
    assert e.value.status == 400 and "priority" in e.value.message
    completion_params(CompletionRequest(prompt="x", priority=2), "priority")


@pytest.mark.parametrize("field", [{"echo": True}, {"suffix": "s"}, {"best_of": 3}, {"presence_penalty": 0.5},
                                   {"stream_options": {"include_usage": True}}, {"logit_bias": {"50": 5}},
                                   {"logit_bias": {"x": 5}}, {"n": 4, "max_tokens": 300}])
def test_unsupported_or_invalid_fields_are_400(field):
    with pytest.raises(APIError) as e:
        completion_params(CompletionRequest(prompt="x", **field), "fcfs", max_model_len=1024)
    assert e.value.status == 400 and e.value.param


def test_chat_logprobs():
    assert chat_params(ChatCompletionRequest(messages=MSG, logprobs=True, top_logprobs=3), "fcfs").logprobs == 3
    assert chat_params(ChatCompletionRequest(messages=MSG, logprobs=True), "fcfs").logprobs == 0
    with pytest.raises(APIError):
        chat_params(ChatCompletionRequest(messages=MSG, top_logprobs=3), "fcfs")


def test_children_get_distinct_reproducible_seeds():
    sp = completion_params(CompletionRequest(prompt="x", seed=10), "fcfs")
    assert [c.seed for c in child_params(sp, 3)] == [10, 11, 12]
    unseeded = completion_params(CompletionRequest(prompt="x"), "fcfs")
    assert [c.seed for c in child_params(unseeded, 2)] == [None, None]


def test_nan_and_inf_are_refused_by_the_schema():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CompletionRequest(prompt="x", temperature=float("nan"))
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="x", top_p=float("inf"))
