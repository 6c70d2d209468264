"""The official `openai` client works unchanged against the server, and greedy output
equals the offline engine's for the same prompt."""

from __future__ import annotations

import httpx
import pytest
from llmservice.server.engine.sampling_params import SamplingParams
from openai import OpenAI

MODEL = "builtin:smollm2-135m"
PROMPT = "The three primary colors are"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(main_server) -> OpenAI:
    return OpenAI(base_url=main_server.base_url, api_key="unused", max_retries=0, timeout=120)


def offline(engine, prompt, max_tokens):
    return engine.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens))[0]


def test_completion_greedy_equals_offline_engine(client, offline_engine):
    ref = offline(offline_engine, PROMPT, 12)
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == ref.finish_reason
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens

    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    ))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert chunks[-1].usage.prompt_tokens == len(ref.prompt_token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason


def test_chat_greedy_equals_offline_engine(client, offline_engine):
    messages = [{"role": "user", "content": QUESTION}]
    rendered = offline_engine.tokenizer.apply_chat_template(messages)
    prompt_ids = offline_engine.tokenizer.encode(rendered, add_special_tokens=False)
    ref = offline(offline_engine, prompt_ids, 10)

    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    assert out.usage.prompt_tokens == len(prompt_ids)
    assert out.usage.completion_tokens == len(ref.token_ids)

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_n_seed_logprobs_and_stop(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2, seed=7, temperature=1.0, logprobs=2)
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)
        assert "".join(lp.tokens) == choice.text
    assert out.usage.completion_tokens == 8
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2, seed=7, temperature=1.0)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeded: reproducible

    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    word = full.split()[2]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == full[: full.index(word)]

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(e.top_logprobs) == 2 for e in content)


def test_batch_prompts_and_token_id_prompts(client, offline_engine):
    ids = offline_engine.tokenizer.encode(PROMPT)
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "Paris is"], max_tokens=3, temperature=0)
    assert len(batch.choices) == 2 and batch.choices[0].text != batch.choices[1].text
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == batch.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_models_tokenize_detokenize_version(client, main_server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    tok = httpx.post(main_server.url + "/tokenize", json={"prompt": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 512
    detok = httpx.post(main_server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert detok["prompt"] == PROMPT
    assert httpx.get(main_server.url + "/version").json()["version"]
    schema = httpx.get(main_server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"} <= set(schema["paths"])
    assert httpx.get(main_server.url + "/health").status_code == 200
    assert httpx.get(main_server.url + "/ready").status_code == 200
