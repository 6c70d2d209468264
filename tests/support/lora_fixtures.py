"""A small random Llama saved by transformers (with a tokenizer) and LoRA adapters for it
made and saved by PEFT, for the LoRA engine, parity and HTTP tests."""

from __future__ import annotations

import json
from pathlib import Path

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_base(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (GQA, fp32) with weights ~N(0, 0.2): logits far from ties, so greedy
    tokens are a sharp comparison."""
    import torch
    import transformers

    from tests.support.hub_endpoint import tiny_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = tiny_tokenizer(folder)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder


def load_base(folder: Path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def save_adapter(base_folder: Path, out: Path, rank: int, seed: int, modules: list[str] | None = None) -> Path:
    """A PEFT LoRA adapter of `rank` on `modules` (default: all seven projections) whose
    A and B are random (N(0, 0.1)), saved by PEFT (adapter_config.json + safetensors)."""
    import peft
    import torch

    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules or MODULES,
                             init_lora_weights=False)  # fmt: skip
    model = peft.get_peft_model(load_base(base_folder), config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.1)
    model.save_pretrained(out)
    return out


def peft_model(base_folder: Path, adapters: dict[str, Path]):
    """The base with every adapter loaded by PEFT (select one with set_adapter)."""
    import peft

    names = list(adapters)
    model = peft.PeftModel.from_pretrained(load_base(base_folder), str(adapters[names[0]]), adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(str(adapters[name]), adapter_name=name)
    return model.eval()
