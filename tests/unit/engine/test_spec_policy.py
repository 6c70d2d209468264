"""When to speculate (spec_policy.py) and the metrics a speculating engine reports."""

from __future__ import annotations

import json

from llmservice.server.engine import spec_policy
from llmservice.server.engine.core import engine_stats
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.spec_policy import RequestAcceptance
from llmservice.server.metrics import CacheInfo, ServerMetrics


def test_low_acceptance_turns_a_request_off_then_probes_with_growing_backoff():
    track = RequestAcceptance()
    for step in range(1, 6):
        track.observe(drafted=4, accepted=0, step=step)
        if not track.enabled(step + 1):
            break
    off_at = step
    assert not track.enabled(off_at + 1) and track.enabled(off_at + spec_policy.FIRST_BACKOFF_STEPS)
    probe = off_at + spec_policy.FIRST_BACKOFF_STEPS
    track.observe(drafted=4, accepted=0, step=probe)  # the probe fails: twice as long off
    assert not track.enabled(probe + 2 * spec_policy.FIRST_BACKOFF_STEPS - 1)
    assert track.enabled(probe + 2 * spec_policy.FIRST_BACKOFF_STEPS)
    track.observe(drafted=4, accepted=4, step=probe + 16)  # a good probe: on, back-off reset
    assert track.enabled(probe + 17) and track.backoff == spec_policy.FIRST_BACKOFF_STEPS


def test_good_acceptance_stays_on():
    track = RequestAcceptance()
    for step in range(50):
        track.observe(drafted=4, accepted=2, step=step)
        assert track.enabled(step + 1)


def test_speculation_pays_while_the_verify_step_costs_less_than_the_tokens_it_brings():
    assert spec_policy.speculation_pays(plain_step_s=0.010, spec_step_s=0.013, mean_accepted=1.0)
    # compute-bound: 5x the tokens cost ~5x the time, and 2 accepted do not pay for it
    assert not spec_policy.speculation_pays(
        plain_step_s=0.100, spec_step_s=0.480, mean_accepted=2.0
    )


def test_draft_budget_never_drafts_past_max_tokens_or_the_context():
    assert (
        spec_policy.draft_budget(4, num_output=0, max_tokens=10, num_tokens=20, max_model_len=100)
        == 4
    )
    assert (
        spec_policy.draft_budget(4, num_output=8, max_tokens=10, num_tokens=20, max_model_len=100)
        == 1
    )
    assert (
        spec_policy.draft_budget(4, num_output=9, max_tokens=10, num_tokens=20, max_model_len=100)
        == 0
    )
    assert (
        spec_policy.draft_budget(4, num_output=0, max_tokens=50, num_tokens=98, max_model_len=100)
        == 2
    )


def test_drafts_are_cut_to_the_free_blocks_after_every_plain_decode():
    # block 8; request A holds 8 tokens in 1 block (its decode needs a 2nd block), B 3 in 1
    needs = [(8, 1, 4), (3, 1, 6)]
    assert spec_policy.fit_drafts_to_blocks(needs, free_blocks=1, block_size=8) == [4, 4]
    assert spec_policy.fit_drafts_to_blocks(needs, free_blocks=2, block_size=8) == [4, 6]
    assert spec_policy.fit_drafts_to_blocks([(8, 1, 4)], free_blocks=0, block_size=8) == [0]


NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
)


def test_metrics_carry_vllms_spec_decode_counters(make_engine):
    eng = make_engine(speculative_config=NGRAM, max_model_len=256)
    prompt = [int(t) for t in (list(range(300, 340)) * 2)]  # a repeat: the drafts quote it
    eng.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    st = eng.speculator.stats
    assert st.num_drafts > 0 and st.num_accepted_tokens > 0
    metrics = ServerMetrics("m", 256, CacheInfo(16, 100, 0, 0.9))
    metrics.on_stats(engine_stats(eng, stepped=True))
    text = metrics.render().decode()
    assert f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {float(st.num_drafts)}' in text
    assert (
        f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {float(st.num_draft_tokens)}'
        in text
    )
    assert (
        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {float(st.num_accepted_tokens)}'
        in text
    )
    pos0 = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} {float(st.accepted_per_pos[0])}'
    assert pos0 in text
    assert sum(st.accepted_per_pos) == st.num_accepted_tokens
