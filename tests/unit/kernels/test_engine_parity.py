"""The engine with the Triton kernels forced (interpreter on CPU) generates exactly the
tokens the torch path generates, greedy, on the embedded SmolLM2 model.

The interpreter costs tens of milliseconds per kernel program and the model has 30
layers, so the default test is one prompt and three tokens; the slow one adds chunked
prefill (mixed decode + prefill steps) and prefix-cache hits.
"""

import pytest
from llmservice.kernels import (
    kv_quant,
    triton_cache,
    triton_decode,
    triton_norm,
    triton_prefill,
    triton_rotary,
)
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams


def _engine(**overrides) -> LLMEngine:
    config = dict(max_model_len=256, kv_cache_memory_gib=0.05, num_threads=1, block_size=16)
    config.update(overrides)
    return LLMEngine.from_config(EngineConfig(**config))


def _generate(engine, prompts, max_tokens):
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)
    return engine.generate(prompts, params)


def _tokens(outputs) -> list[list[int]]:
    return [list(out.token_ids) for out in outputs]


@pytest.fixture
def triton_calls(monkeypatch):
    """Counts calls into each Triton module, to prove the forced path really ran."""
    calls: dict[str, int] = {}
    targets = [
        (triton_cache, "reshape_and_cache"),
        (triton_decode, "paged_decode_attention"),
        (triton_prefill, "paged_prefill_attention"),
        (triton_norm, "fused_add_rms_norm"),
        (triton_rotary, "rotary_embedding"),
    ]
    for module, name in targets:
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            if kwargs.get("first_seq", 0) > 0:  # a prefill launch with decodes before it
                calls["mixed_batches"] = calls.get("mixed_batches", 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_greedy_tokens_match_torch_path(kv_cache_dtype, monkeypatch, triton_calls):
    """fp8: e4m3 pools, written and read by the Triton kernels as the engine does on CUDA."""
    # no prefix caching: the Triton run must compute its own KV, not reuse torch's blocks
    engine = _engine(enable_prefix_caching=False, kv_cache_dtype=kv_cache_dtype)
    assert (engine.runner.kv_caches[0][0].dtype == kv_quant.FP8) == (kv_cache_dtype == "fp8")
    prompt = ["The capital of France is"]
    monkeypatch.setenv("LLMSERVICE_KERNELS", "torch")
    want = _tokens(_generate(engine, prompt, max_tokens=3))
    assert triton_calls == {}

    monkeypatch.setenv("LLMSERVICE_KERNELS", "triton")
    got = _tokens(_generate(engine, prompt, max_tokens=3))

    assert got == want
    layers = engine.model_config.num_layers
    assert triton_calls["paged_prefill_attention"] == layers  # one prefill step
    assert triton_calls["paged_decode_attention"] == 2 * layers  # two decode steps
    assert set(triton_calls) == {
        "reshape_and_cache",
        "paged_decode_attention",
        "paged_prefill_attention",
        "fused_add_rms_norm",
        "rotary_embedding",
    }


@pytest.mark.e2e  # ~70 s of Triton interpreter on 2 cores: make e2e (make test's time)
@pytest.mark.timeout(1800)  # minutes of interpreter time; more on a shared machine
def test_chunked_prefill_and_prefix_hits_match_torch_path(monkeypatch, triton_calls):
    """Small token budget: prompts are prefilled in chunks next to running decodes; the
    second round reuses cached prefix blocks. Separate engines keep the caches apart."""
    shared = "Once upon a time in a small village by the sea, there lived"
    first = [shared + " a fisherman", "1, 2, 3, 4, 5,"]
    second = [shared + " an old baker who", shared + " a fisherman"]
    results = {}
    for path in ("torch", "triton"):
        monkeypatch.setenv("LLMSERVICE_KERNELS", path)
        engine = _engine(block_size=8, max_num_batched_tokens=12)
        round_one = _generate(engine, first, 4)
        round_two = _generate(engine, second, 4)
        assert all(out.num_cached_tokens > 0 for out in round_two), "expected prefix hits"
        results[path] = (_tokens(round_one), _tokens(round_two))
    assert results["triton"] == results["torch"]
    assert triton_calls["paged_decode_attention"] > 0
    assert triton_calls["mixed_batches"] > 0, "expected decode + prefill chunks in one step"
