"""Bad input gets an OpenAI-shaped 4xx with a message that says what is wrong, and the
server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

MODEL = "builtin:smollm2-135m"


def _post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.base_url + path, timeout=60, **kwargs)


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["message"] and err["type"] and err["code"] == status
    return err


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": MODEL, "prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "temperature": -0.5}, "temperature"),
        ({"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p"),
        ({"model": MODEL, "prompt": 42}, "prompt"),
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "n": 0}, "n"),
        ({"model": MODEL, "prompt": "hi", "logprobs": 50}, "logprobs"),
        ({"model": MODEL, "prompt": "hi", "stop": [""]}, "stop"),
        ({"model": MODEL, "prompt": "hi", "priority": 3}, "priority"),
        ({"model": MODEL, "prompt": "hi", "seed": 2**70}, "seed"),
        ({"model": MODEL, "prompt": []}, "prompt"),
        ({"model": MODEL, "prompt": ""}, "empty"),
        ({"model": MODEL, "prompt": [10**9]}, "token ids"),
        ({"model": MODEL, "prompt": "hi", "presence_penalty": 1.0}, "presence_penalty"),
    ],
)
def test_invalid_completion_parameters_are_400(main_server, body, needle):
    err = _error(_post(main_server, "/completions", json=body), 400)
    assert needle in err["message"]


def test_malformed_json_and_nan_are_400(main_server):
    _error(_post(main_server, "/completions", content=b'{"prompt": "hi",', headers={"content-type": "application/json"}), 400)
    _error(_post(main_server, "/completions", content=b'{"prompt": "hi", "temperature": NaN}',
                 headers={"content-type": "application/json"}), 400)
    _error(_post(main_server, "/chat/completions", json={"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}), 400)
    _error(_post(main_server, "/chat/completions", json={"model": MODEL, "messages": []}), 400)


def test_prompt_too_long_names_both_numbers(main_server):
    prompt = "hello " * 600  # > max_model_len 512 on its own
    err = _error(_post(main_server, "/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}), 400)
    assert "512" in err["message"] and "tokens" in err["message"]
    ids = list(range(1000, 1500))  # 500 prompt tokens
    err = _error(_post(main_server, "/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 20}), 400)
    assert "500" in err["message"] and "20" in err["message"] and "512" in err["message"]


def test_unknown_model_is_404_and_client_gets_typed_errors(main_server):
    err = _error(_post(main_server, "/completions", json={"model": "gpt-17", "prompt": "hi"}), 404)
    assert "gpt-17" in err["message"]
    client = openai.OpenAI(base_url=main_server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-3)
    # and the server still serves
    out = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=0)
    assert out.usage.completion_tokens == 2
    assert httpx.get(main_server.url + "/health").status_code == 200
