"""The engine serving LoRA adapters reproduces HF transformers + PEFT (fp32): logits of
each adapter, and greedy tokens of requests for two adapters and the base model mixed in
one batch, at block sizes 8 and 128 with prefix caching on, with slot pressure
(--max-loras 1) and with preemption."""

from __future__ import annotations

import pytest
import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import score_tokens

from tests.support.lora_fixtures import peft_model, save_adapter, save_base

pytest.importorskip("peft")
torch.set_num_threads(1)

PROMPTS = [[5, 17, 33, 80, 101, 7, 9, 250, 3, 44, 61, 12], [9, 8, 7, 6, 5, 4, 3, 2, 11, 13, 90, 91, 92, 93, 94, 95, 96, 97]]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = save_base(root / "base")
    adapters = {
        "a8": save_adapter(base, root / "a8", 8, seed=1),
        "b16": save_adapter(base, root / "b16", 16, seed=2, modules=["q_proj", "v_proj", "gate_proj", "down_proj"]),
    }
    return base, adapters


@pytest.fixture(scope="module")
def reference(files):
    """PEFT's greedy tokens for (adapter or None, prompt index), computed once each."""
    base, adapters = files
    model = peft_model(base, adapters)
    cache: dict = {}

    def tokens(adapter: str | None, i: int) -> list[int]:
        if (adapter, i) not in cache:
            x = torch.tensor([PROMPTS[i]])
            kwargs = dict(attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=0)  # fmt: skip
            with torch.no_grad():
                if adapter is None:
                    with model.disable_adapter():
                        out = model.generate(x, **kwargs)
                else:
                    model.set_adapter(adapter)
                    out = model.generate(x, **kwargs)
            cache[(adapter, i)] = out[0, x.shape[1] :].tolist()
        return cache[(adapter, i)]

    tokens.model = model
    return tokens


def make_engine(files, **overrides) -> LLMEngine:
    base, adapters = files
    config = dict(model=str(base), enable_lora=True, lora_modules=[f"{n}={p}" for n, p in adapters.items()],
                  max_loras=2, max_lora_rank=16, max_model_len=256, num_threads=1, max_step_ms=0,
                  enable_prefix_caching=True)  # fmt: skip
    return LLMEngine.from_config(EngineConfig(**{**config, **overrides}))


def run(engine: LLMEngine, jobs: list[tuple[str | None, int]]) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    reqs = [engine.add_request(PROMPTS[i], sp, lora_name=name) for name, i in jobs]
    out: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    while engine.has_unfinished_requests():
        for d in engine.step():
            out[d.request_id] += d.new_token_ids
    return [out[r.request_id] for r in reqs]


@pytest.fixture(scope="module", params=[8, 128], ids=lambda b: f"block{b}")
def engine(request, files):
    return make_engine(files, block_size=request.param)


def test_logits_of_each_adapter_match_peft(engine, reference):
    model = reference.model
    ids = PROMPTS[1]
    for name in ("a8", "b16"):
        key = engine.lora.key_of(name)
        assert engine.lora.slots.acquire("logits-test", key)
        engine.lora.copy_pending()
        engine.model.lora.set_rows([engine.lora.slots.slot_of(key)] * len(ids))
        ours = score_tokens(engine.model, ids)
        engine.model.lora.set_rows(None)
        engine.lora.slots.release("logits-test")
        model.set_adapter(name)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0]
            with model.disable_adapter():
                plain = model(torch.tensor([ids])).logits[0]
        assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()
        assert (ref - plain).abs().max() > 100 * 1e-4 * ref.abs().max()  # the adapter matters


def test_mixed_batch_matches_peft_and_adapters_never_share_kv(engine, reference):
    jobs = [("a8", 0), ("b16", 0), (None, 0), ("a8", 1), (None, 1), ("b16", 1)]
    outs = run(engine, jobs)
    for (name, i), got in zip(jobs, outs, strict=True):
        assert got == reference(name, i), (name, i)
    assert outs[0] != outs[1] or outs[0] != outs[2]  # the three variants are not one output
    # the same prompt again under each variant: prefix-cache hits stay within a variant
    queries_before = engine.scheduler.stats.prefix_hits
    again = run(engine, [("b16", 0), (None, 0), ("a8", 0)])
    assert again == [reference("b16", 0), reference(None, 0), reference("a8", 0)]
    if engine.config.block_size < len(PROMPTS[0]):  # a full block to hit (not at block size 128)
        assert engine.scheduler.stats.prefix_hits > queries_before


def test_one_slot_and_preemption_keep_every_answer(files, reference):
    """--max-loras 1: a request whose adapter cannot get the slot waits; a KV pool too
    small for the batch preempts; every answer is still PEFT's."""
    engine = make_engine(files, block_size=8, max_loras=1, num_gpu_blocks_override=8, max_model_len=64)
    jobs = [("a8", 1), ("b16", 1), (None, 1), ("a8", 0), ("b16", 0)]
    outs = run(engine, jobs)
    assert outs == [reference(name, i) for name, i in jobs]
    assert engine.scheduler.stats.num_preemptions > 0


def test_an_adapter_dropped_from_the_host_lru_is_read_again_after_a_read_that_finished_early(files):
    """A read on the loader thread can finish before `submit` returns (a busy machine
    deschedules the engine's thread): the adapter must still be read again once the host
    LRU drops it, or its requests wait forever. Here every read finishes inside submit."""
    from concurrent.futures import Future

    engine = make_engine(files, max_loras=1)
    lora = engine.lora

    def run_now(fn, *args):
        done: Future = Future()
        fn(*args)
        done.set_result(None)
        return done

    lora._pool.submit = run_now
    a8, b16 = lora.key_of("a8"), lora.key_of("b16")
    for key in (a8, b16, a8, b16):  # each read drops the other from the one-adapter LRU
        assert not lora.in_host(key)
        assert lora.ensure_in_host(key) is False  # a read started (and here, done)
        assert lora.in_host(key) and lora.ensure_in_host(key) is True
