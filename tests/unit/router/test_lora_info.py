"""Reading a pod's LoRA state: `vllm:lora_requests_info` as the server (and vLLM) write it,
the newest label set by value, an idle report keeping the last adapters, /v1/models."""

from __future__ import annotations

from llmservice.router.lora_info import LoraInfo, adapter_names, parse_lora_info
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from tests.unit.router.lora_metrics_text import server_metrics


def test_running_and_waiting_adapters_and_slots_from_the_servers_text():
    text = server_metrics(running=("sql", "chat"), waiting=("poem",), max_loras=4)
    assert parse_lora_info(text) == LoraInfo(4, frozenset({"sql", "chat", "poem"}))


def test_a_pod_without_the_gauge_reports_nothing():
    assert parse_lora_info(server_metrics(running_requests=3, max_loras=None)) is None


def test_an_idle_report_keeps_the_adapters_last_seen_active():
    idle = parse_lora_info(server_metrics(max_loras=2))
    assert idle == LoraInfo(2, None)
    before = LoraInfo(2, frozenset({"sql"}))
    assert idle.after(before) == LoraInfo(2, frozenset({"sql"}))
    assert idle.after(None) == LoraInfo(2, frozenset())
    busy = LoraInfo(2, frozenset({"chat"}))
    assert busy.after(before) == busy  # a busy report replaces the last one


def test_of_several_label_sets_the_newest_by_value_wins():
    """vLLM leaves old label sets in place; each sample's value is the time it was set."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "vllm:lora_requests_info", "Running stats on lora requests.",
        ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry,
    )  # fmt: skip
    gauge.labels("3", "", "old").set(1_700_000_300.0)
    gauge.labels("3", "w1", "new1,new2").set(1_700_000_900.0)
    gauge.labels("3", "", "older").set(1_700_000_100.0)
    gauge.labels("5", "", "").set(1_700_000_950.0)  # newest, but idle: slots only
    info = parse_lora_info(generate_latest(registry).decode())
    assert info == LoraInfo(5, frozenset({"new1", "new2", "w1"}))


def test_adapters_are_the_models_with_a_parent():
    models = {"object": "list", "data": [
        {"id": "base", "object": "model", "root": "/m", "parent": None},
        {"id": "sql", "object": "model", "root": "/a/sql", "parent": "base"},
        {"id": "chat", "object": "model", "root": "/a/chat", "parent": "base"},
    ]}  # fmt: skip
    assert adapter_names(models) == {"sql", "chat"}
    assert adapter_names({"error": "unauthorized"}) == frozenset()
    assert adapter_names([1, 2]) == frozenset()
