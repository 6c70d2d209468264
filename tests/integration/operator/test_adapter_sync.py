"""The operator's adapter sync (operator/adapter_sync.py) against two real `llmservice
serve` processes of a tiny random Llama with PEFT adapters: adapters added to the spec
get loaded into every pod, removed ones unloaded, a bad one reported with the server's
message while the others load; hf:// adapters come from the Hub-compatible endpoint
(tests/support/hub_endpoint.py), both at start (--lora-modules) and at run time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess

import httpx
import pytest
from llmservice.operator.adapter_diff import LOAD_FAILED, adapters_condition, adapters_status
from llmservice.operator.adapter_spec import AdapterSpec
from llmservice.operator.adapter_sync import sync_service
from llmservice.operator.scrape import PodTarget

from tests.support.hub_endpoint import HubEndpoint
from tests.support.lora_fixtures import save_adapter, save_base
from tests.support.server_process import BIN, running_server

pytest.importorskip("peft")
KEY = "sync-test-key"
PROMPT = [5, 17, 33, 80, 101, 7, 9, 250, 3, 44]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter-sync")
    base = save_base(root / "base")
    return {
        "root": root,
        "base": base,
        "a8": save_adapter(base, root / "a8", 8, seed=1),
        "b16": save_adapter(base, root / "b16", 16, seed=2),
        "r32": save_adapter(base, root / "r32", 32, seed=3),  # above --max-lora-rank 16
        "hub": save_adapter(base, root / "hub", 8, seed=4),
    }


@pytest.fixture(scope="module")
def hub(files):
    with HubEndpoint() as endpoint:
        endpoint.add_repo("org/sql-lora", files["hub"])
        yield endpoint


def server_args(files, *extra: str) -> list[str]:
    return [str(files["base"]), "--served-model-name", "tiny-base", "--enable-lora", "--max-loras", "2",
            "--max-lora-rank", "16", "--max-model-len", "128", "--kv-cache-memory-gib", "0.05",
            "--api-key", KEY, *extra]  # fmt: skip


@pytest.fixture(scope="module")
def pods(files, hub):
    """Two pods of one LLMService: the first started with an hf:// --lora-modules entry."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true", "HF_ENDPOINT": hub.base_url,
           "HF_HOME": str(files["root"] / "hf-home")}  # fmt: skip
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(
            running_server(server_args(files, "--lora-modules", "at-start=hf://org/sql-lora"), files["root"], env)
        )
        second = stack.enter_context(running_server(server_args(files), files["root"], env))
        yield [first, second]


def targets(servers) -> list[PodTarget]:
    return [PodTarget(uid=f"uid-{i}", name=f"pod-{i}", ip="127.0.0.1", port=s.port, ready=True, terminating=False)
            for i, s in enumerate(servers)]  # fmt: skip


def sync(servers, desired: dict[str, str], key: str | None = KEY):
    async def run():
        async with httpx.AsyncClient(trust_env=False) as client:
            return await sync_service(client, targets(servers), desired, key)

    return asyncio.run(run())


def listed(server) -> dict[str, str]:
    data = httpx.get(server.base_url + "/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    return {m["id"]: m["root"] for m in data["data"] if m["parent"] is not None}


def answer(server, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    response = httpx.post(server.base_url + "/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_added_adapters_load_into_every_pod_and_a_bad_one_is_reported(pods, files):
    desired = {
        "a8": str(files["a8"]),
        "sql": "hf://org/sql-lora",
        "too-big": str(files["r32"]),
        "ghost": "hf://org/no-such-adapter",
    }
    result = sync(pods, desired)
    for pod, server in zip(result, pods, strict=True):
        assert pod.loaded["a8"] == desired["a8"] and pod.loaded["sql"] == "hf://org/sql-lora"
        assert "rank 32 is above --max-lora-rank 16" in pod.errors["too-big"]
        assert "org/no-such-adapter" in pod.errors["ghost"] and "no such model" in pod.errors["ghost"]
        assert listed(server)["sql"] == "hf://org/sql-lora"  # the reference as given, not the cache folder
    specs = [AdapterSpec(n, s) for n, s in desired.items()]
    status = {s["name"]: s for s in adapters_status(specs, desired, result)}
    assert status["a8"]["loadedReplicas"] == 2 and status["sql"]["loadedReplicas"] == 2
    assert status["too-big"]["loadedReplicas"] == 0 and "rank 32" in status["too-big"]["error"]
    condition = adapters_condition(specs, desired, result)
    assert condition["reason"] == LOAD_FAILED and "adapter too-big on pod pod-0" in condition["message"]


def test_an_hf_adapter_serves_the_same_weights_as_its_local_copy(pods, files):
    first = pods[0]
    result = sync([first], {"local-copy": str(files["hub"]), "at-start": "hf://org/sql-lora"})
    assert result[0].errors == {}
    assert listed(first)["at-start"] == "hf://org/sql-lora"
    assert answer(first, "at-start") == answer(first, "local-copy") != answer(first, "tiny-base")


def test_removed_adapters_are_unloaded_and_a_changed_source_is_reloaded(pods, files):
    sync(pods, {"a8": str(files["a8"]), "b16": str(files["b16"])})
    result = sync(pods, {"a8": str(files["b16"])})  # b16 removed, a8 now points at b16's files
    for pod, server in zip(result, pods, strict=True):
        assert pod.errors == {}
        assert listed(server) == {"a8": str(files["b16"])}
    assert answer(pods[1], "a8") != answer(pods[1], "tiny-base")
    again = sync(pods, {"a8": str(files["b16"])})  # nothing to do: a second pass changes nothing
    assert [p.loaded for p in again] == [{"a8": str(files["b16"])}] * 2 and all(not p.errors for p in again)


def test_a_wrong_api_key_leaves_the_pods_as_they_are(pods, files):
    sync(pods, {"a8": str(files["b16"])})
    result = sync(pods, {}, key="wrong")
    assert all(p.unreachable and "401" in p.unreachable for p in result)
    assert listed(pods[0]) == {"a8": str(files["b16"])}


def test_an_hf_adapter_that_does_not_exist_stops_the_server_at_start(files, hub):
    env = dict(os.environ, HF_ENDPOINT=hub.base_url, HF_HOME=str(files["root"] / "hf-home-2"))
    out = subprocess.run([str(BIN), "serve", *server_args(files, "--lora-modules", "x=hf://org/missing")],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 1
    assert "error: --lora-modules: adapter 'x': hf://org/missing" in out.stderr
    assert "no such model on the Hub" in out.stderr
