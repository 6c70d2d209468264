"""Make what a GPU session carries (run here, before `scripts/gpu_session.sh` there).

The GPU machine has torch and Triton but not our model: the embedded GGUF (94 MB) is
larger than what a session may carry. The engine benchmarks there run on random weights
(`--load-format dummy`), which needs only a config.json and the tokenizer. Writes:

    .gpu/models/smollm2-135m-shape/  the embedded model's architecture
    .gpu/models/llama3-8b-shape/     Llama-3-8B's architecture (32 layers, 4096 hidden,
                                     GQA 32/8, 14336 MLP) with SmolLM2's 49152-token
                                     vocabulary, so both share one tokenizer

    .venv/bin/python scripts/gpu_prepare.py [--out .gpu]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llmservice.server.model.gguf_loader import read_gguf_info
from llmservice.server.model.registry import DEFAULT_MODEL, resolve_model_path
from llmservice.server.tokenizer import build_tokenizer


def hf_config(cfg, **overrides) -> dict:
    base = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids,
        "torch_dtype": "bfloat16",
    }
    return base | overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".gpu")
    args = ap.parse_args()
    config, source = read_gguf_info(resolve_model_path(DEFAULT_MODEL))
    tokenizer_json = build_tokenizer(source).to_str()
    shapes = {
        "smollm2-135m-shape": hf_config(config),
        "llama3-8b-shape": hf_config(
            config, num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
            head_dim=128, intermediate_size=14336, rope_theta=500000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=False, max_position_embeddings=8192,
        ),
    }
    for name, cfg in shapes.items():
        d = Path(args.out) / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        (d / "tokenizer.json").write_text(tokenizer_json)
        (d / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": source.add_bos_token}))
        print(f"wrote {d}")


if __name__ == "__main__":
    main()
