"""The PEFT loader and the per-row-group delta reproduce PEFT's own LoRA projections on a
tiny random Llama (adapters made and saved by peft), rows of two adapters and the base mixed."""

from __future__ import annotations

import json

import pytest
import torch
from llmservice.server.lora.adapter import LoRAAdapterError, load_peft_adapter
from llmservice.server.lora.delta import lora_delta

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _tiny_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _save_adapter(tmp_path, name: str, rank: int, seed: int):
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=MODULES, init_lora_weights=False)
    model = peft.get_peft_model(_tiny_llama(), cfg, adapter_name="default")
    model.save_pretrained(tmp_path / name)
    return model


def test_mixed_batch_matches_peft_on_every_projection(tmp_path):
    peft_models = [_save_adapter(tmp_path, "a8", 8, 1), _save_adapter(tmp_path, "a16", 16, 2)]
    adapters = [load_peft_adapter(n, tmp_path / n, max_rank=16) for n in ("a8", "a16")]
    row_slots = torch.tensor([0, -1, 1, 0, 1, -1])
    torch.manual_seed(3)
    for layer in range(2):
        for module in MODULES:
            group = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            peft_linears = [getattr(getattr(m.base_model.model.model.layers[layer], group), module) for m in peft_models]
            base = peft_linears[0].base_layer
            x = torch.randn(len(row_slots), base.in_features)
            a_stack = torch.zeros(2, 16, base.in_features)
            b_stack = torch.zeros(2, base.out_features, 16)
            for slot, ad in enumerate(adapters):
                a, b = ad.weights[(layer, module)]
                a_stack[slot, : ad.rank], b_stack[slot, :, : ad.rank] = a, b
            scalings = torch.tensor([ad.scaling for ad in adapters])
            with torch.no_grad():
                got = base(x) + lora_delta(x, row_slots, a_stack, b_stack, scalings)
                want = torch.stack([
                    (base(x[i]) if s < 0 else peft_linears[s](x[i])) for i, s in enumerate(row_slots.tolist())
                ])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_refuses_rank_above_limit_and_unknown_modules(tmp_path):
    _save_adapter(tmp_path, "a16", 16, 1)
    with pytest.raises(LoRAAdapterError, match="rank 16 is above --max-lora-rank 8"):
        load_peft_adapter("a16", tmp_path / "a16", max_rank=8)
    cfg_path = tmp_path / "a16" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["target_modules"] = ["q_proj", "lm_head"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(LoRAAdapterError, match="lm_head"):
        load_peft_adapter("a16", tmp_path / "a16", max_rank=16)


def test_refuses_corrupt_weights(tmp_path):
    _save_adapter(tmp_path, "a8", 8, 1)
    (tmp_path / "a8" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LoRAAdapterError, match="cannot read adapter_model.safetensors"):
        load_peft_adapter("a8", tmp_path / "a8", max_rank=16)
