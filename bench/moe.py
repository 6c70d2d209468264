"""Mixture-of-experts throughput: our engine on a random Qwen3-MoE model saved by
transformers, against (a) our engine on its dense equivalent (the same model with one
dense MLP as wide as the k active experts together: the same FLOPs per token) and (b)
transformers' own `generate` on the very same MoE weights. One run, one machine, cases
interleaved per round; the figures are medians over rounds of output tok/s and of each
round's ratios. Writes bench/results/moe.json (gpu-moe.json on CUDA).

    .venv/bin/python bench/moe.py [--rounds 3] [--requests 16] [--threads 2]
    # a GPU session (scripts/gpu_session.sh): Qwen3-30B-A3B's layer shape, 4 of its 48 layers
    python bench/moe.py --shape qwen3-30b-a3b --layers 4 --device cuda

The closed batch: R requests of P random prompt tokens, T greedy tokens each (EOS off),
all added at once; tok/s = R*T / the batch's wall time, prefill included. transformers
runs the same R prompts as one padded-free batch (all prompts have P tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    # small enough for 2 CPU cores; 16 experts, 4 active (Qwen3-MoE routes 8 of 128)
    "small": dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256, vocab_size=8192),
    # Qwen3-30B-A3B's config.json, layers chosen by --layers
    "qwen3-30b-a3b": dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                          vocab_size=151936),
}  # fmt: skip


def save_models(root: Path, shape: str, layers: int, device: str, dtype: torch.dtype):
    """The MoE model (saved, and kept in memory for transformers) and its dense equivalent."""
    import transformers

    spec = dict(SHAPES[shape], num_hidden_layers=layers, max_position_embeddings=4096,
                norm_topk_prob=True, tie_word_embeddings=False, rope_theta=1000000.0, eos_token_id=0)  # fmt: skip
    moe_cfg = transformers.Qwen3MoeConfig(**spec, intermediate_size=spec["moe_intermediate_size"])
    dense_spec = {k: v for k, v in spec.items() if k not in ("num_experts", "num_experts_per_tok",
                                                             "moe_intermediate_size", "norm_topk_prob")}  # fmt: skip
    active = spec["num_experts_per_tok"] * spec["moe_intermediate_size"]
    dense_cfg = transformers.Qwen3Config(**dense_spec, intermediate_size=active)
    torch.manual_seed(0)
    with torch.device(device):
        moe = transformers.Qwen3MoeForCausalLM(moe_cfg).to(dtype).eval()
        dense = transformers.Qwen3ForCausalLM(dense_cfg).to(dtype).eval()
    folders = {"moe": root / "moe", "dense": root / "dense"}
    for name, model in (("moe", moe), ("dense", dense)):
        model.save_pretrained(folders[name])
        write_tokenizer(folders[name], spec["vocab_size"])
    del dense
    return moe, folders


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer of `vocab` tokens: the engine needs one; prompts are ids."""
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")).save(
        str(folder / "tokenizer.json")
    )


def run_ours(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """(output tok/s of the closed batch, each request's greedy tokens)."""
    from llmservice.server.engine.sampling_params import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [sp] * len(prompts))
    sync()
    dt = time.perf_counter() - t0
    assert sum(len(o.token_ids) for o in outs) == len(prompts) * max_tokens
    return len(prompts) * max_tokens / dt, [o.token_ids for o in outs]


def run_transformers(model, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=model.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)  # fmt: skip
    sync()
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + max_tokens
    return len(prompts) * max_tokens / dt, out[:, ids.shape[1]:].tolist()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="small")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--quick", action="store_true", help="1 round, 4 requests, 8 tokens (plumbing)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests, args.output = 1, 4, 8
    torch.set_num_threads(args.threads)
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine

    on_gpu = args.device.startswith("cuda")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    gen = torch.Generator().manual_seed(1)
    with tempfile.TemporaryDirectory() as tmp:
        hf_moe, folders = save_models(Path(tmp), args.shape, args.layers, args.device, dtype)
        vocab = SHAPES[args.shape]["vocab_size"]
        prompts = torch.randint(4, vocab, (args.requests, args.prompt), generator=gen).tolist()
        kv = dict(kv_cache_memory_gib=2.0) if on_gpu else {}
        engines = {
            name: LLMEngine.from_config(EngineConfig(
                model=str(folder), device=args.device, dtype="bfloat16" if on_gpu else "float32",
                max_model_len=args.prompt + args.output + 16, num_threads=args.threads, **kv))
            for name, folder in folders.items()
        }  # fmt: skip
        for eng in engines.values():  # warm-up: first-call costs (Triton compiles, allocator)
            run_ours(eng, prompts[:2], 2)
        run_transformers(hf_moe, prompts[:2], 2)
        rounds = []
        for r in range(args.rounds):
            (moe_tps, ours_tokens), (dense_tps, _), (hf_tps, hf_tokens) = (
                run_ours(engines["moe"], prompts, args.output),
                run_ours(engines["dense"], prompts, args.output),
                run_transformers(hf_moe, prompts, args.output),
            )
            row = {"ours_moe": moe_tps, "ours_dense_equivalent": dense_tps, "transformers_moe": hf_tps}
            rounds.append(row)
            print(f"round {r}: " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in row.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratios = {
        "moe_vs_dense_equivalent": statistics.median(r["ours_moe"] / r["ours_dense_equivalent"] for r in rounds),
        "ours_vs_transformers": statistics.median(r["ours_moe"] / r["transformers_moe"] for r in rounds),
    }
    shape = SHAPES[args.shape]
    result = {
        "shape": args.shape, "layers": args.layers, **shape, "device": args.device, "dtype": str(dtype),
        "threads": args.threads, "requests": args.requests, "prompt_tokens": args.prompt,
        "output_tokens": args.output, "rounds": rounds, "median_tok_s": med, "median_ratios": ratios,
        # greedy, same weights: fp32 on CPU should agree on every request; bf16 on a GPU
        # drifts after a near-tie in a logit or a router's top k
        "requests_with_tokens_equal_to_transformers": sum(a == b for a, b in zip(ours_tokens, hf_tokens, strict=True)),
        "expert_path": "triton fused_moe" if on_gpu else "grouped torch GEMMs (kernels/torch_moe.py)",
    }  # fmt: skip
    print(json.dumps({"median_tok_s": med, "median_ratios": ratios,
                      "tokens_equal": result["requests_with_tokens_equal_to_transformers"]}, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = ("gpu-" if on_gpu else "") + ("moe-quick" if args.quick else "moe") + ".json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
