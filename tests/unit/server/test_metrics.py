"""The metric contract (docs/metrics.md): vLLM's names, types, labels and buckets."""

from __future__ import annotations

from llmservice.server.engine.messages import EngineStats
from llmservice.server.metrics import (
    ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    CacheInfo,
    ServerMetrics,
    build_1_2_5_buckets,
)
from prometheus_client.parser import text_string_to_metric_families

GAUGES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_swapped",
    "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:cache_config_info",
}
COUNTERS = {
    "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits", "vllm:external_prefix_cache_hits", "vllm:request_success",
    # speculative decoding (vLLM v1's names; zero until a speculator runs)
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:time_per_output_token_seconds": TPOT_BUCKETS,
    "vllm:inter_token_latency_seconds": TPOT_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_prompt_tokens": build_1_2_5_buckets(512),
    "vllm:request_generation_tokens": build_1_2_5_buckets(512),
    "vllm:iteration_tokens_total": ITERATION_TOKENS_BUCKETS,
}


def _metrics() -> ServerMetrics:
    return ServerMetrics("m", 512, CacheInfo(16, 100, 7, 0.9))


def _families(m: ServerMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.render().decode())}


def test_names_types_and_labels():
    # vLLM's names; ours (llmservice:*, for the advisor) are in test_advisor_metrics.py
    fams = {n: f for n, f in _families(_metrics()).items() if n.startswith("vllm:")}
    assert {n for n, f in fams.items() if f.type == "gauge"} == GAUGES
    assert {n for n, f in fams.items() if f.type == "counter"} == COUNTERS
    assert {n for n, f in fams.items() if f.type == "histogram"} == set(HISTOGRAMS)
    for name, fam in fams.items():
        for sample in fam.samples:
            if name == "vllm:cache_config_info":
                assert sample.labels == {"block_size": "16", "num_gpu_blocks": "100", "num_cpu_blocks": "7",
                                         "gpu_memory_utilization": "0.9"}
            elif name == "vllm:request_success":
                assert set(sample.labels) == {"model_name", "finished_reason"}
            else:
                assert sample.labels.get("model_name") == "m"
    text = _metrics().render().decode()
    assert "vllm:num_preemptions_total{" in text and "_created" not in text


def test_histogram_buckets_are_vllms():
    fams = _families(_metrics())
    for name, buckets in HISTOGRAMS.items():
        les = [s.labels["le"] for s in fams[name].samples if s.name.endswith("_bucket")]
        assert [float(x) for x in les[:-1]] == [float(b) for b in buckets], name
        assert les[-1] == "+Inf"


def test_1_2_5_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(64) == [1, 2, 5, 10, 20, 50]


def test_step_stats_drive_gauges_and_counter_deltas():
    m = _metrics()
    m.on_stats(EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, num_preemptions=4,
                           prefix_queries=100, prefix_hits=32, step_tokens=40))
    m.on_stats(EngineStats(num_running=1, kv_cache_usage=0.5, num_preemptions=6, prefix_queries=150,
                           prefix_hits=48, step_tokens=None))
    v = {s.name: s.value for f in _families(m).values() for s in f.samples}
    assert v["vllm:num_requests_running"] == 1 and v["vllm:num_requests_waiting"] == 0
    assert v["vllm:kv_cache_usage_perc"] == v["vllm:gpu_cache_usage_perc"] == 0.5
    assert v["vllm:num_preemptions_total"] == 6
    assert v["vllm:prefix_cache_queries_total"] == 150 and v["vllm:prefix_cache_hits_total"] == 48
    assert v["vllm:iteration_tokens_total_count"] == 1 and v["vllm:iteration_tokens_total_sum"] == 40


def test_request_observations():
    m = _metrics()
    m.on_first_token(0.05, 12)
    m.on_tokens(1, None)
    m.on_tokens(1, 0.02)
    m.on_finish("length", 0.2, 0.01, 12, 2, 0.02)
    m.on_finish("abort", 0.1, None, 5, 0, None)
    samples = [s for f in _families(m).values() for s in f.samples]
    v = {(s.name, s.labels.get("finished_reason")): s.value for s in samples}
    assert v[("vllm:prompt_tokens_total", None)] == 12
    assert v[("vllm:generation_tokens_total", None)] == 2
    assert v[("vllm:request_success_total", "length")] == 1
    assert v[("vllm:request_success_total", "abort")] == 1
    assert v[("vllm:inter_token_latency_seconds_count", None)] == 1
    assert v[("vllm:request_queue_time_seconds_count", None)] == 1
    assert v[("vllm:time_per_output_token_seconds_count", None)] == 1
