"""Each Hub architecture (Llama 3.1 with llama3 RoPE scaling, Mistral, Qwen2 with q/k/v
bias, Qwen3 with q/k norms and a separate head_dim, a llama sharded into many files)
against transformers on the very same random weights (fp32), loaded the way `serve`
loads them: the HF folder through our loader and engine, no transformers code."""

from __future__ import annotations

import json

import pytest
import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.hf_loader import read_hf_info, shard_files
from llmservice.server.model.llama import score_tokens

from tests.support.hub_endpoint import hub_models  # noqa: F401 - pytest fixture

ARCHS = ["llama3", "mistral", "qwen2", "qwen3", "sharded"]
PROMPT = [5, 17, 42, 99, 7, 200, 13, 64, 31, 250, 8, 120]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, hub_models):  # noqa: F811
    transformers = pytest.importorskip("transformers")
    folder = hub_models[request.param]
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine = LLMEngine.from_config(EngineConfig(model=str(folder), max_model_len=256, kv_cache_memory_gib=0.01,
                                                num_threads=1, device="cpu"))
    return request.param, folder, ref, engine


def test_logits_match_transformers(pair):
    name, _, ref, engine = pair
    ours = score_tokens(engine.model, PROMPT)
    with torch.no_grad():
        expected = ref(torch.tensor([PROMPT])).logits[0].float()
    rel = ((ours - expected).abs().max() / expected.abs().max()).item()
    assert rel <= 1e-4, f"{name}: relative logit error {rel:.2e}"


def test_greedy_continuations_match_transformers(pair):
    name, _, ref, engine = pair
    (out,) = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    with torch.no_grad():
        inputs = torch.tensor([PROMPT])
        expected = ref.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=24,
                                do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert out.token_ids == expected, name


def test_what_each_config_turns_on(hub_models):  # noqa: F811
    llama, _ = read_hf_info(hub_models["llama3"])
    assert llama.rope_scaling["rope_type"] == "llama3" and not llama.tie_word_embeddings
    assert llama.eos_token_ids == [2, 3]
    qwen2, _ = read_hf_info(hub_models["qwen2"])
    assert qwen2.attention_bias and qwen2.tie_word_embeddings and not qwen2.qk_norm
    qwen3, _ = read_hf_info(hub_models["qwen3"])
    assert qwen3.qk_norm and qwen3.head_dim == 32 != qwen3.hidden_size // qwen3.num_heads


def test_sharded_files_come_in_index_order(hub_models):  # noqa: F811
    folder = hub_models["sharded"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    files = shard_files(folder)
    assert len(files) >= 3
    assert [f.name for f in files] == list(dict.fromkeys(index.values()))


def test_generation_config_gives_sampling_defaults_and_eos(tmp_path, hub_models):  # noqa: F811
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(hub_models["mistral"], folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    config, tokenizer = read_hf_info(folder)
    assert config.eos_token_ids == [2, 3]  # config.json says 2; generation_config adds 3
    assert config.sampling_defaults == {"temperature": 0.6, "top_p": 0.9}
    assert tokenizer.chat_template and "<|assistant|>" in tokenizer.chat_template


def test_a_post_processor_that_adds_bos_turns_bos_on():
    from llmservice.server.model.hf_loader import post_processor_adds_bos

    llama3 = {"post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel"},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}},
                                                  {"Sequence": {"id": "A"}}]}]}}
    qwen = {"post_processor": {"type": "ByteLevel"}}
    assert post_processor_adds_bos(llama3) and not post_processor_adds_bos(qwen)
    assert not post_processor_adds_bos({"post_processor": None})


@pytest.mark.parametrize(
    ("fields", "context"),
    [
        ({"sliding_window": 64}, 64),  # Mistral v0.1: capped at the window
        ({"sliding_window": 64, "use_sliding_window": False}, 4096),  # Qwen2/3 ship it off
        ({"sliding_window": None}, 4096),
        ({"sliding_window": 8192}, 4096),  # wider than the context: nothing to cap
    ],
)
def test_a_sliding_window_caps_the_context(hub_models, tmp_path, fields, context):  # noqa: F811
    """This engine attends to every earlier token; past a model's window its tokens would
    differ from the model's, so the context it serves stops at the window."""
    folder = tmp_path / "model"
    folder.mkdir()
    config = json.loads((hub_models["mistral"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096, **fields}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (hub_models["mistral"] / name).exists():
            (folder / name).write_text((hub_models["mistral"] / name).read_text())
    config_read, _ = read_hf_info(folder)
    assert config_read.max_position_embeddings == context
