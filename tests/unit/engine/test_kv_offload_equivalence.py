"""Greedy multi-turn outputs are identical with the prefix cache's host tier on and off:
KV offloaded to host memory and brought back is the KV that was never evicted (the real
embedded model, a device pool smaller than the chats' histories)."""

from __future__ import annotations

import json
import random

import pytest
from llmservice.server.engine.sampling_params import SamplingParams

# disable_by_batch_size: every step with a draft verifies it, whatever the measured plan says
NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
     "disable_by_batch_size": 4096}
)  # fmt: skip
BASE = dict(num_gpu_blocks_override=24, max_model_len=256, enable_prefix_caching=True)


def chat(engine, num_chats: int = 4, turns: int = 3, seed: int = 5) -> list[list[int]]:
    """Turn after turn, every chat resends its whole history plus a new user message."""
    rng = random.Random(seed)
    histories = [[rng.randrange(200, 40000) for _ in range(30)] for _ in range(num_chats)]
    outputs = []
    for _ in range(turns):
        prompts = [h + [rng.randrange(200, 40000) for _ in range(rng.randint(15, 30))] for h in histories]
        params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True) for _ in prompts]
        outs = engine.generate(prompts, params)
        outputs += [o.token_ids for o in outs]
        histories = [p + list(o.token_ids) for p, o in zip(prompts, outs, strict=True)]
    return outputs


CASES = {
    "block_16": dict(),
    "block_8": dict(block_size=8, num_gpu_blocks_override=48),
    "block_32": dict(block_size=32, num_gpu_blocks_override=12),
    "chunked_16": dict(max_num_batched_tokens=16),
    "swap_preemption": dict(preemption_mode="swap", swap_space=0.01),
    "speculative": dict(speculative_config=NGRAM),
}


@pytest.mark.parametrize("case", list(CASES))
def test_offload_on_and_off_give_identical_greedy_outputs(make_engine, case):
    settings = {**BASE, **CASES[case]}
    reference = chat(make_engine(**settings))
    eng = make_engine(kv_offloading_size=0.02, **settings)
    assert chat(eng) == reference
    tier = eng.block_manager.host_tier
    assert tier.offloaded_blocks > 0 and tier.restored_blocks > 0  # the host tier was exercised
    assert eng.scheduler.stats.prefix_host_hits > 0
    eng.block_manager.check_invariants()
    tier.check_invariants()
    assert eng.block_manager.usage == 0.0
