"""The advisor's rules, by table: each fires on a snapshot built from its seed case and
stays silent on a well-configured service (seed 000, docs/advisor.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llmservice.operator.advisor import rules
from llmservice.operator.advisor.engine_settings import EngineSettings
from llmservice.operator.advisor.snapshot import Histogram, Scrape, Snapshot

TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]
LAG_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
LAG_BUSY = LAG_BUCKETS


def hist(observations: list[tuple[float, int]], buckets: list[float]) -> Histogram:
    """A histogram holding `count` observations of each `value`."""
    edges = [*map(float, buckets), float("inf")]
    cumulative = tuple((le, float(sum(n for v, n in observations if v <= le))) for le in edges)
    return Histogram(cumulative, float(sum(n for _, n in observations)), float(sum(v * n for v, n in observations)))


def snapshot(
    *,
    requests: int = 100,
    prompt: float = 300,
    gen: float = 200,
    preemptions: float = 0,
    kv: tuple[float, float] = (0.4, 0.5),
    running: tuple[float, float] = (20, 24),
    waiting: tuple[float, float] = (0, 0),
    potential_hits: float = 0,
    prefix_queries: float | None = None,
    lag_slow: int = 0,
    oom: int = 0,
    seconds: float = 60,
) -> Snapshot:
    """Before: a page with the gauges' first values and empty counters; after: the window."""
    before = Scrape(
        {"vllm:num_preemptions_total": 3.0, "vllm:prompt_tokens_total": 1000.0,
         rules.POTENTIAL_HITS: 10.0, "vllm:prefix_cache_queries_total": 1000.0,
         "vllm:kv_cache_usage_perc": kv[0], "vllm:num_requests_running": running[0],
         "vllm:num_requests_waiting": waiting[0]},
        {"vllm:request_prompt_tokens": hist([], TOKEN_BUCKETS),
         "vllm:request_generation_tokens": hist([], TOKEN_BUCKETS),
         rules.LOOP_LAG: hist([], LAG_BUCKETS)},
    )
    prompt_total = requests * prompt
    queries = prompt_total if prefix_queries is None else prefix_queries
    after = Scrape(
        {"vllm:num_preemptions_total": 3.0 + preemptions,
         "vllm:prompt_tokens_total": 1000.0 + prompt_total,
         rules.POTENTIAL_HITS: 10.0 + potential_hits,
         "vllm:prefix_cache_queries_total": 1000.0 + queries,
         "vllm:kv_cache_usage_perc": kv[1], "vllm:num_requests_running": running[1],
         "vllm:num_requests_waiting": waiting[1]},
        {"vllm:request_prompt_tokens": hist([(prompt, requests)], TOKEN_BUCKETS),
         "vllm:request_generation_tokens": hist([(gen, requests)], TOKEN_BUCKETS),
         rules.LOOP_LAG: hist([(0.0003, 600 - lag_slow), (0.008, lag_slow)], LAG_BUCKETS)},
    )
    return Snapshot(before, after, seconds, oom_restarts=oom)


GOOD = EngineSettings(
    block_size=16, max_model_len=4096, max_num_seqs=128, max_num_batched_tokens=8192,
    enable_prefix_caching=True, enable_chunked_prefill=True, preemption_mode="recompute",
    swap_space_gib=4, gpu_memory_utilization=0.9, num_gpu_blocks=40000,
)

# (case, snapshot, settings, rule expected, what the recommendation must say)
SEED_CASES = [
    ("1: e-commerce bot, 15-20 token answers at block 32, KV full at 12 running",
     snapshot(prompt=60, gen=18, kv=(0.97, 0.99), running=(12, 12)),
     replace(GOOD, block_size=32), "block-size", {"engine": {"blockSize": 16}}),
    ("1: 8000-token outputs at block 8",
     snapshot(prompt=200, gen=8000),
     replace(GOOD, block_size=8, max_model_len=16384), "block-size", {"engine": {"blockSize": 64}}),
    ("2: 12k-token documents under recompute",
     snapshot(prompt=12000, gen=300, preemptions=30),
     replace(GOOD, max_model_len=16384), "preemptions",
     {"engine": {"preemptionMode": "auto", "swapSpaceGiB": 4.0}}),
    ("2: short prompts, long outputs, cache too small for maxNumSeqs",
     snapshot(prompt=150, gen=800, preemptions=20),
     replace(GOOD, num_gpu_blocks=1000), "preemptions", {"engine": {"maxNumSeqs": 16}}),
    ("3: 1500-token shared system prompt, caching off",
     snapshot(prompt=1600, potential_hits=100 * 1488, prefix_queries=0),
     replace(GOOD, enable_prefix_caching=False), "prefix-caching-off",
     {"engine": {"enablePrefixCaching": True}}),
    ("4: maxModelLen 32768 for 200-token requests, 4 full-length requests fit",
     snapshot(prompt=150, gen=50),
     replace(GOOD, max_model_len=32768, max_num_batched_tokens=32768, num_gpu_blocks=8192,
             max_num_seqs=64, enable_chunked_prefill=False),
     "max-model-len",
     {"engine": {"maxModelLen": 256, "maxNumBatchedTokens": 2048, "enableChunkedPrefill": True}}),
    ("5: tokenizer on the event loop, 8 ms stalls",
     snapshot(lag_slow=30), GOOD, "event-loop-blocked",
     {"engine": {"extraArgs": ["--tokenizer-workers", "4"]}}),
    ("6: gpuMemoryUtilization 0.95 with an OOMKilled restart",
     snapshot(oom=1), replace(GOOD, gpu_memory_utilization=0.95), "gpu-memory-utilization",
     {"resources": {"gpuMemoryUtilization": 0.9}}),
    ("6: queue with a quarter-full cache: maxNumSeqs is the cap",
     snapshot(waiting=(6, 9), kv=(0.2, 0.25), running=(8, 8)),
     replace(GOOD, max_num_seqs=8), "waiting-with-free-kv", {"engine": {"maxNumSeqs": 16}}),
    ("6: queue with a free cache below maxNumSeqs: the token budget is the cap",
     snapshot(waiting=(3, 4), kv=(0.1, 0.2), running=(5, 6)),
     replace(GOOD, max_num_batched_tokens=512), "waiting-with-free-kv",
     {"engine": {"maxNumBatchedTokens": 1024}}),
]


@pytest.mark.parametrize(("case", "snap", "settings", "rule", "patch"), SEED_CASES, ids=[c[0] for c in SEED_CASES])
def test_each_seed_case_gets_exactly_its_rule(case, snap, settings, rule, patch):
    found = rules.evaluate(snap, settings)
    assert [f.rule for f in found] == [rule], case
    finding = found[0]
    assert finding.recommendation == patch
    assert finding.evidence and finding.expected_effect["arithmetic"]
    assert finding.severity in (rules.WARNING, rules.INFO)
    as_dict = finding.to_dict()
    assert set(as_dict) == {"rule", "severity", "summary", "evidence", "recommendation", "expectedEffect"}


def test_a_well_configured_service_gets_no_finding():
    assert rules.evaluate(snapshot(), GOOD) == []


def test_the_good_service_stays_silent_with_each_rule_near_its_threshold():
    """Just under each threshold: no rule fires (the thresholds are strict)."""
    near = [
        snapshot(gen=51, prompt=60),  # block 32 is fine for 51-token answers
        snapshot(preemptions=5),  # 5/min is the limit, not over it
        snapshot(potential_hits=0.3 * 100 * 300, prefix_queries=0),  # 30 %, caching off
        snapshot(lag_slow=6),  # 1 % of probes over 5 ms: p99 is 5 ms
        snapshot(waiting=(0, 5), kv=(0.1, 0.1)),  # waited once, not throughout
    ]
    settings = replace(GOOD, block_size=32, enable_prefix_caching=False)
    for snap in near:
        assert rules.evaluate(snap, settings) == []


def test_loop_lag_from_a_cpu_starved_process_is_not_the_event_loop_rule():
    snap = snapshot(lag_slow=30)
    starved = Scrape({**snap.after.values}, {**snap.after.histograms, rules.LOOP_BUSY_LAG: hist([(0.0002, 600)], LAG_BUSY)})
    busy = Scrape({**snap.after.values}, {**snap.after.histograms, rules.LOOP_BUSY_LAG: hist([(0.0002, 570), (0.008, 30)], LAG_BUSY)})
    assert rules.event_loop_rule(Snapshot(snap.before, starved, 60), GOOD) is None
    found = rules.event_loop_rule(Snapshot(snap.before, busy, 60), GOOD)
    assert found is not None and found.evidence["busyLagP99Seconds"] > 0.005


def test_block_size_waste_arithmetic():
    found = rules.block_size_rule(snapshot(prompt=0, gen=10), replace(GOOD, block_size=32))
    assert found is not None
    # tail (32-1)/2 = 15.5 slots on 10 tokens: 15.5 / 25.5 = 0.608
    assert found.evidence["kvWasteShare"] == pytest.approx(0.608, abs=1e-3)
    assert found.evidence["kvFullWhileBatchSmall"] is False
    # block 16: 7.5 / 17.5; requests per pool 25.5 / 17.5
    assert found.expected_effect["kvWasteShare"] == pytest.approx(0.429, abs=1e-3)
    assert found.expected_effect["concurrentRequestsFactor"] == pytest.approx(25.5 / 17.5, abs=1e-3)


def test_block_size_says_when_the_cache_is_full_but_the_batch_small():
    snap = snapshot(prompt=60, gen=18, kv=(0.97, 0.99), running=(12, 12))
    found = rules.block_size_rule(snap, replace(GOOD, block_size=32))
    assert found is not None and found.evidence["kvFullWhileBatchSmall"] is True


def test_too_few_requests_is_not_evidence():
    snap = snapshot(requests=rules.MIN_REQUESTS - 1, prompt=60, gen=18)
    assert rules.evaluate(snap, replace(GOOD, block_size=32)) == []


def test_a_rule_whose_settings_are_unknown_stays_silent():
    snap = snapshot(prompt=60, gen=18)
    assert rules.block_size_rule(snap, EngineSettings()) is None
    assert rules.max_model_len_rule(snapshot(prompt=150, gen=50), EngineSettings(max_model_len=32768)) is None


def test_prefix_caching_off_is_inferred_from_no_lookups_when_the_setting_is_unknown():
    snap = snapshot(prompt=1600, potential_hits=100 * 1488, prefix_queries=0)
    found = rules.prefix_caching_rule(snap, replace(GOOD, enable_prefix_caching=None))
    assert found is not None and found.evidence["potentialHitShare"] == pytest.approx(0.93, abs=1e-2)
    with_lookups = snapshot(prompt=1600, potential_hits=100 * 1488)
    assert rules.prefix_caching_rule(with_lookups, replace(GOOD, enable_prefix_caching=None)) is None


def test_max_model_len_silent_when_full_length_requests_still_fill_max_num_seqs():
    snap = snapshot(prompt=150, gen=50)
    plenty = replace(GOOD, max_model_len=32768, num_gpu_blocks=32768 * 128 // 16)
    assert rules.max_model_len_rule(snap, plenty) is None


def test_a_counter_reset_counts_the_new_value_as_the_increase():
    before = Scrape({"vllm:num_preemptions_total": 500.0})
    after = Scrape({"vllm:num_preemptions_total": 12.0})
    assert Snapshot(before, after, 60).per_minute("vllm:num_preemptions_total") == 12.0


def test_warnings_sort_before_info():
    snap = snapshot(prompt=200, gen=8000, waiting=(2, 2), kv=(0.1, 0.1), running=(6, 6))
    found = rules.evaluate(snap, replace(GOOD, block_size=8, max_model_len=16384, max_num_seqs=6,
                                         gpu_memory_utilization=0.95, num_gpu_blocks=None))
    assert [f.severity for f in found] == sorted((f.severity for f in found), key=rules.SEVERITY_ORDER.get)


def _priced(snap: Snapshot, recompute_tokens: float, swap_tokens: float, swap: bool) -> Snapshot:
    """`snap` with our engine's preemption prices on both pages (stock vLLM has none)."""
    gauges = {rules.RECOMPUTE_S_PER_TOKEN: 0.002}
    if swap:
        gauges |= {rules.SWAP_S_PER_TOKEN: 0.0001, rules.SWAP_FIXED_S: 0.01}
    before = {rules.PREEMPTED_RECOMPUTE: 500.0, rules.PREEMPTED_SWAP: 0.0, **gauges}
    after = {rules.PREEMPTED_RECOMPUTE: 500.0 + recompute_tokens, rules.PREEMPTED_SWAP: swap_tokens, **gauges}
    return Snapshot(
        Scrape({**snap.before.values, **before}, snap.before.histograms),
        Scrape({**snap.after.values, **after}, snap.after.histograms),
        snap.seconds,
    )


def test_preemptions_are_priced_with_the_engines_measured_costs():
    """12k-token documents, 30 preemptions/min under recompute, 300k tokens redone in the
    minute at a measured 2 ms/token: 600 s of prefill per minute, next to what swap
    (10 ms + 0.1 ms/token, measured) would take: 30 x 0.01 + 300000 x 0.0001 = 30.3 s."""
    snap = _priced(snapshot(prompt=12000, gen=300, preemptions=30), 300_000, 0, swap=True)
    (f,) = rules.evaluate(snap, replace(GOOD, max_model_len=16384))
    assert f.rule == "preemptions" and f.recommendation["engine"]["preemptionMode"] == "auto"
    assert f.evidence["preemptedTokensPerMinute"] == 300_000
    assert f.evidence["tokensPerPreemption"] == 10_000
    assert f.evidence["measuredRecomputeSecondsPerMinute"] == 600.0
    assert f.evidence["measuredSwapSecondsPerMinute"] == 30.3
    assert f.expected_effect["recomputeSecondsPerMinute"] == 600.0
    assert "re-prefilling them all costs 600.00 s per minute" in f.expected_effect["arithmetic"]
    assert "30.30 s/min" in f.expected_effect["arithmetic"]


def test_without_swap_space_only_the_recompute_price_is_given():
    snap = _priced(snapshot(prompt=150, gen=800, preemptions=20), 6000, 0, swap=False)
    (f,) = rules.evaluate(snap, replace(GOOD, num_gpu_blocks=1000))
    assert f.recommendation == {"engine": {"maxNumSeqs": 16}}
    assert f.evidence["measuredRecomputeSecondsPerMinute"] == 12.0
    assert "measuredSwapSecondsPerMinute" not in f.evidence
    assert f.expected_effect["recomputeSecondsPerMinuteSaved"] == 12.0
    assert "swapping" not in f.expected_effect["arithmetic"]


def test_stock_vllm_preemptions_carry_no_price():
    (f,) = rules.evaluate(snapshot(prompt=150, gen=800, preemptions=20), replace(GOOD, num_gpu_blocks=1000))
    assert "measuredRecomputeSecondsPerMinute" not in f.evidence
    assert "measured" not in f.expected_effect["arithmetic"]
