"""`llmservice serve hf://...` against a Hub-compatible endpoint on 127.0.0.1
(tests/support/hub_endpoint.py; HF_ENDPOINT points at it): the download, the requests
huggingface_hub makes, a cut download resuming, a start from the cache with the endpoint
down, and the errors that exit before the port is bound.

Fast tier: one Llama-3.1-style model served end to end (openai client) with a cut in
its download, a restart from the cache, and the four errors (started together). e2e:
every architecture served, and a download interrupted across starts.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.hub_endpoint import HubEndpoint, hub_models, serve_all  # noqa: F401
from tests.support.server_process import BIN, ServerProcess, free_port, wait_ready

ERROR_TIMEOUT_S = 10
SERVE_ARGS = ("--max-model-len", "128", "--kv-cache-memory-gib", "0.01", "--num-threads", "1")


@pytest.fixture(scope="module")
def endpoint(hub_models):  # noqa: F811 - its own endpoint: tests here stop it
    hub = HubEndpoint().start()
    serve_all(hub, hub_models)
    yield hub
    hub.stop()


def start(model: str, hf_home: Path, hub: HubEndpoint, log_path: Path, *extra: str,
          **env: str) -> ServerProcess:
    port = free_port()
    cmd = [str(BIN), "serve", model, "--host", "127.0.0.1", "--port", str(port), *SERVE_ARGS, *extra]
    full_env = dict(os.environ, HF_ENDPOINT=hub.base_url, HF_HOME=str(hf_home), OMP_NUM_THREADS="1",
                    TOKENIZERS_PARALLELISM="false", **env)
    full_env.pop("HF_TOKEN", None)
    log_file = open(log_path, "w")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    return ServerProcess(proc, port, log_path, cmd)


def port_was_bound(server: ServerProcess) -> bool:
    try:
        httpx.get(server.url + "/health", timeout=0.5)
        return True
    except httpx.HTTPError:
        return False


def download_requests(hub: HubEndpoint, repo: str, files: list[str]) -> list[str]:
    """What huggingface_hub asks for a first download of `files` (metadata first, then
    weights by commit), in a stable order."""
    sha = hub.repos[repo].sha
    out = [f"GET /api/models/{repo}/revision/main", f"GET /api/models/{repo}/tree/{sha}"]
    for f in files:
        out += [f"HEAD /{repo}/resolve/{sha}/{f}", f"GET /{repo}/resolve/{sha}/{f}"]
    return sorted(out)


META = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def served(endpoint, tmp_path_factory):
    """hf://tiny/llama3 from an empty cache, its weights' connection cut once mid-file."""
    hf_home = tmp_path_factory.mktemp("hf-home")
    endpoint.clear_log()
    endpoint.cut("tiny/llama3", "model.safetensors", at=5000, times=1)
    server = wait_ready(start("hf://tiny/llama3", hf_home, endpoint, hf_home / "serve.log"))
    requests = list(endpoint.requests)
    yield server, hf_home, requests
    server.stop()


def test_serve_downloads_the_model_and_answers_the_openai_client(served):
    server, _, _ = served
    client = OpenAI(base_url=server.base_url, api_key="unused")
    (model,) = client.models.list().data
    assert model.id == "hf://tiny/llama3"
    chat = client.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model=model.id, prompt="The capital of France", max_tokens=8,
                                     temperature=0)
    assert text.usage.completion_tokens >= 1
    log = server.log()
    assert "downloading model.safetensors" in log  # per-file progress
    assert "GB/s" in log and "loaded " in log  # load time and speed


def test_only_what_the_server_reads_is_requested(served, endpoint):
    _, _, requests = served
    expected = download_requests(endpoint, "tiny/llama3", [*META, "model.safetensors"])
    # the cut: huggingface_hub opened the weights a second time and finished the file
    expected.append(f"GET /tiny/llama3/resolve/{endpoint.repos['tiny/llama3'].sha}/model.safetensors")
    assert sorted(requests) == sorted(expected)


def test_a_second_start_with_the_endpoint_down_serves_from_the_cache(served, endpoint):
    _, hf_home, _ = served
    endpoint.stop()
    try:
        server = start("hf://tiny/llama3", hf_home, endpoint, hf_home / "offline.log")
        try:
            wait_ready(server)
            r = httpx.post(server.base_url + "/completions", timeout=60,
                           json={"model": "hf://tiny/llama3", "prompt": "Hello", "max_tokens": 4})
            assert r.status_code == 200, r.text
        finally:
            server.stop()
    finally:
        endpoint.start()


def test_hf_hub_offline_serves_from_the_cache_without_a_request(served, endpoint):
    _, hf_home, _ = served
    endpoint.clear_log()
    server = start("hf://tiny/llama3", hf_home, endpoint, hf_home / "hf-offline.log", HF_HUB_OFFLINE="1")
    try:
        wait_ready(server)
    finally:
        server.stop()
    assert endpoint.requests == []


ERRORS = {
    # reference -> what the message must say
    "hf://tiny/gated": ["gated or private", "HF_TOKEN", "spec.model.hfTokenSecretRef", "key `token`"],
    "tiny/no-such-model": ["tiny/no-such-model", "no such model"],
    "hf://tiny/bin_only": ["only pickle weights", "pytorch_model.bin", "never unpickles"],
    "hf://tiny/unknown_arch": ["FancyNewForCausalLM", "not supported", "LlamaForCausalLM",
                               "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"],
}


def test_each_failure_exits_non_zero_before_the_port_is_bound(endpoint, tmp_path):
    started = {ref: start(ref, tmp_path / "hf", endpoint, tmp_path / f"{i}.log")
               for i, ref in enumerate(ERRORS)}
    t0 = time.monotonic()
    for ref, server in started.items():
        left = max(ERROR_TIMEOUT_S - (time.monotonic() - t0), 0.1)
        try:
            code = server.proc.wait(left)
        except subprocess.TimeoutExpired:
            server.stop()
            pytest.fail(f"{ref}: still running after {ERROR_TIMEOUT_S} s:\n{server.log()[-2000:]}")
        assert code != 0 and not port_was_bound(server)
        error = [line for line in server.log().splitlines() if line.startswith("error: ")]
        assert error, server.log()[-2000:]
        for words in ERRORS[ref]:
            assert words in error[0], (ref, error[0])
    # no weights were fetched for any of them
    assert not [r for r in endpoint.requests if r.endswith((".safetensors", ".bin"))
                and ("bin_only" in r or "unknown_arch" in r)]


# ---- e2e: minutes ------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["mistral", "qwen2", "qwen3", "sharded"])
def test_every_architecture_is_served(name, endpoint, tmp_path, hub_models):  # noqa: F811
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams

    server = wait_ready(start(f"hf://tiny/{name}", tmp_path / "hf", endpoint, tmp_path / "serve.log"))
    try:
        prompt = [5, 17, 42, 99, 7, 200]
        r = httpx.post(server.base_url + "/completions", timeout=60, json={
            "model": f"hf://tiny/{name}", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "logprobs": 0})
        assert r.status_code == 200, r.text
    finally:
        server.stop()
    engine = LLMEngine.from_config(EngineConfig(model=str(hub_models[name]), max_model_len=128,
                                                kv_cache_memory_gib=0.01, num_threads=1, device="cpu"))
    (out,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    # the engine's own detokenizer: both hold back a trailing incomplete UTF-8 sequence
    assert r.json()["choices"][0]["text"] == out.text


@pytest.mark.e2e
def test_a_download_cut_for_good_fails_and_the_next_start_fetches_only_the_rest(endpoint, tmp_path):
    repo, sha = "tiny/sharded", endpoint.repos["tiny/sharded"].sha
    endpoint.clear_log()
    endpoint.cut(repo, "model-00005-of-00009.safetensors", at=3000, times=100)
    first = start(f"hf://{repo}", tmp_path / "hf", endpoint, tmp_path / "first.log")
    assert first.proc.wait(120) != 0
    assert "start again to resume" in first.log()
    endpoint.cuts.clear()
    endpoint.clear_log()
    second = wait_ready(start(f"hf://{repo}", tmp_path / "hf", endpoint, tmp_path / "second.log"))
    second.stop()
    weights = [r for r in endpoint.requests if r.startswith("GET") and r.endswith(".safetensors")]
    assert weights == [f"GET /{repo}/resolve/{sha}/model-00005-of-00009.safetensors"]
