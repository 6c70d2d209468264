"""`llmservice serve hf://tiny/<moe>` against the Hub-compatible endpoint on 127.0.0.1
(tests/support/hub_endpoint.py stands in for the Hub): a Qwen3-MoE and a Mixtral saved by
transformers are downloaded, served, and answer the official `openai` client with the
text our engine generates from the same folder in-process (greedy)."""

from __future__ import annotations

import pytest
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from openai import OpenAI

from tests.integration.server.test_hub_serve import start
from tests.support.hub_endpoint import HubEndpoint
from tests.support.moe_models import moe_models
from tests.support.server_process import wait_ready

PROMPT = [5, 17, 42, 99, 7, 200, 13]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers")
    return moe_models(tmp_path_factory.mktemp("moe-models"))


@pytest.fixture(scope="module")
def hub(folders):
    endpoint = HubEndpoint().start()
    for name, folder in folders.items():
        endpoint.add_repo(f"tiny/{name}", folder)
    yield endpoint
    endpoint.stop()


@pytest.mark.parametrize("name", ["qwen3_moe"])  # Mixtral: the same path, in-process in test_moe_models
def test_a_moe_model_from_the_hub_is_served_as_the_engine_generates_it(name, folders, hub, tmp_path):
    server = wait_ready(start(f"hf://tiny/{name}", tmp_path / "hf", hub, tmp_path / "serve.log"))
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        served = client.completions.create(model=f"hf://tiny/{name}", prompt=PROMPT, max_tokens=12,
                                           temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
        models = [m.id for m in client.models.list().data]
    finally:
        server.stop()
    assert models == [f"hf://tiny/{name}"]
    assert served.usage.completion_tokens == 12
    engine = LLMEngine.from_config(EngineConfig(model=str(folders[name]), max_model_len=128,
                                                kv_cache_memory_gib=0.01, num_threads=1, device="cpu"))  # fmt: skip
    (out,) = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert served.choices[0].text == out.text
