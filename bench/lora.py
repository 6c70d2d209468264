"""Multi-LoRA throughput: the embedded model (builtin:smollm2-135m) with N random LoRA
adapters (rank 8 and 16, all seven projections) written in PEFT's file format, against
the base model alone, same load (a closed batch of R requests, P prompt tokens, T greedy
tokens each), one run, one engine. Prints tok/s per case and the ratio to the base; writes
bench/results/lora.json (gpu-lora.json on CUDA, where the delta runs in the Triton LoRA
kernels). Target: >= 0.8x of the base with 8 adapters on CPU, with 64 on GPU.

    .venv/bin/python bench/lora.py [--quick] [--adapters 1 8 64] [--rounds 3]

The cases run in turn within each round (base, then each adapter count), and a case's
figure is the median over rounds of its tok/s and of its ratio to the same round's base:
on a shared machine the load drifts between minutes, not within one round.
    # a GPU session (scripts/gpu_session.sh): random weights of the model's shape
    python bench/lora.py --model .gpu/models/smollm2-135m-shape --load-format dummy --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import common  # the script's folder is on sys.path when it runs
import torch


def save_adapters(root: Path, config, n: int) -> dict[str, Path]:
    """N adapters of the base's shapes, random A and B, as PEFT saves them
    (adapter_config.json + adapter_model.safetensors; peft itself is not needed, so the
    GPU image without it runs this too)."""
    from llmservice.server.lora.fit import projection_shapes
    from safetensors.torch import save_file

    shapes = projection_shapes(config)
    gen = torch.Generator().manual_seed(1)
    out = {}
    for i in range(n):
        rank = 8 if i % 2 == 0 else 16
        tensors = {}
        for layer in range(config.num_layers):
            for module, (fan_in, fan_out) in shapes.items():
                group = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
                key = f"base_model.model.model.layers.{layer}.{group}.{module}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
                tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.01
        out[f"a{i}"] = root / f"a{i}"
        out[f"a{i}"].mkdir()
        save_file(tensors, str(out[f"a{i}"] / "adapter_model.safetensors"))
        (out[f"a{i}"] / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(shapes),
        }))  # fmt: skip
    return out


def run(engine, prompts: list[list[int]], names: list[str | None], max_tokens: int) -> float:
    """Generated tokens per second of the whole closed batch."""
    sp = common.greedy(max_tokens)
    t0 = time.perf_counter()
    for prompt, name in zip(prompts, names, strict=True):
        engine.add_request(prompt, sp, lora_name=name)
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(d.new_token_ids) for d in engine.step())
    return generated / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 requests x 16 tokens, adapters 1 and 8")
    ap.add_argument("--adapters", type=int, nargs="+", default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="each case this many times, interleaved")
    common.add_model_args(ap)
    args = ap.parse_args()
    counts = args.adapters or ([1, 8] if args.quick else [1, 8, 64])
    requests = args.requests or (8 if args.quick else 64)
    prompt_len, max_tokens = 32, 16 if args.quick else 32
    loaded = common.setup(args.threads, args)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = save_adapters(Path(tmp), loaded.config, max(counts))
        engine = common.engine(
            max_model_len=512, enable_lora=True, max_loras=max(counts), max_lora_rank=16,
            max_cpu_loras=max(counts), lora_modules=[f"{n}={p}" for n, p in adapters.items()],
            num_threads=args.threads, max_num_seqs=max(requests, 1), enable_prefix_caching=False,
        )  # fmt: skip
        gen = torch.Generator().manual_seed(0)
        vocab = loaded.config.vocab_size
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=gen).tolist() for _ in range(requests)]
        run(engine, prompts[:2], [None, "a0"], 4)  # warm-up: both paths once
        names = list(adapters)
        cases = {"base": [None] * requests}
        cases |= {f"{n}_adapters": [names[i % n] for i in range(requests)] for n in counts}
        rounds = [{case: run(engine, prompts, who, max_tokens) for case, who in cases.items()}
                  for _ in range(args.rounds)]  # fmt: skip
        on_c = engine.model.lora is not None and engine.model.lora.cpu is not None
    figures = {case: statistics.median(r[case] for r in rounds) for case in cases}
    ratios = {case: statistics.median(r[case] / r["base"] for r in rounds) for case in cases}
    for case, tps in figures.items():
        each = " ".join(f"{r[case] / r['base']:.2f}" for r in rounds)
        print(f"{case:>12}: {tps:8.1f} tok/s  {ratios[case]:5.2f}x of the base (rounds: {each})")
    delta = "triton kernels" if common.on_gpu() else "C kernels (cpu_lora.c)" if on_c else "per-group torch"
    common.write("lora", {
        "requests": requests, "prompt_tokens": prompt_len, "max_tokens": max_tokens, "threads": args.threads,
        "rounds": args.rounds, "tok_per_s": figures, "ratio_to_base": ratios, "per_round_tok_per_s": rounds,
        "target": "ratio >= 0.8 with 8 adapters on CPU, with 64 on GPU",
        "lora_delta": delta,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
