"""Which references are Hub models, what a repo listing means for the download, and
fetch_model in-process against the 127.0.0.1 Hub endpoint (revisions, cache reuse)."""

from __future__ import annotations

import pytest
from llmservice.server.capabilities import model_unsupported
from llmservice.server.model.hub import HubFetchError, disk_shortfall, fetch_model, weight_files
from llmservice.server.model.sources import (
    BadHubRefError,
    HubRef,
    architecture_problem,
    parse_hub_ref,
)

from tests.support.hub_endpoint import HubEndpoint, hub_models  # noqa: F401


def never(_: str) -> bool:
    return False


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("hf://meta-llama/Llama-3.1-8B", HubRef("meta-llama/Llama-3.1-8B", None, "hf://meta-llama/Llama-3.1-8B")),
        ("Qwen/Qwen2.5-7B-Instruct", HubRef("Qwen/Qwen2.5-7B-Instruct", None, "Qwen/Qwen2.5-7B-Instruct")),
        ("hf://org/m-GGUF/sub/m.Q4_K_M.gguf", HubRef("org/m-GGUF", "sub/m.Q4_K_M.gguf", "hf://org/m-GGUF/sub/m.Q4_K_M.gguf")),
        ("builtin:smollm2-135m", None),
        ("/models/llama", None),
        ("./org/name", None),
        ("model.gguf", None),
    ],
)
def test_parse_hub_ref(model, expected):
    assert parse_hub_ref(model, exists=never) == expected


def test_a_plain_org_name_that_exists_locally_is_a_path():
    assert parse_hub_ref("org/name", exists=lambda p: True) is None


@pytest.mark.parametrize("model", ["hf://", "hf://org", "hf://org/name/weights.bin", "hf://-x/y"])
def test_malformed_hub_refs_are_refused_by_the_server_and_the_operator(model):
    with pytest.raises(BadHubRefError, match="hf://ORG/NAME"):
        parse_hub_ref(model)
    assert model_unsupported(model).reason == "not a Hub model reference"


def test_hub_models_are_supported():
    assert model_unsupported("hf://org/name") is None and model_unsupported("org/name") is None


def test_weight_files_take_safetensors_and_refuse_pickles():
    assert weight_files({"model-2.safetensors": 1, "model-1.safetensors": 1, "x.bin": 1}, "r") == [
        "model-1.safetensors", "model-2.safetensors"]
    assert weight_files({"a.safetensors": 1, "original/consolidated.pth": 1}, "r") == ["a.safetensors"]
    with pytest.raises(HubFetchError, match="only pickle weights .*pytorch_model.bin.*never unpickles"):
        weight_files({"pytorch_model.bin": 10, "config.json": 1}, "org/m")
    with pytest.raises(HubFetchError, match="no weights"):
        weight_files({"config.json": 1, "original/model.safetensors": 1}, "org/m")


def test_disk_shortfall_names_both_sizes_and_the_place():
    assert disk_shortfall(10, 10, "/c") is None
    message = disk_shortfall(16_000_000_000, 2_000_000_000, "/cache")
    assert "/cache" in message and "16.00 GB" in message and "2.00 GB" in message


def test_architecture_problem_lists_the_supported_ones():
    assert architecture_problem(["Qwen3ForCausalLM"]) is None
    message = architecture_problem(["GPT2LMHeadModel"])
    assert "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message


@pytest.fixture
def endpoint(hub_models, monkeypatch):  # noqa: F811
    from huggingface_hub import constants

    with HubEndpoint() as hub:
        hub.add_repo("tiny/qwen3", hub_models["qwen3"], revisions=("main", "v1"))
        # huggingface_hub read HF_ENDPOINT when first imported; point it here
        monkeypatch.setattr(constants, "ENDPOINT", hub.base_url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.base_url + "/{repo_id}/resolve/{revision}/{filename}")
        yield hub


def test_fetch_a_revision_then_reuse_the_cache(endpoint, tmp_path):
    sha = endpoint.repos["tiny/qwen3"].sha
    folder = fetch_model(HubRef("tiny/qwen3", None, "hf://tiny/qwen3"), "v1", str(tmp_path))
    assert folder.name == sha and (folder / "model.safetensors").is_file()
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    endpoint.clear_log()
    assert fetch_model(HubRef("tiny/qwen3", None, "hf://tiny/qwen3"), "v1", str(tmp_path)) == folder
    assert not [r for r in endpoint.requests if "/resolve/" in r and r.startswith("GET")]  # nothing again


def test_an_unknown_revision_is_named(endpoint, tmp_path):
    with pytest.raises(HubFetchError, match="has no revision 'v9'"):
        fetch_model(HubRef("tiny/qwen3", None, "hf://tiny/qwen3"), "v9", str(tmp_path))
