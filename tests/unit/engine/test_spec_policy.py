"""When to speculate (spec_policy.py) and the metrics a speculating engine reports."""

from __future__ import annotations

import json

import pytest
from llmservice.server.engine import spec_policy
from llmservice.server.engine.core import engine_stats
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.spec_config import parse_speculative_config
from llmservice.server.engine.spec_decode import Speculator
from llmservice.server.engine.spec_policy import AcceptanceByPosition, StepTimes
from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput
from llmservice.server.metrics import CacheInfo, ServerMetrics


def test_acceptance_counts_only_the_positions_a_verification_reached():
    track = AcceptanceByPosition([0.5, 0.5, 0.5, 0.5])
    track.observe(drafted=4, accepted=1, weight=0.5)  # 1st accepted, 2nd rejected, 3rd-4th unseen
    assert track.p == [0.75, 0.25, 0.5, 0.5]
    track.observe(drafted=2, accepted=2, weight=0.5)  # both accepted; nothing past the draft
    assert track.p == [0.875, 0.625, 0.5, 0.5]
    assert track.gains(3) == [0.875, 0.875 * 0.625, 0.875 * 0.625 * 0.5]


def test_step_times_interpolate_and_explore_the_unmeasured_row_counts():
    times = StepTimes()
    assert times.estimator(step=0) is None  # nothing measured: the plan drafts to measure
    times.observe(rows=8, seconds=0.040, step=1)
    times.observe(rows=40, seconds=0.200, step=2)
    est = times.estimator(step=2)
    assert est(8) == 0.040 and est(24) == pytest.approx(0.120)
    assert est(4) == pytest.approx(0.020)  # fewer rows than measured: proportionally less
    assert est(60) == 0.200  # more than measured: as much as the largest (tried once)
    times.observe(rows=8, seconds=0.080, step=3)  # an EWMA, not the last sample
    assert times.estimator(step=3)(8) == pytest.approx(0.7 * 0.040 + 0.3 * 0.080)
    # a row count not measured for STALE_STEPS steps is forgotten
    later = times.estimator(step=2 + spec_policy.STALE_STEPS + 1)
    assert later(40) == times.seconds[8]  # 40 rows unmeasured again: tried once more


def test_plan_drafts_everything_while_steps_are_memory_bound():
    # 5 rows cost what 1 row does: every draft with any chance is worth it
    lengths = spec_policy.plan_drafts([[0.9, 0.8, 0.6, 0.3]], lambda rows: 0.010)
    assert lengths == [4]


def test_plan_drafts_nothing_when_rows_cost_their_share():
    # compute-bound: each row costs as much as a plain decode's; no draft brings a whole token
    lengths = spec_policy.plan_drafts([[0.9, 0.8, 0.7, 0.6]] * 8, lambda rows: 0.005 * rows)
    assert lengths == [0] * 8


def test_plan_gives_drafts_to_the_requests_whose_drafts_get_accepted():
    # a step costs 10 ms plus 1 ms a row: cheap rows, but not free
    gains = [[0.95, 0.9, 0.85, 0.8], [0.05, 0.01, 0.0, 0.0], [0.9, 0.6, 0.02, 0.0]]
    lengths = spec_policy.plan_drafts(gains, lambda rows: 0.010 + 0.001 * rows)
    assert lengths == [4, 0, 2]


def test_a_draft_models_passes_shorten_the_drafts():
    gains = [[0.9, 0.8, 0.6, 0.4]]
    free = spec_policy.plan_drafts(gains, lambda rows: 0.010, round_seconds=0.0)
    costly = spec_policy.plan_drafts(gains, lambda rows: 0.010, round_seconds=0.004)
    assert free == [4] and 0 < costly[0] < 4


def test_plan_needs_a_clear_gain_to_draft_at_all():
    # 1 row 10 ms, 2 rows 10.9 ms; a draft accepted 1 time in 10 promises 1 %: not enough
    times = lambda rows: 0.010 if rows == 1 else 0.0109  # noqa: E731
    assert spec_policy.plan_drafts([[0.1]], times) == [0]
    assert spec_policy.plan_drafts([[0.5]], times) == [1]


def _speculator(k: int = 4) -> Speculator:
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1}
    return Speculator(parse_speculative_config(json.dumps(config)), 1024)


class _Pool:
    num_free_blocks, block_size = 1000, 16

    def block_ids(self, request_id: str) -> list[int]:
        return [0]


def _decoding(rid: str, tokens: list[int]) -> Request:
    req = Request(rid, list(tokens), SamplingParams(temperature=0, max_tokens=100), max_tokens=100)
    req.num_computed_tokens = len(tokens) - 1
    return req


def _step(requests: list[Request]) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[
        ScheduledRequest(r.request_id, [7], 10, 0, [], True, spec_token_ids=list(r.spec_token_ids))
        for r in requests
    ])  # fmt: skip


def test_the_speculator_stops_drafting_where_measured_steps_say_rows_cost_their_share():
    """Decode-only steps fed to the speculator: at 8 requests each row costs its share
    (compute-bound), so it drafts nothing there; at 1, five rows cost what one does."""
    spec = _speculator()
    repeat = [5, 6, 7, 8] * 10  # every lookup finds a draft
    batch = [_decoding(f"r{i}", repeat) for i in range(8)]
    spec.propose(batch, _Pool())
    assert all(len(r.spec_token_ids) == 4 for r in batch)  # nothing measured: draft, measure
    spec.observe_step(_step(batch), seconds=0.200)  # 40 rows
    spec.propose(batch, _Pool())  # fewer rows are explored: the plain step
    assert all(not r.spec_token_ids for r in batch)
    spec.observe_step(_step(batch), seconds=0.040)  # 8 rows: 5 ms a row either way
    for _ in range(3):
        spec.propose(batch, _Pool())
        assert all(not r.spec_token_ids for r in batch)
    assert spec.stats.batch_off_steps == 4
    mixed = _step(batch)
    mixed.num_prompt_tokens = 64  # a step with prefill is no measure of decoding: ignored
    spec.observe_step(mixed, seconds=9.0)
    one = [_decoding("solo", repeat)]
    spec.observe_step(_step(one), seconds=0.040)  # 1 row as slow as 8 and 40: memory-bound
    spec.propose(one, _Pool())
    assert one[0].spec_token_ids == [5, 6, 7, 8]
    assert spec.step_times.seconds[8] == 0.040  # the mixed step left no trace


def test_a_request_whose_drafts_are_rejected_stops_drafting_and_is_probed_later():
    spec = _speculator()
    repeat = [5, 6, 7, 8] * 10
    good, bad = _decoding("good", repeat), _decoding("bad", repeat)
    spec.step_times.observe(2, 0.010, 0)  # a step costs 10 ms plus 1 ms a draft
    spec.step_times.observe(10, 0.018, 0)
    drafted_good, drafted_bad = [], []
    for _ in range(60):
        spec.propose([good, bad], _Pool())
        drafted_good.append(len(good.spec_token_ids))
        drafted_bad.append(len(bad.spec_token_ids))
        tokens = {"good": [0] * (1 + len(good.spec_token_ids)), "bad": [0]}  # bad: none accepted
        spec.observe(_step([good, bad]), tokens)
    assert all(n == 4 for n in drafted_good[5:])  # all accepted: the full draft pays
    assert drafted_bad[0] > 0  # a new request starts from the engine's estimate
    off = drafted_bad.index(0)
    assert off <= 4 and drafted_bad[off : off + 5] == [0] * 5
    probes = [n for n in drafted_bad[off:] if n]  # relaxed toward the engine's acceptance
    assert 2 <= len(probes) <= len(drafted_bad[off:]) // 4 and max(probes) == 1


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
