"""The proof that what we render really starts: the fake kubelet runs the pod's own
command (`llmservice serve ...` with the rendered flags) and a completion through the
pod IP succeeds."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.operator.conftest import ROOT, Env, start_env
from tests.support.clients import wait_until

LLMSERVICE = Path(sys.executable).with_name("llmservice")


@pytest.fixture
def served(tmp_path) -> Env:
    if not LLMSERVICE.exists() and not shutil.which("llmservice"):
        pytest.fail("the `llmservice` console script is not installed (make install)")
    yield from start_env(
        tmp_path,
        mode="process",
        executables={"llmservice": str(LLMSERVICE)},
        env={"OMP_NUM_THREADS": "1"},  # the test machine is small and shared
        log_dir=tmp_path,
    )


def test_rendered_pod_serves_a_completion(served: Env):
    k = served.kubectl
    example = yaml.safe_load((ROOT / "examples" / "smollm2-cpu.yaml").read_text())
    k.apply(example)
    try:
        ready = wait_until(
            lambda: (c := k.condition("smollm2", "Ready")).get("status") == "True" and c,
            timeout=240,
            interval=0.5,
        )
    except AssertionError as exc:
        logs = [f"--- {p.name}\n{p.read_text()[-4000:]}" for p in served.workdir.glob("smollm2-*")]
        raise AssertionError(f"{exc}\npod logs:\n" + "\n".join(logs)) from exc
    assert ready["reason"] == "AllReplicasReady"
    (pod,) = k.pods("smollm2")
    ip = pod["status"]["podIP"]
    base = f"http://{ip}:8000"
    response = httpx.post(
        f"{base}/v1/completions",
        json={
            "model": "smollm2",
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "smollm2"
    assert body["usage"]["completion_tokens"] == 8
    assert "Paris" in body["choices"][0]["text"]
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert "vllm:num_requests_running" in metrics and "vllm:kv_cache_usage_perc" in metrics

    # Deleting the LLMService drains the pod: the server gets SIGTERM and exits.
    k.delete_llms("smollm2")
    wait_until(lambda: not k.pods("smollm2"), timeout=60, interval=0.2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/health", timeout=2)
