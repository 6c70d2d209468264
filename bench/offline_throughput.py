"""Offline throughput: our engine vs HF transformers static batching, same run, same machine.

Writes bench/results/offline_throughput.json. Also measures this machine's raw fp32
matmul rate on the model's own GEMM shapes and reports the engine's achieved model
FLOP/s in decode steps at batch >= 64 as a fraction of it.

    .venv/bin/python bench/offline_throughput.py [--num-requests 256] [--threads N]

On a GPU (scripts/gpu_session.sh): --device cuda --load-format dummy --model DIR runs an
8B-shaped model with random weights; HF then gets the very same weights (same names).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import common
import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from workloads import sharegpt_like


def gemm_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of every matmul in one decoder step, plus the LM head."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)]
    return per_layer * cfg.num_layers + [(h, cfg.vocab_size)]


def model_flops_per_token(cfg, context_len: int) -> float:
    gemm = sum(2 * a * b for a, b in gemm_shapes(cfg))
    attn = cfg.num_layers * 4 * cfg.num_heads * cfg.head_dim * context_len  # QK^T and PV
    return gemm + attn


def raw_matmul_rate(
    cfg, m: int, repeats: int = 3, device: str = "cpu", dtype=torch.float32
) -> float:
    """FLOP/s of plain torch matmuls over the model's GEMM shapes at batch m."""
    shapes = gemm_shapes(cfg)
    mats = {s: torch.randn(s[1], s[0], device=device, dtype=dtype) for s in set(shapes)}
    x = {s: torch.randn(m, s[0], device=device, dtype=dtype) for s in set(shapes)}
    flops = sum(2 * m * a * b for a, b in shapes)
    best = float("inf")
    for _ in range(repeats + (2 if device != "cpu" else 0)):
        _sync(device)
        t0 = time.perf_counter()
        for s in shapes:
            torch.nn.functional.linear(x[s], mats[s])
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return flops / best


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def run_engine(
    loaded, workload, max_num_seqs: int, device: str = "cpu", kv_gib: float = 2.0
) -> dict:
    engine = LLMEngine.from_config(
        EngineConfig(
            max_model_len=1024,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=2048,
            kv_cache_memory_gib=kv_gib,
            device=device,
        ),
        loaded=loaded,
    )
    for prompt, out_len in workload:
        engine.add_request(
            prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
        )
    decode_steps = []
    generated = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outs = engine.step()
        generated += sum(len(o.new_token_ids) for o in outs)
        st = engine.last_step
        if st.num_prompt_tokens == 0 and st.num_batched_tokens >= 64:
            ctx = (
                statistics.fmean(r.num_tokens for r in engine.scheduler.running)
                if engine.scheduler.running
                else 0
            )
            decode_steps.append((st.num_batched_tokens, st.duration_s, ctx))
    elapsed = time.perf_counter() - t0
    return {
        "elapsed_s": elapsed,
        "output_tokens": generated,
        "output_tok_per_s": generated / elapsed,
        "weight_bytes": engine.model.weight_bytes(),
        "decode_steps": decode_steps,
    }


def rss_mb() -> float:
    """This process's resident memory now (Linux VmRSS), in MB."""
    for line in open("/proc/self/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def hf_model(loaded, device: str, dtype: torch.dtype, from_weights: bool):
    """HF's model: read from the GGUF on CPU, or (dummy/GPU runs) built from our weights."""
    import transformers

    if not from_weights:
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(loaded.path.parent), gguf_file=loaded.path.name, dtype=torch.float32
        ).eval()
    cfg = transformers.AutoConfig.from_pretrained(str(loaded.path))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(previous)
    missing, unexpected = model.load_state_dict(loaded.weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model.to(dtype).eval()


def run_hf(model, workload, batch_size: int, device: str = "cpu") -> dict:
    useful = 0
    t0 = time.perf_counter()
    for start in range(0, len(workload), batch_size):
        batch = workload[start : start + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.full((len(batch), width), 2, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (p, _) in enumerate(batch):  # left padding
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        max_new = max(o for _, o in batch)
        with torch.no_grad():
            model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                pad_token_id=2,
                eos_token_id=None,
            )
        useful += sum(
            o for _, o in batch
        )  # tokens the requests asked for; the rest is static-batch waste
    _sync(device)
    elapsed = time.perf_counter() - t0
    return {
        "elapsed_s": elapsed,
        "requests": len(workload),
        "output_tokens": useful,
        "output_tok_per_s": useful / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument(
        "--hf-requests",
        type=int,
        default=128,
        help="HF runs on the first N requests (same distribution)",
    )
    ap.add_argument(
        "--hf-batches", type=int, nargs="+", default=[16, 64], help="HF static batch sizes to run"
    )
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--kv-cache-memory-gib", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--compare-fp32",
        action="store_true",
        help="also run the engine on dequantized fp32 weights (--cpu-weights fp32), same run",
    )
    common.add_model_args(ap)
    args = ap.parse_args()
    rss0 = rss_mb()
    loaded = common.setup(args.threads, args)
    rss_quantized = rss_mb() - rss0
    device, dtype = common.device_and_dtype()
    gpu = device.type == "cuda"
    cfg = loaded.config
    workload = sharegpt_like(args.num_requests, seed=0)
    result: dict = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        }
        | ({"gpu": torch.cuda.get_device_name()} if gpu else {}),
        "model": {
            "ref": args.model,
            "load_format": args.load_format,
            "name": cfg.name,
            "dtype": str(dtype),
            "layers": cfg.num_layers,
            "hidden": cfg.hidden_size,
        },
        "workload": {
            "num_requests": len(workload),
            "mean_prompt_tokens": statistics.fmean(len(p) for p, _ in workload),
            "mean_output_tokens": statistics.fmean(o for _, o in workload),
            "distribution": "bench/workloads.py sharegpt_like(seed=0)",
        },
    }
    rate64 = raw_matmul_rate(cfg, 64, device=device.type, dtype=dtype)
    rate128 = raw_matmul_rate(cfg, 128, device=device.type, dtype=dtype)
    print(
        f"raw {dtype} matmul rate on model GEMMs: {rate64 / 1e9:.1f} GFLOP/s (M=64), {rate128 / 1e9:.1f} (M=128)"
    )

    ours = run_engine(loaded, workload, args.max_num_seqs, device.type, args.kv_cache_memory_gib)
    steps = ours.pop("decode_steps")
    step_rates = [n * model_flops_per_token(cfg, ctx) / dt for n, dt, ctx in steps]
    mean_batch = statistics.fmean(n for n, _, _ in steps) if steps else 0
    raw = rate128 if mean_batch >= 96 else rate64
    ours["decode_steps_batch_ge_64"] = len(steps)
    ours["decode_mean_batch"] = mean_batch
    ours["decode_step_ms_median"] = (
        statistics.median(dt for _, dt, _ in steps) * 1e3 if steps else 0.0
    )
    ours["decode_model_flops_per_s_median"] = statistics.median(step_rates) if step_rates else 0.0
    ours["decode_fraction_of_raw_matmul"] = (
        ours["decode_model_flops_per_s_median"] / raw if step_rates else 0.0
    )
    print(
        f"engine: {ours['output_tok_per_s']:.1f} output tok/s; decode at batch~{mean_batch:.0f}: "
        f"{ours['decode_model_flops_per_s_median'] / 1e9:.1f} GFLOP/s = {ours['decode_fraction_of_raw_matmul']:.0%} of raw matmul"
    )
    ours["load_rss_increase_mb"] = rss_quantized
    result["engine"] = ours
    result["raw_matmul_flops_per_s"] = {"m64": rate64, "m128": rate128}
    if args.compare_fp32:
        from llmservice.server.model.loader import load_model

        rss1 = rss_mb()
        dense = load_model(
            args.model, dtype, load_format=args.load_format, device=device, cpu_weights="fp32"
        )
        fp32 = run_engine(dense, workload, args.max_num_seqs, device.type, args.kv_cache_memory_gib)
        fp32.pop("decode_steps")
        fp32["load_rss_increase_mb"] = rss_mb() - rss1
        del dense
        result["engine_fp32_weights"] = fp32
        result["quantized_vs_fp32"] = {
            "throughput_ratio": ours["output_tok_per_s"] / fp32["output_tok_per_s"],
            "weight_bytes_ratio": ours["weight_bytes"] / fp32["weight_bytes"],
        }
        print(
            f"engine on fp32 weights: {fp32['output_tok_per_s']:.1f} output tok/s; weights "
            f"{ours['weight_bytes'] / 1e6:.0f} MB quantized vs {fp32['weight_bytes'] / 1e6:.0f} MB fp32"
        )
    common.write("offline_throughput", result)  # now, and again with HF: a cut-short run keeps ours

    if not args.skip_hf:
        hf = hf_model(loaded, device.type, dtype, from_weights=gpu or args.load_format == "dummy")
        subset = workload[: args.hf_requests]
        result["hf"] = {}
        for bsz in args.hf_batches:
            r = run_hf(hf, subset, bsz, device.type)
            result["hf"][f"batch{bsz}"] = r
            print(f"HF static batch {bsz}: {r['output_tok_per_s']:.1f} useful output tok/s")
            best = max(v["output_tok_per_s"] for v in result["hf"].values())
            result["ratio_vs_best_hf"] = ours["output_tok_per_s"] / best
            common.write("offline_throughput", result)
        print(f"ratio engine / best HF: {result['ratio_vs_best_hf']:.2f}x")


if __name__ == "__main__":
    main()
