"""The sampler on a mixed batch: greedy rows stay on the logits' device, the rest are copied."""

from __future__ import annotations

import math

import torch
from llmservice.server.engine.sampler import Sampler, SampleRow
from llmservice.server.engine.sampling_params import SamplingParams


def _request(sp: SamplingParams) -> SampleRow:
    return SampleRow(sp, output_index=0)


def test_mixed_batch_gets_each_row_its_own_treatment():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000).to(torch.bfloat16)  # the engine's dtype on a GPU
    requests = [
        _request(SamplingParams(temperature=0)),
        _request(SamplingParams(temperature=0, logprobs=2)),
        _request(SamplingParams(temperature=0.7, top_k=1, seed=3)),  # samples, but only one candidate
        _request(SamplingParams(temperature=0.0)),
    ]
    results = Sampler(seed=0)(logits, requests)
    best = logits.float().argmax(-1).tolist()
    assert [token for token, _ in results] == best
    assert results[0][1] is None and results[2][1] is None and results[3][1] is None
    lp = results[1][1]
    expected = logits[1].float().log_softmax(-1)
    assert lp is not None and lp.token_id == best[1]
    assert math.isclose(lp.logprob, expected[best[1]].item(), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == expected.topk(2).indices.tolist()


def test_sampled_row_draws_from_its_own_logits():
    # Row 1 puts all its mass on token 7; a row mix-up would sample elsewhere.
    logits = torch.full((3, 50), -1e4)
    logits[0, 3] = logits[2, 11] = 0.0
    logits[1, 7] = 10.0
    requests = [_request(SamplingParams(temperature=0)), _request(SamplingParams(temperature=1.0, seed=1)),
                _request(SamplingParams(temperature=0))]
    assert [token for token, _ in Sampler(seed=0)(logits, requests)] == [3, 7, 11]


def test_a_row_with_no_allowed_token_does_not_stop_the_batch():
    # A grammar that allows no token leaves a sampled row all -inf: softmax gives NaN, and
    # a multinomial draw would raise and stop the engine for every request. The row takes
    # the argmax instead; the other rows of the batch are sampled as usual.
    logits = torch.full((2, 40), -1e4)
    logits[0] = float("-inf")
    logits[1, 9] = 0.0
    sampled = SamplingParams(temperature=0.8, seed=1)
    results = Sampler(seed=0)(logits, [_request(sampled), _request(sampled)])
    assert results[0][0] == int(logits[0].argmax())
    assert results[1][0] == 9


def test_an_overflowing_temperature_falls_back_to_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    results = Sampler(seed=0)(logits, [_request(SamplingParams(temperature=1e-45, seed=2))])
    assert results[0][0] == 1
