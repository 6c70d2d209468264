"""The metrics the advisor needs that vLLM does not export (docs/advisor.md).

- `llmservice:prefix_cache_potential_hits_total`: prompt tokens that a prefix cache would
  have served, counted even with the cache off (a bounded sketch of recent block hashes,
  server/engine/prefix_sketch.py): the evidence for turning caching on (rule 3).
- `llmservice:event_loop_lag_seconds`: how late the API event loop wakes a periodic
  probe (server/api/loop_probe.py): tokenizer or other CPU work on the loop (rule 5);
  `llmservice:event_loop_busy_lag_seconds`: the part of it spent on the loop's CPU (not
  a CPU-starved process).
- `llmservice:tokenize_seconds_total` / `llmservice:detokenize_seconds_total`: CPU time
  in the tokenizer (API worker pool) and the incremental detokenizer (engine core).
- `llmservice:engine_config_info`: the scheduler's limits, labelled like vLLM's
  `vllm:cache_config_info`, so `llmservice advise URL` needs no spec file.
- What a preemption costs on this machine (rule 2 prices it): the start-up measurement
  (swap_space.PreemptionCosts), `llmservice:preemption_recompute_seconds_per_token`
  (marginal prefill time per token) and, with swap space, `..._swap_seconds_per_token`
  and `..._swap_fixed_seconds` (a round trip out and back in); and the computed tokens
  the victims held, `llmservice:preempted_tokens_recompute_total` (prefill done again)
  and `llmservice:preempted_tokens_swap_total` (KV copied out and back).
"""

from __future__ import annotations

from typing import Any

from llmservice.server.engine.messages import EngineStats
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LOOP_LAG_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
ENGINE_CONFIG_LABELS = (
    "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enable_prefix_caching", "enable_chunked_prefill", "preemption_mode", "swap_space_gib",
    "gpu_memory_utilization",
)  # fmt: skip


class AdvisorMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        m = {"model_name": model_name}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name"], registry=registry).labels(**m)

        def lag_histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                name, doc, ["model_name"], buckets=LOOP_LAG_BUCKETS, registry=registry
            ).labels(**m)

        self.potential_hits = counter(
            "llmservice:prefix_cache_potential_hits",
            "Prompt tokens a prefix cache would have served (counted with caching on or off).",
        )
        self.loop_lag = lag_histogram(
            "llmservice:event_loop_lag_seconds",
            "How late the API event loop ran a periodic probe, in seconds.",
        )
        self.loop_busy_lag = lag_histogram(
            "llmservice:event_loop_busy_lag_seconds",
            "The part of each probe's lag the event loop's thread spent on the CPU, in seconds.",
        )
        self.tokenize_seconds = counter(
            "llmservice:tokenize_seconds", "Seconds spent tokenizing prompts and chat templates."
        )
        self.detokenize_seconds = counter(
            "llmservice:detokenize_seconds", "Seconds spent in the incremental detokenizer."
        )
        self._engine_info = Gauge(
            "llmservice:engine_config_info", "The engine's scheduler and cache configuration.",
            list(ENGINE_CONFIG_LABELS), registry=registry,
        )
        self.preempted_recompute = counter(
            "llmservice:preempted_tokens_recompute",
            "Computed tokens of requests preempted by recompute (prefilled again on resume).",
        )
        self.preempted_swap = counter(
            "llmservice:preempted_tokens_swap",
            "Computed tokens of requests preempted by swap (KV copied to CPU and back).",
        )
        self._cost_gauges = {
            key: Gauge(f"llmservice:preemption_{key}", doc, ["model_name"], registry=registry)
            for key, doc in (
                ("recompute_seconds_per_token", "Measured marginal prefill seconds per recomputed token."),
                ("swap_seconds_per_token", "Measured seconds per token of a swap round trip (out and in)."),
                ("swap_fixed_seconds", "Measured fixed seconds of a swap round trip, however few tokens."),
            )
        }  # fmt: skip
        self._model = model_name
        # the engine's cumulative totals, by counter: each report adds what is new
        self._totals: dict[str, float] = {}

    def set_engine_config(self, config: Any) -> None:
        """From a resolved EngineConfig (max_model_len and max_num_batched_tokens filled)."""
        labels = {
            "block_size": config.block_size,
            "max_model_len": config.max_model_len,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enable_prefix_caching": config.enable_prefix_caching,
            "enable_chunked_prefill": config.enable_chunked_prefill,
            "preemption_mode": config.preemption_mode,
            "swap_space_gib": config.swap_space,
            "gpu_memory_utilization": config.gpu_memory_utilization,
        }
        self._engine_info.labels(**{k: str(v) for k, v in labels.items()}).set(1)

    def set_preemption_costs(
        self, recompute_s_per_token: float | None, swap_s_per_token: float | None, swap_fixed_s: float | None
    ) -> None:
        """The start-up measurement; a cost that was not measured is not exported at all
        (no swap space: no swap gauges), so a reader never mistakes a 0 for a price."""
        for key, value in (
            ("recompute_seconds_per_token", recompute_s_per_token),
            ("swap_seconds_per_token", swap_s_per_token),
            ("swap_fixed_seconds", swap_fixed_s),
        ):
            if value is not None:
                self._cost_gauges[key].labels(model_name=self._model).set(value)

    def on_engine_totals(self, stats: EngineStats) -> None:
        """The engine's cumulative counts after a step: add what is new."""
        for name, counter, total in (
            ("potential_hits", self.potential_hits, stats.prefix_potential_hits),
            ("detokenize_seconds", self.detokenize_seconds, stats.detokenize_seconds),
            ("preempted_recompute", self.preempted_recompute, stats.preempted_tokens_recompute),
            ("preempted_swap", self.preempted_swap, stats.preempted_tokens_swap),
        ):
            last = self._totals.get(name, 0)
            counter.inc(max(0, total - last))
            self._totals[name] = max(last, total)
