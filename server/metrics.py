"""Prometheus metrics with vLLM's names, types, labels and buckets (docs/metrics.md).

The operator's autoscaler, Grafana dashboards built for vLLM and the Gateway API
Inference Extension read these names, so they must match vLLM exactly. Engine-wide
gauges and counters are refreshed from every engine step's stats; per-request latency
histograms are observed in the API process when a token arrives (vLLM measures TTFT
from the frontend's arrival time too).

`vllm:time_per_output_token_seconds` is observed once per request (its mean time per
output token after the first, the benchmark's TPOT); `vllm:inter_token_latency_seconds`
is observed for every gap between two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import prometheus_client
from llmservice.server.advisor_metrics import AdvisorMetrics
from llmservice.server.engine.messages import EngineStats
from llmservice.server.lora_metrics import LoRAMetrics
from llmservice.server.spec_metrics import SpecMetrics
from llmservice.server.step_metrics import StepMetrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
TPOT_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]

FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass
class CacheInfo:
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    gpu_memory_utilization: float


class ServerMetrics:
    """All metrics of one server, in their own registry (tests may build several)."""

    def __init__(self, model_name: str, max_model_len: int, cache: CacheInfo, registry: CollectorRegistry | None = None,
                 max_loras: int = 0):
        prometheus_client.disable_created_metrics()  # vLLM exports no *_created series
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ["model_name"]
        m = {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(**m)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(**m)

        def histogram(name: str, doc: str, buckets: list) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**m)

        self.num_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.num_swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.gpu_usage = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (alias of vllm:kv_cache_usage_perc).")
        self.cpu_usage = gauge("vllm:cpu_cache_usage_perc", "CPU (swap) KV-cache usage. 1 means 100 percent usage.")
        Gauge(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            ["block_size", "num_gpu_blocks", "num_cpu_blocks", "gpu_memory_utilization"],
            registry=r,
        ).labels(
            block_size=str(cache.block_size),
            num_gpu_blocks=str(cache.num_gpu_blocks),
            num_cpu_blocks=str(cache.num_cpu_blocks),
            gpu_memory_utilization=str(cache.gpu_memory_utilization),
        ).set(1)

        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.external_prefix_hits = counter(
            "vllm:external_prefix_cache_hits",
            "Prefix cache hits served by the host tier (--kv-offloading-size), in tokens.",
        )
        success = Counter(
            "vllm:request_success", "Count of finished requests by finish reason.",
            ["model_name", "finished_reason"], registry=r,
        )
        self.request_success = {reason: success.labels(model_name=model_name, finished_reason=reason) for reason in FINISH_REASONS}

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Mean time per output token of a request, in seconds.", TPOT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two consecutive tokens, in seconds.", TPOT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Time spent waiting before first scheduling, in seconds.", REQUEST_LATENCY_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens per request.", token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens", "Number of generation tokens per request.", token_buckets)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Number of tokens computed per engine step.", ITERATION_TOKENS_BUCKETS)

        self.advisor = AdvisorMetrics(r, model_name)  # what the advisor reads beyond vLLM's names
        self.steps = StepMetrics(r, model_name)  # the step-time budget (server/step_metrics.py)
        self.spec = SpecMetrics(r, model_name)  # speculative decoding (server/spec_metrics.py)
        self.lora = LoRAMetrics(r, max_loras) if max_loras else None  # --enable-lora (server/lora_metrics.py)
        # sleep mode: the operator's scale-to-zero by sleeping reads which pods sleep (docs/cold-start.md)
        self.sleep_level = gauge("llmservice:engine_sleep_level",
                                 "Sleep mode: 0 awake, 1 KV freed and weights in host memory, 2 weights discarded.")
        self._last = EngineStats()

    # ---- engine-wide, every step ---------------------------------------------------------
    def on_stats(self, stats: EngineStats) -> None:
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.num_swapped.set(stats.num_swapped)
        self.kv_usage.set(stats.kv_cache_usage)
        self.gpu_usage.set(stats.kv_cache_usage)
        self.cpu_usage.set(stats.cpu_cache_usage)
        last = self._last
        self.preemptions.inc(max(0, stats.num_preemptions - last.num_preemptions))
        self.prefix_queries.inc(max(0, stats.prefix_queries - last.prefix_queries))
        self.prefix_hits.inc(max(0, stats.prefix_hits - last.prefix_hits))
        self.external_prefix_hits.inc(max(0, stats.prefix_host_hits - last.prefix_host_hits))
        if stats.step_tokens:
            self.iteration_tokens.observe(stats.step_tokens)
        self.advisor.on_engine_totals(stats)
        self.steps.on_stats(stats)
        self.spec.on_totals(stats.spec_decode)
        if self.lora is not None:
            self.lora.on_adapters(stats.lora_running, stats.lora_waiting)
        self._last = stats

    # ---- per request, as its tokens arrive -------------------------------------------------
    def on_first_token(self, ttft_s: float, num_prompt_tokens: int) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(num_prompt_tokens)

    def on_tokens(self, num_tokens: int, gap_s: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if gap_s is not None:
            self.itl.observe(gap_s)

    def on_finish(
        self,
        reason: str,
        e2e_s: float,
        queue_s: float | None,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        tpot_s: float | None,
    ) -> None:
        self.request_success[reason if reason in self.request_success else "abort"].inc()
        self.e2e.observe(e2e_s)
        if queue_s is not None:
            self.queue_time.observe(max(0.0, queue_s))
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_generation_tokens)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
