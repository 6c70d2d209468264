"""Model drafts (`draft_model`, `layer_skip`): greedy outputs identical with speculation
on and off, with prefix caching, chunked prefill and both preemption modes; the draft's
own KV bookkeeping is right (a draft that is the target itself gets its drafts accepted:
stale or misplaced draft KV would show as rejections); the memory plan gives every block
room for the draft's KV; and bad configs are refused with a message.

The 6-request quoting workload of test_spec_equivalence, on the embedded SmolLM2-135M."""

from __future__ import annotations

import json

import pytest
import torch
from llmservice.server.config import ConfigError
from llmservice.server.engine.spec_draft import DraftState, scratch_blocks_per_request, valid_prefix

from .test_spec_equivalence import CASES as SPEC_CASES
from .test_spec_equivalence import FAST, plain_outputs, workload

K = 3
# disable_by_batch_size: vLLM's fixed rule, so every step drafts and is verified (the
# measured plan would draft little with a self-draft as slow as the target)
ALWAYS = {"disable_by_batch_size": 4096}
LAYER_SKIP = json.dumps({"method": "layer_skip", "num_layers": 6, "num_speculative_tokens": K, **ALWAYS})
SELF_DRAFT = json.dumps(
    {"method": "draft_model", "model": "builtin:smollm2-135m", "num_speculative_tokens": K, **ALWAYS}
)
CASES = {
    **FAST,
    "swap_bs32": dict(num_gpu_blocks_override=4, block_size=32, max_model_len=128, preemption_mode="swap", swap_space=0.05),
}


@pytest.fixture(scope="module")
def small():
    return workload(n=6)


@pytest.fixture(scope="module")
def small_reference(make_engine, small):
    return plain_outputs(make_engine, small)


def test_the_valid_prefix_stops_at_the_first_changed_token_or_moved_block():
    state = DraftState(tokens=[1, 2, 3, 4, 5], block_ids=[7, 9])
    assert valid_prefix(None, [1, 2, 3], [7]) == 0
    assert valid_prefix(state, [1, 2, 3, 4, 5, 6], [7, 9, 11]) == 5
    assert valid_prefix(state, [1, 2, 8, 4, 5], [7, 9]) == 2  # a rejected draft rolled back
    assert valid_prefix(state, [1, 2, 3, 4, 5], [7, 4]) == 0  # swapped back in elsewhere
    assert scratch_blocks_per_request(3, 16) == 2 and scratch_blocks_per_request(16, 8) == 4


# the default tier runs three pairs (the self-draft checks the bookkeeping under both
# preemption modes); make e2e runs them all, and the 24-request mix below
DEFAULT_TIER = {("layer_skip", "prefix_chunk_7_bs8"), ("draft_model", "recompute_bs32"),
                ("draft_model", "swap_bs32")}  # fmt: skip
PAIRS = [
    pytest.param(m, c, marks=() if (m, c) in DEFAULT_TIER else pytest.mark.e2e)
    for m in ("layer_skip", "draft_model")
    for c in CASES
]


@pytest.mark.parametrize(("method", "case"), PAIRS)
def test_greedy_outputs_identical_with_a_model_draft(make_engine, small, small_reference, case, method):
    config = LAYER_SKIP if method == "layer_skip" else SELF_DRAFT
    eng = make_engine(speculative_config=config, **CASES[case])
    outs = eng.generate(*small)
    assert [o.token_ids for o in outs] == small_reference
    st = eng.speculator.stats
    assert st.num_drafts > 0
    if method == "draft_model":  # the target drafting for itself: nearly every draft holds
        assert st.num_accepted_tokens >= 0.9 * st.num_draft_tokens, (st.num_accepted_tokens, st.num_draft_tokens)
    if "num_gpu_blocks_override" in CASES[case]:
        assert eng.scheduler.stats.num_preemptions > 0
    eng.block_manager.check_invariants()
    assert eng.block_manager.usage == 0.0
    # finished requests reach the proposer with the next step's output: after one more
    # request, nothing of the workload's is kept
    first = set(eng.speculator.proposer.states)
    eng.generate([small[0][0]], [small[1][0]])
    assert not first & set(eng.speculator.proposer.states)


def test_the_memory_plan_gives_each_block_room_for_the_draft(make_engine):
    plain = make_engine(kv_cache_memory_gib=0.05, max_model_len=256)
    drafted = make_engine(kv_cache_memory_gib=0.05, max_model_len=256, speculative_config=LAYER_SKIP)
    per_token = plain.memory_plan.kv_bytes_per_token
    assert drafted.memory_plan.kv_bytes_per_token == per_token + per_token * 6 // 30
    assert drafted.memory_plan.num_blocks < plain.memory_plan.num_blocks


def test_a_draft_as_deep_as_the_target_is_refused(make_engine):
    deep = json.dumps({"method": "layer_skip", "num_layers": 30, "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="num_layers 30 must be below the target's 30 layers"):
        make_engine(speculative_config=deep)


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["layer_skip", "draft_model"])
@pytest.mark.parametrize(
    "overrides",
    [*SPEC_CASES.values(), *(dict(block_size=b, num_gpu_blocks_override=512 // b, max_model_len=256,
                                  preemption_mode="swap", swap_space=0.1, max_num_batched_tokens=128)
                             for b in (8, 128))],  # fmt: skip
)
def test_greedy_outputs_identical_with_a_model_draft_on_the_mixed_workload(make_engine, method, overrides):
    mixed = workload()
    reference = plain_outputs(make_engine, mixed)
    eng = make_engine(speculative_config=LAYER_SKIP if method == "layer_skip" else SELF_DRAFT, **overrides)
    assert [o.token_ids for o in eng.generate(*mixed)] == reference
    assert eng.speculator.stats.num_drafts > 0
    eng.block_manager.check_invariants()
    assert eng.block_manager.usage == 0.0


def test_a_draft_models_weights_are_sized_as_its_tensors_at_the_targets_dtype():
    """The memory plan's draft weights: every tensor of the draft's file, as fp32 or bf16."""
    from types import SimpleNamespace

    from gguf import GGUFReader
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.spec_draft import draft_weight_bytes
    from llmservice.server.model.loader import read_model_info

    path, _, _ = read_model_info("builtin:smollm2-135m")
    elements = sum(int(t.n_elements) for t in GGUFReader(path).tensors)
    draft = json.dumps(
        {"method": "draft_model", "model": "builtin:smollm2-135m", "num_speculative_tokens": 2}
    )
    config = EngineConfig(speculative_config=draft)
    fp32, bf16 = (SimpleNamespace(dtype=d) for d in (torch.float32, torch.bfloat16))
    assert draft_weight_bytes(config, fp32) == 4 * elements
    assert draft_weight_bytes(config, bf16) == 2 * elements
    assert draft_weight_bytes(EngineConfig(speculative_config=LAYER_SKIP), fp32) == 0  # shares the target's
