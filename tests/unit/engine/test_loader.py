"""Loader: dequantization against gguf's reference, HF safetensors dirs against transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from llmservice.server.model.dequant import dequantize
from llmservice.server.model.llama import LlamaModel, score_tokens
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.loader import load_model


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16])
def test_dequantize_matches_gguf_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    values = rng.standard_normal((64, 256)).astype(np.float32) * 3
    raw = gguf_quantize(values, qtype)
    ours = dequantize(raw, qtype, (64, 256))
    ref = gguf_dequantize(raw, qtype)
    np.testing.assert_array_equal(ours.numpy(), ref)
    assert np.abs(ref - values).max() < 0.1 * np.abs(values).max()  # a real quantization of the input


def test_embedded_model_tensor_types_and_shapes(smollm):
    cfg = smollm.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.vocab_size == 49152
    assert smollm.weights["model.embed_tokens.weight"].shape == (49152, 576)
    assert smollm.weights["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert smollm.tokenizer.chat_template and "<|im_start|>" in smollm.tokenizer.chat_template


def _save_random_hf_model(tmp_path, arch: str):
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    if arch == "llama":
        config = transformers.LlamaConfig(**common, rope_theta=5000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**common, rope_theta=5000.0, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_safetensors_directory_matches_transformers(tmp_path, arch):
    hf = _save_random_hf_model(tmp_path, arch)
    loaded = load_model(tmp_path)
    assert loaded.config.architecture == arch
    assert loaded.config.attention_bias == (arch == "qwen2")
    model = LlamaModel(loaded.config, loaded.weights, torch.device("cpu"), torch.float32, 256)
    ids = [int(x) for x in torch.randint(0, 300, (37,), generator=torch.Generator().manual_seed(1))]
    ours = score_tokens(model, ids, block_size=8)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4


def test_unsupported_architecture_names_file_and_arch(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(UnsupportedModelError, match=r"config.json.*GPTNeoXForCausalLM.*not supported"):
        load_model(tmp_path)


def test_missing_model_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="unknown builtin model 'builtin:gpt-5'"):
        load_model("builtin:gpt-5")


def test_tokenizer_matches_transformers_gguf_tokenizer(engine, smollm):
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(smollm.path.parent), gguf_file=smollm.path.name)
    texts = ["Hello, world!", "The quick brown fox jumps over the lazy dog.", "  spaces\tand\nnewlines ", "naïve café"]
    for text in texts:
        assert engine.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
        assert engine.tokenizer.decode(engine.tokenizer.encode(text)) == text
