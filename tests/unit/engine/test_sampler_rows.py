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
