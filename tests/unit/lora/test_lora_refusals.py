"""Adapters the server refuses, at start and at run time, each with a message naming the
adapter and the problem; a refusal loses nothing already loaded. Unloading lets the
requests already in the engine finish with their adapter."""

from __future__ import annotations

import pytest
import torch
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.engine import LLMEngine, UnknownAdapterError
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.lora.adapter import LoRAAdapterError
from llmservice.server.lora.modules import LoRAModule, parse_lora_modules

from tests.support.lora_fixtures import save_adapter, save_base

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-refusals")
    base = save_base(root / "base")
    good = save_adapter(base, root / "good", 8, seed=1)
    engine = LLMEngine.from_config(EngineConfig(
        model=str(base), enable_lora=True, lora_modules=[f"good={good}"], max_loras=1, max_lora_rank=16,
        max_model_len=128, num_threads=1, max_step_ms=0,
    ))  # fmt: skip
    return root, base, engine


def generate(engine: LLMEngine, lora_name: str | None) -> list[int]:
    req = engine.add_request([5, 6, 7, 8], GREEDY, lora_name=lora_name)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        tokens += [t for d in engine.step() if d.request_id == req.request_id for t in d.new_token_ids]
    return tokens


def test_rank_above_the_limit(setup):
    root, base, engine = setup
    path = save_adapter(base, root / "r32", 32, seed=2)
    with pytest.raises(LoRAAdapterError, match=r"adapter 'r32': rank 32 is above --max-lora-rank 16"):
        engine.add_lora("r32", str(path))
    assert engine.lora_names() == ["good"]


def test_target_modules_the_model_lacks(setup):
    root, base, engine = setup
    path = save_adapter(base, root / "head", 8, seed=3, modules=["q_proj", "lm_head"])
    with pytest.raises(LoRAAdapterError, match=r"adapter 'head': target modules \['lm_head'\]"):
        engine.add_lora("head", str(path))


def test_adapter_of_another_base_model(setup, tmp_path):
    _, _, engine = setup
    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    ))  # fmt: skip
    cfg = peft.LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    peft.get_peft_model(other, cfg).save_pretrained(tmp_path / "other")
    with pytest.raises(LoRAAdapterError, match=r"adapter 'other'.* does not fit .*layer 0 q_proj is 64->64 in the model"):
        engine.add_lora("other", str(tmp_path / "other"))


def test_corrupt_files(setup, tmp_path):
    root, base, engine = setup
    path = save_adapter(base, tmp_path / "bad", 8, seed=4)
    (path / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(LoRAAdapterError, match="adapter 'bad': cannot read adapter_model.safetensors"):
        engine.add_lora("bad", str(path))
    (path / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoRAAdapterError, match="adapter 'bad': cannot read"):
        engine.add_lora("bad", str(path))
    with pytest.raises(LoRAAdapterError, match="adapter 'missing': cannot read"):
        engine.add_lora("missing", str(tmp_path / "nowhere"))
    assert engine.lora_names() == ["good"]


def test_refusals_lose_nothing_and_names_are_unique(setup):
    root, _, engine = setup
    before = generate(engine, "good")
    with pytest.raises(LoRAAdapterError, match="'good' is already loaded"):
        engine.add_lora("good", str(root / "good"))
    with pytest.raises(UnknownAdapterError, match="'nope' is not loaded; loaded: \\['good'\\]"):
        engine.make_request([1, 2], GREEDY, lora_name="nope")
    assert generate(engine, "good") == before != generate(engine, None)


def test_unload_lets_running_requests_finish_then_reload_is_a_new_key(setup):
    root, _, engine = setup
    engine.add_lora("tmp", str(root / "good"))
    solo = generate(engine, "tmp")
    req = engine.add_request([5, 6, 7, 8], GREEDY, lora_name="tmp")
    engine.step()  # running, holding the slot
    engine.remove_lora("tmp")
    with pytest.raises(UnknownAdapterError):
        engine.make_request([1, 2], GREEDY, lora_name="tmp")
    tokens = list(req.output_token_ids)
    while engine.has_unfinished_requests():
        engine.step()
    assert req.output_token_ids == solo and tokens == solo[: len(tokens)]
    assert "tmp" not in engine.lora.by_key  # retired once nothing uses it
    engine.add_lora("tmp", str(root / "good"))
    assert engine.lora.key_of("tmp") == "tmp#2"  # its prefix-cache key differs from the old one's
    assert generate(engine, "tmp") == solo
    engine.remove_lora("tmp")
    with pytest.raises(KeyError):
        engine.remove_lora("tmp")


def test_start_refuses_a_bad_adapter_naming_it(setup, tmp_path):
    root, base, _ = setup
    path = save_adapter(base, tmp_path / "big", 32, seed=5)
    with pytest.raises(ConfigError, match=r"--lora-modules: adapter 'big': rank 32 is above --max-lora-rank 16"):
        LLMEngine.from_config(EngineConfig(model=str(base), enable_lora=True, lora_modules=[f"big={path}"],
                                           max_model_len=64, num_threads=1, max_step_ms=0))  # fmt: skip


def test_lora_module_forms_and_flag_rules():
    assert parse_lora_modules(["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}']) == [
        LoRAModule("a", "/x"), LoRAModule("b", "/y", "m")]  # fmt: skip
    for bad, message in [("a", "expected name=path"), ("=/x", "name ''"), ('{"name": "a"}', "needs"),
                         ('{"name": "a", "path": "/x", "rank": 4}', "unknown keys"), ("{", "not valid JSON")]:
        with pytest.raises(ValueError, match=message):
            parse_lora_modules([bad])
    with pytest.raises(ValueError, match="'a' is given twice"):
        parse_lora_modules(["a=/x", "a=/y"])
    with pytest.raises(ConfigError, match="--lora-modules needs --enable-lora"):
        EngineConfig(lora_modules=["a=/x"])
    with pytest.raises(ConfigError, match="--max-cpu-loras 1 must be >= --max-loras 2"):
        EngineConfig(enable_lora=True, max_loras=2, max_cpu_loras=1)
    with pytest.raises(ConfigError, match="--tensor-parallel-size"):
        EngineConfig(enable_lora=True, tensor_parallel_size=2)
