"""Greedy outputs are identical with n-gram speculation on and off: the 24-request mixed
workload (shared prefixes, prompts that quote themselves so drafts are accepted and
rejected), with prefix caching, chunked prefill, both preemption modes and block sizes
8..128. Every case checks that drafts were really verified, and that the KV pool is
whole at the end."""

from __future__ import annotations

import json
import random

import pytest
from llmservice.server.engine.sampling_params import SamplingParams

# disable_by_batch_size: vLLM's fixed rule, so every step with a draft verifies it
# whatever the measured plan would choose on a busy machine
NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
     "disable_by_batch_size": 4096}
)  # fmt: skip


def workload(seed: int = 11, n: int = 24):
    """The scheduling-equivalence mix, each prompt followed by a quote of itself: the
    model tends to continue a quote, so the drafts are partly right."""
    rng = random.Random(seed)
    prefixes = {
        "none": [],
        "one_block": [rng.randrange(200, 40000) for _ in range(16)],
        "many_blocks": [rng.randrange(200, 40000) for _ in range(70)],
        "mid_block": [rng.randrange(200, 40000) for _ in range(23)],
    }
    names = list(prefixes)
    prompts, params = [], []
    for i in range(n):
        suffix = [rng.randrange(200, 40000) for _ in range(rng.randint(4, 30))]
        body = prefixes[names[i % 4]] + suffix
        quote = body[: rng.randint(3, min(len(body), 12))]
        prompts.append(body + quote)
        params.append(SamplingParams(temperature=0, max_tokens=rng.randint(4, 24), ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def mixed():
    return workload()


@pytest.fixture(scope="module")
def small():
    return workload(n=6)


def plain_outputs(make_engine, requests):
    eng = make_engine(
        enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=4096
    )
    return [o.token_ids for o in eng.generate(*requests)]


@pytest.fixture(scope="module")
def reference(make_engine, mixed):
    return plain_outputs(make_engine, mixed)


@pytest.fixture(scope="module")
def small_reference(make_engine, small):
    return plain_outputs(make_engine, small)


CASES = {
    "plain": dict(enable_prefix_caching=False),
    "prefix_on": dict(enable_prefix_caching=True, max_num_seqs=4),
    "chunk_7": dict(max_num_batched_tokens=7),
    "recompute": dict(num_gpu_blocks_override=24, max_model_len=256, preemption_mode="recompute"),
    "swap": dict(
        num_gpu_blocks_override=24, max_model_len=256, preemption_mode="swap", swap_space=0.05
    ),
}


def check(eng, outs, reference):
    assert [o.token_ids for o in outs] == reference
    st = eng.speculator.stats
    assert st.num_drafts > 0 and 0 < st.num_accepted_tokens < st.num_draft_tokens
    eng.block_manager.check_invariants()
    assert eng.block_manager.usage == 0.0


@pytest.mark.e2e  # ~10 min on the 2 shared cores; the default tier runs the two below
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_outputs_identical_with_ngram(make_engine, mixed, reference, case):
    eng = make_engine(speculative_config=NGRAM, **CASES[case])
    outs = eng.generate(*mixed)
    check(eng, outs, reference)
    if "num_gpu_blocks_override" in CASES[case]:
        assert eng.scheduler.stats.num_preemptions > 0


@pytest.mark.e2e
@pytest.mark.parametrize("block_size", [8, 128])
def test_greedy_outputs_identical_with_ngram_across_block_sizes(
    make_engine, mixed, reference, block_size
):
    eng = make_engine(
        speculative_config=NGRAM, block_size=block_size, num_gpu_blocks_override=512 // block_size,
        max_model_len=256, preemption_mode="swap", swap_space=0.1, max_num_batched_tokens=128,
    )  # fmt: skip
    check(eng, eng.generate(*mixed), reference)


FAST = {
    "prefix_chunk_7_bs8": dict(
        enable_prefix_caching=True, max_num_seqs=4, max_num_batched_tokens=7, block_size=8
    ),
    "recompute_bs32": dict(
        num_gpu_blocks_override=4, block_size=32, max_model_len=128, preemption_mode="recompute"
    ),
}


@pytest.mark.parametrize("case", list(FAST))
def test_greedy_outputs_identical_with_ngram_fast(make_engine, small, small_reference, case):
    eng = make_engine(speculative_config=NGRAM, **FAST[case])
    check(eng, eng.generate(*small), small_reference)
    if "num_gpu_blocks_override" in FAST[case]:
        assert eng.scheduler.stats.num_preemptions > 0
