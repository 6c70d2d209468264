"""Our model vs HF transformers' LlamaForCausalLM loaded from the same GGUF file (fp32)."""

from __future__ import annotations

import pytest
import torch
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import score_tokens

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List 3 prime numbers."}],
]


@pytest.fixture(scope="module")
def hf_model(smollm):
    transformers = pytest.importorskip("transformers")
    path = smollm.path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    return model


@pytest.fixture(scope="module")
def prompt_ids(engine):
    return [engine.tokenizer.encode(engine.tokenizer.apply_chat_template(m)) for m in PROMPTS]


def test_logits_match_transformers(engine, hf_model, prompt_ids):
    for ids in prompt_ids:
        ours = score_tokens(engine.model, ids)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float()
        rel = (ours - ref).abs().max() / ref.abs().max()
        assert rel <= 1e-4, f"relative logit error {rel:.2e} for a {len(ids)}-token prompt"


def test_greedy_continuations_match_transformers(engine, hf_model, prompt_ids):
    outs = engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    for ids, out in zip(prompt_ids, outs, strict=True):
        with torch.no_grad():
            inputs = torch.tensor([ids])
            # explicit mask: the chat prompt contains <|im_end|> (id 2), which HF would treat as padding
            ref = hf_model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )[0, len(ids) :].tolist()
        assert out.token_ids == ref
