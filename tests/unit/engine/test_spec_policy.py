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


def test_batch_rates_speculate_where_drafts_bring_more_tokens_per_second():
    rates = spec_policy.BatchRates()
    assert rates.decide(8) is None  # nothing measured: the caller predicts
    rates.observe(8, speculated=False, tokens=8, seconds=0.10)  # 80 tok/s plain
    assert rates.decide(8) is True  # measured plain only: try drafts next
    rates.observe(8, speculated=True, tokens=24, seconds=0.40)  # 60 tok/s: compute-bound
    assert rates.decide(8) is False
    assert rates.decide(1) is None  # each batch size on its own
    rates.observe(1, speculated=True, tokens=3, seconds=0.03)
    assert rates.decide(1) is False  # measured with drafts only: try without next
    rates.observe(1, speculated=False, tokens=1, seconds=0.02)  # 100 vs 50 tok/s
    assert rates.decide(1) is True


def test_batch_rates_try_the_losing_way_again_now_and_then():
    """Acceptance drifts (a request starts quoting): a loss measured once must not stick."""
    rates = spec_policy.BatchRates()
    decisions = []
    for _ in range(3 * spec_policy.RETRY_LOSER_EVERY):
        speculate = rates.decide(4)
        decisions.append(speculate)
        # drafts lose at this size: 4 tokens x 1.5 accepted cost 3x the plain step
        tokens, seconds = (6, 0.03) if speculate else (4, 0.01)
        rates.observe(4, speculated=bool(speculate), tokens=tokens, seconds=seconds)
    tries = sum(1 for d in decisions[2:] if d)
    assert decisions[:2] == [None, True] and 2 <= tries <= 4, decisions


def test_the_speculator_turns_off_at_a_batch_size_measured_to_lose():
    """Decode-only steps fed to the speculator: at batch 8 the steps with drafts gave fewer
    tokens per second, so it drafts nothing there; at batch 1 they gave more."""
    from types import SimpleNamespace

    from llmservice.server.engine.spec_config import parse_speculative_config
    from llmservice.server.engine.spec_decode import Speculator
    from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput

    spec = Speculator(
        parse_speculative_config(json.dumps({"method": "ngram", "num_speculative_tokens": 4})), 1024
    )

    def step(batch: int, drafts: int) -> SchedulerOutput:
        return SchedulerOutput(scheduled=[
            ScheduledRequest(f"r{i}", [7], 10, 0, [], True, spec_token_ids=[5] * drafts)
            for i in range(batch)
        ])  # fmt: skip

    def observe(out: SchedulerOutput, num_tokens: int, seconds: float, on: bool) -> None:
        spec._fed = ((on, 0.0), (False, 0.0))  # the rule's choice for this step (after_step keeps it)
        spec.observe_step(out, num_tokens=num_tokens, seconds=seconds)

    observe(step(8, 0), 8, 0.10, on=False)
    observe(step(8, 4), 24, 0.40, on=True)
    observe(step(1, 0), 1, 0.02, on=False)
    observe(step(1, 0), 1, 0.03, on=True)  # speculating, yet no lookup found a draft
    observe(step(1, 4), 5, 0.03, on=True)
    mixed = step(8, 0)
    mixed.num_prompt_tokens = 64  # a step with prefill is no measure of decoding: ignored
    spec.observe_step(mixed, num_tokens=1, seconds=9.0)
    requests = [SimpleNamespace(num_computed_tokens=10) for _ in range(8)]
    assert spec._batch_pays(requests) is False and spec.stats.batch_off_steps == 1
    assert spec._batch_pays(requests[:1]) is True


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
