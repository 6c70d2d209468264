"""Sampling parameters on the real model: seeds, top-k/top-p, stops, max_tokens, logprobs."""

from __future__ import annotations

import math

import pytest
from llmservice.server.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story about a cat."}])


def test_seeded_sampling_is_reproducible_and_batch_independent(engine, prompt):
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = engine.generate([prompt], sp)[0].token_ids
    other = SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True)
    batched = engine.generate([prompt, prompt], [sp, other])
    assert batched[0].token_ids == alone
    assert batched[1].token_ids != alone


def test_top_k_one_equals_greedy(engine, prompt):
    greedy = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0].token_ids
    topk1 = engine.generate([prompt], SamplingParams(temperature=0.8, top_k=1, max_tokens=10, seed=5))[0].token_ids
    assert greedy == topk1


def test_stop_string_truncates_and_finishes(engine, prompt):
    full = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    words = full.text.split()
    assert len(words) > 3
    stop = words[2]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text and full.text.startswith(out.text)
    kept = engine.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=24, stop=[stop], include_stop_str_in_output=True)
    )[0]
    assert kept.text.endswith(stop)


def test_stop_token_ids_and_max_tokens(engine, prompt):
    full = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    stop_id = full.token_ids[3]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]


def test_logprobs_are_consistent(engine, prompt):
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=5, logprobs=3))[0]
    req_lps = [lp for lp in engine_logprobs(engine, prompt)]
    assert len(req_lps) == 5
    for token, lp in zip(out.token_ids, req_lps, strict=True):
        assert lp.token_id == token
        assert len(lp.top) == 3 and lp.top[0][0] == token  # greedy: chosen = best
        assert lp.logprob <= 0 and math.isclose(lp.logprob, lp.top[0][1], rel_tol=1e-6)
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def engine_logprobs(engine, prompt):
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=5, logprobs=3), request_id="lp")
    collected = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            collected.extend(out.new_logprobs)
    return collected


def test_invalid_sampling_params_name_the_value():
    with pytest.raises(ValueError, match="temperature must be >= 0, got -1"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
