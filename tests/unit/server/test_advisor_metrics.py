"""The server's metrics for the advisor: exported names, the engine config info gauge,
the event loop probe and the test-only slow-tokenizer hook."""

from __future__ import annotations

import asyncio
import time

import pytest
from llmservice.operator.advisor import engine_settings
from llmservice.operator.advisor.snapshot import parse
from llmservice.server.api import tokenizer_service
from llmservice.server.api.loop_probe import probe_event_loop
from llmservice.server.config import EngineConfig
from llmservice.server.engine.messages import EngineStats
from llmservice.server.metrics import CacheInfo, ServerMetrics


def test_advisor_metrics_are_exported_and_read_back_as_settings():
    m = ServerMetrics("m", 4096, CacheInfo(32, 500, 0, 0.9))
    cfg = EngineConfig(model="builtin:smollm2-135m", block_size=32, max_num_seqs=64,
                       enable_prefix_caching=False).resolve_lengths(4096)
    m.advisor.set_engine_config(cfg)
    m.on_stats(EngineStats(prefix_potential_hits=320, detokenize_seconds=0.5, preempted_tokens_recompute=100))
    m.on_stats(EngineStats(prefix_potential_hits=480, detokenize_seconds=0.75, preempted_tokens_recompute=250,
                           preempted_tokens_swap=64))
    m.advisor.set_preemption_costs(0.004, None, None)  # no swap space: swap was not measured
    m.advisor.loop_lag.observe(0.003)
    m.advisor.tokenize_seconds.inc(0.25)
    page = parse(m.render().decode())
    assert page.value("llmservice:prefix_cache_potential_hits_total") == 480
    assert page.value("llmservice:detokenize_seconds_total") == 0.75
    assert page.value("llmservice:tokenize_seconds_total") == 0.25
    assert page.histograms["llmservice:event_loop_lag_seconds"].count == 1
    assert page.value("llmservice:preempted_tokens_recompute_total") == 250
    assert page.value("llmservice:preempted_tokens_swap_total") == 64
    assert page.value("llmservice:preemption_recompute_seconds_per_token") == 0.004
    assert page.value("llmservice:preemption_swap_seconds_per_token") is None  # not a 0 price
    assert page.value("llmservice:preemption_swap_fixed_seconds") is None
    s = engine_settings.from_metrics(page)
    assert (s.block_size, s.max_model_len, s.max_num_seqs, s.num_gpu_blocks) == (32, 4096, 64, 500)
    assert (s.enable_prefix_caching, s.enable_chunked_prefill, s.preemption_mode) == (False, True, "recompute")
    assert s.max_num_batched_tokens == 2048 and s.gpu_memory_utilization == 0.9


@pytest.mark.parametrize("work", ["cpu", "off-cpu"])
def test_loop_probe_sees_a_blocked_loop_and_whether_the_loop_used_the_cpu(work):
    lags: list[float] = []
    busy: list[float] = []

    def block() -> None:
        if work == "off-cpu":  # what a CPU-starved process looks like to the loop
            time.sleep(0.1)
            return
        end = time.thread_time() + 0.1  # 0.1 s of this thread's CPU, however busy the machine
        while time.thread_time() < end:
            pass

    async def main():
        task = asyncio.create_task(probe_event_loop(lags.append, period=0.01, observe_busy=busy.append))
        await asyncio.sleep(0.05)
        block()
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(main())
    assert max(lags) >= 0.05  # the loop was held for 0.1 s of wall time or more
    # the CPU part of a lag is the loop thread's own CPU time, which a loaded machine
    # does not inflate: 0.1 s when the loop computed, about nothing when it slept
    assert (max(busy) >= 0.05) == (work == "cpu")


class _Tok:
    vocab_size = 10

    def encode(self, text, add_special_tokens=True):
        return [1, 2, 3]


@pytest.mark.parametrize("hook_ms", [None, "100"])
def test_tokenize_time_is_counted_and_the_test_only_hook_blocks_the_loop(monkeypatch, hook_ms):
    if hook_ms:
        monkeypatch.setenv(tokenizer_service.TEST_ONLY_SLOW_TOKENIZER_ENV, hook_ms)
    service = tokenizer_service.TokenizerService(_Tok())  # type: ignore[arg-type]
    spent: list[float] = []
    service.on_tokenize_seconds = spent.append
    lags: list[float] = []

    async def main():
        probe = asyncio.create_task(probe_event_loop(lags.append, period=0.005))
        await asyncio.sleep(0.02)
        for _ in range(3):
            assert await service.encode("hi") == [1, 2, 3]
            await asyncio.sleep(0.01)
        probe.cancel()

    asyncio.run(main())
    service.close()
    assert len(spent) == 3 and (min(spent) >= 0.1) == bool(hook_ms)  # the slow tokenizer's time counts
    assert (max(lags) >= 0.08) == bool(hook_ms)
