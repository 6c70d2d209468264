"""The real operator sizes hf:// models the catalog does not know from the Hub: the
Hub-compatible endpoint on 127.0.0.1 (tests/support/hub_endpoint.py) serves tiny random
models saved with transformers; `--hf-endpoint` points the operator at it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.operator.conftest import Env, start_env
from tests.support.clients import llmservice, wait_until
from tests.support.hub_endpoint import HubEndpoint, hub_models, serve_all  # noqa: F401
from tests.support.kubelet import Node

GPU = {"resources": {"gpu": {"count": 1, "memoryGiB": 24}},
       "engine": {"maxModelLen": 512, "maxNumBatchedTokens": 512, "dtype": "float32"}}  # fmt: skip


@pytest.fixture(scope="module")
def hub(hub_models: dict[str, Path]) -> Iterator[HubEndpoint]:  # noqa: F811
    with HubEndpoint() as endpoint:  # this module's own: a test stops it
        serve_all(endpoint, hub_models)
        yield endpoint


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, hub: HubEndpoint) -> Iterator[Env]:
    yield from start_env(
        tmp_path_factory.mktemp("hub-cluster"),
        "--hf-endpoint", hub.base_url,
        nodes=[Node("gpu-node-1", gpus=8)],
    )  # fmt: skip


def plan_of(env: Env, name: str) -> dict:
    return wait_until(lambda: (env.kubectl.llms(name).get("status") or {}).get("memoryPlan"))


def test_the_hub_down_is_vramfit_unknown_and_the_pods_still_roll_out(env, hub):
    # First in the module: the endpoint's keep-alive connections outlive stop(), so the
    # Hub is down for real only before the operator ever connected to it.
    k = env.kubectl
    hub.stop()
    try:
        k.apply(llmservice("offline", model={"source": "hf://tiny/qwen3"}, **GPU))
        fit = wait_until(lambda: k.condition("offline", "VRAMFit") or None)
        assert (fit["status"], fit["reason"]) == ("Unknown", "ShapeUnavailable")
        assert f"the Hub at {hub.base_url} cannot be reached" in fit["message"]
        assert "hf://tiny/qwen3" in fit["message"]
        assert (k.llms("offline").get("status") or {}).get("memoryPlan") is None
        wait_until(lambda: k.condition("offline", "Ready").get("status") == "True")
    finally:
        hub.start()


def test_an_unknown_hf_model_is_sized_from_its_config_and_headers(env, hub):
    k = env.kubectl
    k.apply(llmservice("sharded", model={"source": "hf://tiny/sharded"}, **GPU))
    plan = plan_of(env, "sharded")
    assert plan["shapeSource"] == f"hub:tiny/sharded@{hub.repos['tiny/sharded'].sha}"
    # 2 layers x 2 KV heads x 16 dims x K and V x fp32
    assert plan["kvBytesPerToken"] == 2 * 2 * 2 * 16 * 4
    fit = k.condition("sharded", "VRAMFit")
    assert (fit["status"], fit["reason"]) == ("True", "Fits")
    assert k.deployment("sharded") is not None
    shards = [r for r in hub.requests if r.startswith("GET /tiny/sharded/") and "-of-" in r]
    assert len(shards) >= 3  # every shard's header was read


def test_a_gated_model_is_read_with_the_services_token_secret(env, hub):
    k = env.kubectl
    token = base64.b64encode(b"hf_test_token").decode()
    k.core.create_namespaced_secret(
        "default", {"metadata": {"name": "hf-token"}, "data": {"token": token}}
    )
    model = {"source": "hf://tiny/gated", "hfTokenSecretRef": {"name": "hf-token"}}
    k.apply(llmservice("gated", model=model, **GPU))
    assert plan_of(env, "gated")["shapeSource"].startswith("hub:tiny/gated@")
    sent = [h.get("authorization") for h, r in zip(hub.headers, hub.requests, strict=True)
            if r.startswith("GET /tiny/gated/")]  # fmt: skip
    assert sent and set(sent) == {"Bearer hf_test_token"}
