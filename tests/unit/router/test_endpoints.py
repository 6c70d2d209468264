"""EndpointSlice JSON -> routable pods; the metrics line parser."""

from __future__ import annotations

from llmservice.router.endpoints import Endpoint, address_map, pods_from_slices
from llmservice.router.loads import parse_load


def endpoint(ip, name, **conditions):
    return {"addresses": [ip], "conditions": conditions, "targetRef": {"kind": "Pod", "name": name}}


def test_only_ready_not_terminating_pods_with_an_address_route():
    slices = [
        {"ports": [{"name": "http", "port": 8000}], "endpoints": [
            endpoint("10.0.0.1", "a", ready=True),
            endpoint("10.0.0.2", "b", ready=False),
            endpoint("10.0.0.3", "c", ready=True, terminating=True),
            endpoint("10.0.0.4", "d"),  # no ready condition: ready, as the API defines it
            {"addresses": [], "conditions": {"ready": True}},
        ]},
        {"ports": [{"name": "other", "port": 9}], "endpoints": [endpoint("fd00::5", "e", ready=True)]},
        {"ports": None, "endpoints": [endpoint("10.0.0.9", "f", ready=True)]},
    ]  # fmt: skip
    assert pods_from_slices(slices) == {
        "a": Endpoint("a", "http://10.0.0.1:8000"),
        "d": Endpoint("d", "http://10.0.0.4:8000"),
        "e": Endpoint("e", "http://[fd00::5]:9"),
    }


def test_address_rewrite_for_hosts_as_pods_clusters():
    slices = [
        {
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [endpoint("10.0.3.7", "a", ready=True)],
        }
    ]
    assert (
        pods_from_slices(slices, rewrite=address_map("10.=127."))["a"].url
        == "http://127.0.3.7:8000"
    )
    assert address_map("") is None


def test_parse_load_sums_running_and_waiting():
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{model_name="m"} 2\n'
        'vllm:num_requests_waiting_total{model_name="m"} 99\n'
        "vllm:num_requests_swapped 7\n"
    )
    assert parse_load(text) == 5.0
    assert parse_load("other 1\n") is None
