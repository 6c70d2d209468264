"""The Grafana dashboard queries metrics the server really exports, and shows what it must.

The metric names come from a live `ServerMetrics` registry rendered in Prometheus text
format, so a renamed metric in server/metrics.py breaks this test, not a user's Grafana.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = json.loads((ROOT / "dashboards" / "llmservice.json").read_text())
METRIC = re.compile(r"vllm:[a-z_]+")


def exported_series() -> set[str]:
    from llmservice.server.metrics import CacheInfo, ServerMetrics

    fields = CacheInfo.__dataclass_fields__
    cache = CacheInfo(**{name: 1 for name in fields})
    text = generate_latest(ServerMetrics("m", 2048, cache).registry).decode()
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")
    }


def exprs_by_title() -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in DASHBOARD["panels"]}


def test_every_queried_metric_is_exported_by_the_server():
    series = exported_series()
    queried = {m for exprs in exprs_by_title().values() for e in exprs for m in METRIC.findall(e)}
    queried |= {
        m for v in DASHBOARD["templating"]["list"] for m in METRIC.findall(v.get("definition", ""))
    }
    assert queried, "the dashboard queries no vllm metric"
    assert queried <= series, sorted(queried - series)


def test_operator_metrics_queried_are_exported_by_the_operator():
    from llmservice.operator import telemetry

    text = generate_latest(telemetry.REGISTRY).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    queried = {
        m
        for exprs in exprs_by_title().values()
        for e in exprs
        for m in re.findall(r"llmservice_operator_[a-z_]+", e)
    }
    assert queried and queried <= names, sorted(queried - names)


@pytest.mark.parametrize(
    ("title", "needles"),
    [
        ("KV cache usage", ["vllm:kv_cache_usage_perc"]),
        ("Requests running / waiting / swapped", ["vllm:num_requests_running", "vllm:num_requests_waiting"]),
        ("Preemptions per minute", ["rate(vllm:num_preemptions_total", "* 60"]),
        ("Time to first token p50 / p99", ["histogram_quantile(0.5,", "histogram_quantile(0.99,", "vllm:time_to_first_token_seconds_bucket"]),
        ("Inter-token latency p50 / p99", ["histogram_quantile(0.5,", "histogram_quantile(0.99,", "vllm:inter_token_latency_seconds_bucket"]),
        ("Tokens per second", ["rate(vllm:generation_tokens_total", "rate(vllm:prompt_tokens_total"]),
        ("Replicas: serving and desired", ["count by (model_name)", "llmservice_operator_autoscaler_desired_replicas"]),
    ],
)  # fmt: skip
def test_required_panels_are_there(title: str, needles: list[str]):
    exprs = "\n".join(exprs_by_title()[title])
    for needle in needles:
        assert needle in exprs, (title, needle)


def test_every_query_is_filtered_by_the_dashboard_variables():
    for title, exprs in exprs_by_title().items():
        for expr in exprs:
            for selector in re.findall(r"vllm:[a-z_]+(\{[^}]*\})?", expr):
                assert selector, (title, expr)  # no unfiltered metric
            for selector in re.findall(r"vllm:[a-z_]+\{([^}]*)\}", expr):
                assert 'namespace=~"$namespace"' in selector and 'model_name=~"$model"' in selector


def test_panels_have_unique_ids_and_do_not_overlap():
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine


def test_dashboard_uses_the_datasource_variable():
    names = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert {"datasource", "namespace", "model"} <= names
    for p in DASHBOARD["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
