"""generation_config.json's sampling defaults apply only where the request left a field unset."""

from __future__ import annotations

from llmservice.server.api.params import chat_params, completion_params, with_model_defaults
from llmservice.server.api.protocol import ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "hi"}]
LLAMA3 = {"temperature": 0.6, "top_p": 0.9}
QWEN25 = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}


def test_unset_fields_take_the_models_defaults():
    p = chat_params(with_model_defaults(ChatCompletionRequest(messages=MSG), QWEN25), "fcfs")
    assert (p.temperature, p.top_p, p.top_k) == (0.7, 0.8, 20)


def test_what_the_request_sets_wins():
    req = CompletionRequest(prompt="x", temperature=0, top_k=-1)
    p = completion_params(with_model_defaults(req, QWEN25), "fcfs")
    assert (p.temperature, p.top_p, p.top_k) == (0.0, 0.8, -1)


def test_no_defaults_leaves_the_openai_defaults():
    p = completion_params(with_model_defaults(CompletionRequest(prompt="x"), {}), "fcfs")
    assert (p.temperature, p.top_p, p.top_k) == (1.0, 1.0, 0)
    p = completion_params(with_model_defaults(CompletionRequest(prompt="x"), LLAMA3), "fcfs")
    assert (p.temperature, p.top_p, p.top_k) == (0.6, 0.9, 0)
