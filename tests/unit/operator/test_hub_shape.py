"""The VRAM check of an hf:// model the catalog does not know: the shape from its
config.json (pure), the fit decision with the Hub's answer, and the cached Hub lookup
against the Hub-compatible endpoint on 127.0.0.1 (tests/support/hub_endpoint.py)."""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from llmservice.operator.catalog import CATALOG
from llmservice.operator.hub_shape import FoundShape, HubShapes, TokenError, read_token_with
from llmservice.operator.kube import ApiError
from llmservice.operator.model_shape import ConfigError, architecture_from_config
from llmservice.operator.spec import LLMServiceSpec, ModelSpec, SecretKeyRef
from llmservice.operator.vram import check_fit
from safetensors.numpy import save_file

from tests.support.hub_endpoint import HubEndpoint
from tests.support.moe_models import QWEN3_30B_A3B

# Published config.json values (the numbers that matter for sizing).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN3_06B = {**QWEN3_8B, "hidden_size": 1024, "intermediate_size": 3072,
             "num_attention_heads": 16, "num_hidden_layers": 28, "tie_word_embeddings": True}  # fmt: skip
MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
}  # fmt: skip


# ------------------------------------------------------------------ config.json -> shape


@pytest.mark.parametrize(
    ("config", "published_billions"),
    [(LLAMA_31_8B, 8.03), (QWEN25_7B, 7.62), (QWEN3_8B, 8.19), (QWEN3_06B, 0.596), (MIXTRAL, 46.70)],
)
def test_shapes_from_config_give_the_published_parameter_counts(config, published_billions):
    assert architecture_from_config(config).parameters / 1e9 == pytest.approx(
        published_billions, rel=0.005
    )


def test_config_shapes_equal_the_catalog_entries_of_the_same_models():
    assert architecture_from_config(QWEN25_7B) == CATALOG["qwen2.5-7b"].architecture
    assert architecture_from_config(LLAMA_31_8B) == CATALOG["llama-3-8b"].architecture


def test_head_dim_and_kv_heads_come_from_the_config():
    qwen3 = architecture_from_config(QWEN3_06B)  # head_dim 128 != hidden 1024 / 16 heads
    assert (qwen3.head_dim, qwen3.num_key_value_heads, qwen3.tie_word_embeddings) == (128, 8, True)
    no_gqa = architecture_from_config({**LLAMA_31_8B, "num_key_value_heads": None})
    assert (no_gqa.num_key_value_heads, no_gqa.head_dim) == (32, 128)


def test_multimodal_configs_size_their_text_model():
    nested = {"model_type": "llava", "text_config": LLAMA_31_8B, "vision_config": {}}
    assert architecture_from_config(nested) == architecture_from_config(LLAMA_31_8B)


def test_an_exact_parameter_count_overrides_the_derived_one():
    assert architecture_from_config(LLAMA_31_8B, 8_030_261_248).parameters == 8_030_261_248


@pytest.mark.parametrize(
    ("broken", "named"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
    ],
)
def test_a_config_without_a_needed_number_says_which(broken, named):
    with pytest.raises(ConfigError, match=named):
        architecture_from_config({**LLAMA_31_8B, **broken})


# ------------------------------------------------------------------ the fit decision


def spec(source: str, gib: float = 24, **model: object) -> LLMServiceSpec:
    return LLMServiceSpec.from_dict({
        "model": {"source": source, **model},
        "engine": {"maxModelLen": 8192, "maxNumBatchedTokens": 8192, "dtype": "bfloat16"},
        "resources": {"gpu": {"count": 1, "memoryGiB": gib}},
    })  # fmt: skip


def test_a_hub_shape_is_checked_like_a_catalog_one_and_says_where_it_came_from():
    source = "hf://acme/llama-clone"
    found = FoundShape("hub:acme/llama-clone@" + "a" * 40, architecture_from_config(LLAMA_31_8B))
    hub = check_fit(spec(source), hub=found)
    catalog = check_fit(spec("hf://meta-llama/Meta-Llama-3-8B-Instruct"))
    assert hub.status == catalog.status == "True"
    assert hub.plan.as_status() == {**catalog.plan.as_status(), "shapeSource": found.source}
    assert catalog.plan.as_status()["shapeSource"] == "catalog:llama-3-8b"
    too_small = check_fit(spec(source, gib=16), hub=found)
    assert (too_small.status, too_small.reason) == ("False", "InsufficientVRAM")


def test_the_spec_and_the_catalog_win_over_the_hub():
    found = FoundShape("hub:x/y@main", architecture_from_config(MIXTRAL))
    named = check_fit(spec("hf://x/y", catalogName="llama-3-8b"), hub=found)
    assert named.plan.shape_source == "catalog:llama-3-8b"
    arch = {"numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "intermediateSize": 128,
            "vocabSize": 320}  # fmt: skip
    given = check_fit(spec("hf://x/y", architecture=arch), hub=found)
    assert given.plan.shape_source == "spec.model.architecture"


def test_no_shape_from_the_hub_is_unknown_with_the_reason_and_does_not_block():
    found = FoundShape("hub:x/y@main", problem="the Hub at http://hub cannot be reached (boom)")
    fit = check_fit(spec("hf://x/y"), hub=found)
    assert (fit.status, fit.reason, fit.plan) == ("Unknown", "ShapeUnavailable", None)
    assert "the Hub at http://hub cannot be reached (boom)" in fit.message
    assert not fit.refuses_rollout
    offline = check_fit(spec("hf://x/y"))  # no lookup at all (an offline render)
    assert (offline.status, offline.reason) == ("Unknown", "ArchitectureUnknown")


# ------------------------------------------------------------------ the token Secret


def test_the_token_comes_from_the_named_secret_and_key():
    secrets = {"/api/v1/namespaces/team/secrets/hf": {"data": {"tok": base64.b64encode(b"hf_abc\n").decode()}}}
    read = read_token_with(secrets.get)
    assert read("team", SecretKeyRef("hf", "tok")) == "hf_abc"
    with pytest.raises(TokenError, match="Secret team/hf has no key 'token'"):
        read("team", SecretKeyRef("hf"))
    with pytest.raises(TokenError, match="Secret other/hf .* does not exist"):
        read("other", SecretKeyRef("hf", "tok"))

    def forbidden(path: str) -> None:
        raise ApiError(403, "secrets is forbidden")

    with pytest.raises(TokenError, match="cannot read Secret team/hf.*403"):
        read_token_with(forbidden)("team", SecretKeyRef("hf"))


# ------------------------------------------------------------------ the cached Hub lookup

TENSORS = {"embed": (320, 64), "layer.q": (64, 64), "layer.mlp": (128, 64), "norm": (64,)}
PARAMETERS = sum(int(np.prod(shape)) for shape in TENSORS.values())
CONFIG = {**LLAMA_31_8B, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 320}  # fmt: skip


def tiny_repo(folder: Path, shards: int = 1) -> Path:
    """config.json plus safetensors weights (one file, or `shards` with an index)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    names = list(TENSORS)
    if shards == 1:
        save_file({n: np.zeros(TENSORS[n], np.float16) for n in names}, folder / "model.safetensors")
        return folder
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: np.zeros(TENSORS[n], np.float16) for n in part}, folder / file)
        weight_map |= {n: file for n in part}
    index = {"metadata": {"total_size": 2 * PARAMETERS}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


SLOW = 30.0  # seconds: a loaded machine must not turn these into timeout tests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hub(tmp_path: Path):
    with HubEndpoint() as endpoint:
        endpoint.add_repo("acme/one", tiny_repo(tmp_path / "one"))
        endpoint.add_repo("acme/sharded", tiny_repo(tmp_path / "sharded", shards=3))
        endpoint.add_repo("acme/gated", tiny_repo(tmp_path / "gated"), status=401)
        yield endpoint


def no_token(namespace: str, ref: SecretKeyRef) -> str:
    raise AssertionError("no Secret is named")


def model(source: str, secret: str | None = None) -> ModelSpec:
    return ModelSpec(source, hf_token_secret=SecretKeyRef(secret) if secret else None)


@pytest.mark.parametrize("repo", ["acme/one", "acme/sharded"])
def test_the_shape_and_exact_parameter_count_come_from_config_and_headers(hub, repo):
    shapes = HubShapes(no_token, endpoint=hub.base_url, timeout=SLOW)
    found = shapes.lookup("default", model(f"hf://{repo}"))
    commit = hub.repos[repo].sha
    assert found.source == f"hub:{repo}@{commit}" and found.problem is None
    assert found.architecture == architecture_from_config(CONFIG, PARAMETERS)
    # Only config.json, the index and headers: never a whole weights file.
    files = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
             "model-00003-of-00003.safetensors"] if repo == "acme/sharded" else ["model.safetensors"]  # fmt: skip
    assert sorted(hub.requests) == sorted(
        [f"GET /{repo}/resolve/main/config.json",
         f"GET /{repo}/resolve/{commit}/model.safetensors.index.json"]
        + [f"GET /{repo}/resolve/{commit}/{f}" for f in files]
    )  # fmt: skip
    ranges = [h.get("range") for h, r in zip(hub.headers, hub.requests, strict=True) if r.endswith(".safetensors")]
    assert ranges and all(r == "bytes=0-100000" for r in ranges)


def test_a_shape_is_cached_per_repo_and_revision(hub):
    shapes = HubShapes(no_token, endpoint=hub.base_url, timeout=SLOW)
    first = shapes.lookup("default", model("hf://acme/one"))
    hub.clear_log()
    assert shapes.lookup("other-namespace", model("hf://acme/one")) == first
    assert hub.requests == []
    assert shapes.lookup("default", model("builtin:smollm2-135m")) is None


def test_a_gated_repo_uses_the_services_token_secret(hub):
    tokens = {("team", "hf-token"): "hf_secret"}
    shapes = HubShapes(lambda ns, ref: tokens[(ns, ref.name)], endpoint=hub.base_url, timeout=SLOW)
    refused = shapes.lookup("team", model("hf://acme/gated"))
    assert refused.architecture is None and "gated or private" in refused.problem
    assert "spec.model.hfTokenSecretRef" in refused.problem
    assert all("authorization" not in h for h in hub.headers)  # never a token of its own
    found = shapes.lookup("team", model("hf://acme/gated", secret="hf-token"))
    assert found.architecture is not None
    assert hub.headers[-1]["authorization"] == "Bearer hf_secret"


def test_a_down_hub_is_a_reason_cached_briefly_then_retried(hub):
    clock = Clock()
    shapes = HubShapes(no_token, endpoint=hub.base_url, timeout=SLOW, retry_seconds=30, clock=clock)
    hub.stop()
    down = shapes.lookup("default", model("hf://acme/one"))
    assert down.architecture is None and "cannot be reached" in down.problem
    assert down.source == "hub:acme/one@main"
    hub.start()  # same port
    clock.now += 10
    assert shapes.lookup("default", model("hf://acme/one")) == down  # still cached
    assert hub.requests == []
    clock.now += 30  # expired: the stale answer at once, a refresh in the background
    assert shapes.lookup("default", model("hf://acme/one")) == down
    found = wait_for(lambda: shapes.lookup("default", model("hf://acme/one")).architecture)
    assert found == architecture_from_config(CONFIG, PARAMETERS)


def test_a_silent_hub_costs_one_timeout_not_a_hang(hub):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        shapes = HubShapes(no_token, endpoint=f"http://127.0.0.1:{port}", timeout=0.5)
        started = time.monotonic()
        found = shapes.lookup("default", model("hf://acme/one"))
        assert time.monotonic() - started < 60  # 0.5 s and any scheduling delay, not a hang (pytest's own limit is 600 s)
        assert "did not answer in time" in found.problem
        shapes.close()


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


# ------------------------------------------------------------------ mixture of experts



def test_a_qwen3_moe_config_is_the_catalog_entry_all_experts_counted():
    arch = architecture_from_config(QWEN3_30B_A3B)
    assert arch == CATALOG["qwen3-30b-a3b"].architecture
    assert arch.parameters / 1e9 == pytest.approx(30.5, rel=0.005)  # published: 30.5 B
    assert (arch.num_experts, arch.intermediate_size, arch.num_dense_layers) == (128, 768, 0)


def test_a_moe_repo_on_the_hub_is_sized_by_all_its_experts(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2MoeConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[2],
        tie_word_embeddings=False,
    )  # fmt: skip
    moe = transformers.Qwen2MoeForCausalLM(config)
    moe.save_pretrained(tmp_path / "moe")  # config.json + model.safetensors, as on the Hub
    total = sum(p.numel() for p in moe.state_dict().values())
    with HubEndpoint() as endpoint:
        endpoint.add_repo("acme/tiny-moe", tmp_path / "moe")
        shapes = HubShapes(no_token, endpoint=endpoint.base_url, timeout=SLOW)
        found = shapes.lookup("default", model("hf://acme/tiny-moe"))
        shapes.close()
    assert found.problem is None
    arch = found.architecture
    assert arch.parameters == total == arch.derived_parameter_count()  # headers == shape
    assert (arch.num_experts, arch.num_dense_layers, arch.shared_expert_intermediate_size) == (
        8, 1, 24,
    )  # fmt: skip
