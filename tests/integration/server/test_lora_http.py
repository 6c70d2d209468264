"""LoRA serving over HTTP on a real server with the openai client: /v1/models lists the
base and each adapter (parent = the base), a request whose `model` names an adapter gets
that adapter's greedy answer (HF transformers + PEFT's), adapters load and unload at run
time behind the API key with OpenAI-style 4xx errors that lose nothing, and
vllm:lora_requests_info is exported as vLLM exports it."""

from __future__ import annotations

import httpx
import pytest
import tokenizers
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.support.lora_fixtures import peft_model, save_adapter, save_base

openai = pytest.importorskip("openai")
pytest.importorskip("peft")
KEY = "lora-test-key"
PROMPT = [5, 17, 33, 80, 101, 7, 9, 250, 3, 44]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-http")
    base = save_base(root / "base")
    adapters = {"a8": save_adapter(base, root / "a8", 8, seed=1),
                "b16": save_adapter(base, root / "b16", 16, seed=2),
                "r32": save_adapter(base, root / "r32", 32, seed=3)}  # fmt: skip
    return base, adapters


@pytest.fixture(scope="module")
def expected(files):
    """PEFT's greedy tokens of PROMPT per adapter (None: the base)."""
    base, adapters = files
    model = peft_model(base, {n: adapters[n] for n in ("a8", "b16")})
    x = torch.tensor([PROMPT])
    kwargs = dict(attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, do_sample=False,
                  eos_token_id=None, pad_token_id=0)  # fmt: skip
    out = {}
    with torch.no_grad():
        for name in ("a8", "b16"):
            model.set_adapter(name)
            out[name] = model.generate(x, **kwargs)[0, len(PROMPT) :].tolist()
        with model.disable_adapter():
            out[None] = model.generate(x, **kwargs)[0, len(PROMPT) :].tolist()
    tok = tokenizers.Tokenizer.from_file(str(base / "tokenizer.json"))
    # a trailing incomplete UTF-8 sequence: the server's detokenizer never emits its U+FFFD
    texts = {name: tok.decode(ids).rstrip("\ufffd") for name, ids in out.items()}
    assert len(set(texts.values())) == 3  # three different answers: the check can tell them apart
    return texts


@pytest.fixture(scope="module")
def server(launch_server, files):
    base, adapters = files
    return launch_server(
        str(base), "--served-model-name", "tiny-base", "--enable-lora", "--lora-modules", f"a8={adapters['a8']}",
        "--max-loras", "2", "--max-lora-rank", "16", "--max-model-len", "128", "--api-key", KEY,
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    )  # fmt: skip


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def greedy_tokens(server, model: str) -> str:
    """The greedy answer's text (compared with the text of PEFT's tokens)."""
    out = client(server).completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == MAX_TOKENS
    return out.choices[0].text.rstrip("\ufffd")


def post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def test_models_list_the_base_and_each_adapter_with_its_parent(server, files):
    models = {m.id: m for m in client(server).models.list().data}
    assert set(models) == {"tiny-base", "a8"}
    assert models["a8"].parent == "tiny-base" and models["a8"].root == str(files[1]["a8"])
    assert models["tiny-base"].parent is None


def test_the_model_field_chooses_the_adapter(server, expected):
    assert greedy_tokens(server, "a8") == expected["a8"]
    assert greedy_tokens(server, "tiny-base") == expected[None] != expected["a8"]
    with pytest.raises(openai.NotFoundError, match="b16"):
        greedy_tokens(server, "b16")


def test_load_and_unload_at_run_time(server, files, expected):
    _, adapters = files
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "b16", "lora_path": str(adapters["b16"])},
                key=None).status_code == 401  # fmt: skip
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "b16", "lora_path": str(adapters["b16"])})
    assert r.status_code == 200, r.text
    assert greedy_tokens(server, "b16") == expected["b16"]
    bad = post(server, "/v1/load_lora_adapter", {"lora_name": "r32", "lora_path": str(adapters["r32"])})
    assert bad.status_code == 400 and "rank 32 is above --max-lora-rank 16" in bad.json()["error"]["message"]
    again = post(server, "/v1/load_lora_adapter", {"lora_name": "a8", "lora_path": str(adapters["b16"])})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    missing = post(server, "/v1/unload_lora_adapter", {"lora_name": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert greedy_tokens(server, "a8") == expected["a8"]  # nothing loaded was lost
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "b16"}).status_code == 200
    assert {m.id for m in client(server).models.list().data} == {"tiny-base", "a8"}
    with pytest.raises(openai.NotFoundError):
        greedy_tokens(server, "b16")


def test_lora_requests_info_as_vllm_exports_it(server):
    greedy_tokens(server, "a8")
    text = httpx.get(server.url + "/metrics", timeout=10).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    fam = fams["vllm:lora_requests_info"]
    assert fam.type == "gauge"
    (sample,) = fam.samples
    assert set(sample.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert sample.labels["max_lora"] == "2"
    assert sample.value > 1.7e9  # a Unix timestamp: the time the labels were last set
