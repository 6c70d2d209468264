"""Parsing two `/metrics` pages into a snapshot: a stock vLLM page (written by hand from
vLLM's documented metric names and format, V1 engine with its `engine` label) goes
through the same code as ours, and its settings come from `vllm:cache_config_info`."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest
from llmservice.operator.advisor import engine_settings, rules
from llmservice.operator.advisor.snapshot import Snapshot, parse

FIXTURES = Path(__file__).parent / "advisor_fixtures"


def vllm_snapshot() -> Snapshot:
    before = parse((FIXTURES / "vllm_block32_before.prom").read_text())
    after = parse((FIXTURES / "vllm_block32_after.prom").read_text())
    return Snapshot(before, after, 60.0)


def test_stock_vllm_page_parses_into_rates_and_histogram_deltas():
    snap = vllm_snapshot()
    gen = snap.histogram("vllm:request_generation_tokens")
    assert gen is not None and gen.count == 240
    assert gen.mean == pytest.approx((96 * 12 + 120 * 17 + 24 * 40) / 240)
    assert snap.increase("vllm:prompt_tokens_total") == 19200
    assert snap.per_minute("vllm:num_preemptions_total") == 0
    assert snap.gauge_range("vllm:kv_cache_usage_perc") == (0.97, 0.99)
    assert snap.after.value("vllm:request_success_total") == 1240  # summed over reasons


def test_settings_come_from_vllm_cache_config_info():
    s = engine_settings.from_metrics(vllm_snapshot().after)
    assert (s.block_size, s.num_gpu_blocks, s.enable_prefix_caching) == (32, 2214, True)
    assert (s.gpu_memory_utilization, s.swap_space_gib) == (0.9, 4.0)
    assert s.max_num_seqs is None  # vLLM exports no scheduler config


def test_the_block_size_rule_fires_on_the_stock_vllm_page():
    snap = vllm_snapshot()
    spec = engine_settings.from_spec({"engine": {"maxNumSeqs": 256}})
    found = rules.evaluate(snap, engine_settings.from_metrics(snap.after).overlaid(spec))
    assert [f.rule for f in found] == ["block-size"]
    assert found[0].evidence["kvFullWhileBatchSmall"] is True
    assert found[0].recommendation == {"engine": {"blockSize": 16}}


def test_quantiles_follow_prometheus_histogram_quantile():
    gen = vllm_snapshot().histogram("vllm:request_generation_tokens")
    assert gen is not None
    # 12 and 17 land in (10, 20], 40 in (20, 50]
    assert gen.upper_bound(0.5) == 20 and gen.upper_bound(0.99) == 50
    assert 10 < gen.quantile(0.5) <= 20
    assert gen.fraction_above(20) == pytest.approx(24 / 240)
    assert not math.isinf(gen.upper_bound(1.0))


def test_spec_values_override_metric_values():
    metrics = engine_settings.EngineSettings(block_size=32, num_gpu_blocks=100)
    spec = engine_settings.from_spec(
        {
            "engine": {"blockSize": 16, "enablePrefixCaching": False},
            "resources": {"gpuMemoryUtilization": 0.93},
        }
    )
    merged = metrics.overlaid(spec)
    assert (merged.block_size, merged.num_gpu_blocks, merged.enable_prefix_caching) == (
        16,
        100,
        False,
    )
    assert merged.gpu_memory_utilization == 0.93


def test_text_that_is_not_prometheus_is_a_value_error():
    with pytest.raises(ValueError):
        parse("<html>not metrics</html>\n{{{")


def test_spec_settings_are_the_operators_parse_of_the_named_fields_only():
    spec = {"engine": {"maxModelLen": 8192, "swapSpaceGiB": 4, "preemptionMode": "swap"}}
    s = engine_settings.from_spec(spec)
    assert (s.max_model_len, s.swap_space_gib, s.preemption_mode) == (8192, 4.0, "swap")
    # unnamed fields stay unknown, so the server's reported value wins over a default
    assert s.block_size is None and s.max_num_seqs is None and s.gpu_memory_utilization is None
    # every scheduler/cache setting the rules read comes from the one option table
    assert set(engine_settings.SPEC_ENGINE_FIELDS) == {
        f.name for f in fields(engine_settings.EngineSettings)
    } - {"gpu_memory_utilization", "num_gpu_blocks"}


def test_a_hand_written_spec_value_of_another_type_is_unknown_not_a_crash():
    s = engine_settings.from_spec({"engine": {"blockSize": "16", "enableChunkedPrefill": "yes"}})
    assert (s.block_size, s.enable_chunked_prefill) == (16, None)
