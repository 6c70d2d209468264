"""`--kv-cache-dtype fp8` vs `auto` on CUDA, on a model shape with random weights (the GPU
machine has no copy of the GGUF; docs/gpu.md). Writes gpu-kv_fp8.json:

- capacity: the KV blocks the CUDA memory plan gives each (same --gpu-memory-utilization,
  bf16 model by default), so how many max-length sequences fit at once; fp8 stores 1 byte
  per element, bf16 2.
- tokens: greedy agreement fp8 vs auto over --prompts prompts (CUDA graphs on, as
  served). Random weights have small logit gaps, so this is a pessimistic figure.
- kernels: fp8 pools through the Triton kernels vs the torch path (fp32 model, the same
  bytes read): prefill logits' relative error and greedy tokens; graph replays under fp8.

    python scripts/gpu_kv_fp8_check.py --model .gpu/models/smollm2-135m-shape --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import traceback
from pathlib import Path

import torch
from gpu_engine_check import agreement, prompts
from llmservice.kernels import kv_quant
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.runner import allocate_kv_caches
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loader import load_model

MAX_MODEL_LEN = 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--device", default="cuda", help="cpu: a plumbing run, the torch path for both")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", help="the model's dtype in the fp8 vs auto runs")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                    help="below the default: the engine check may share the GPU meanwhile")  # fmt: skip
    args = ap.parse_args()
    cuda = args.device == "cuda"
    report: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                    "prompts": args.prompts, "max_tokens": args.max_tokens}  # fmt: skip
    out = Path(args.out) / "gpu-kv_fp8.json"
    t0 = time.time()
    loaded = load_model(args.model, torch.float32, load_format="dummy", device=args.device)
    for name, fn in [
        (f"fp8_vs_auto_{args.dtype}", lambda: fp8_vs_auto(loaded, args)),
        ("fp8_triton_vs_torch_fp32", lambda: triton_vs_torch(loaded, args)),
    ]:
        try:
            report[name] = fn()
        except Exception:  # the report says what broke; the next check still runs
            report[name] = {"error": traceback.format_exc(limit=6)}
        print(name, json.dumps(report[name], default=str)[:800], flush=True)
        report["elapsed_s"] = time.time() - t0
        out.write_text(json.dumps(report, indent=2, default=str))
    os.environ.pop("LLMSERVICE_KERNELS", None)
    print(f"wrote {out}")


def _engine(loaded, args, **cfg) -> LLMEngine:
    base = dict(model="dummy", device=args.device, max_model_len=MAX_MODEL_LEN, max_num_seqs=64,
                gpu_memory_utilization=args.gpu_memory_utilization)  # fmt: skip
    if args.device != "cuda":
        # a plumbing run: the CPU plan needs a budget, and no timed step profile
        base |= dict(kv_cache_memory_gib=0.05, max_step_ms=0)
    return LLMEngine.from_config(EngineConfig(**(base | cfg)), loaded=loaded)


def _generate(eng: LLMEngine, n: int, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in eng.generate(prompts(n, seed=11), params)]


def _release(eng: LLMEngine) -> None:
    """Free the engine's pools before the next plan measures the device."""
    del eng
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def token_match(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions with the same token (a first difference shifts what follows,
    so this is a floor on per-step agreement)."""
    pairs = [(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True)]
    return sum(x == y for x, y in pairs) / max(len(pairs), 1)


def fp8_vs_auto(loaded, args) -> dict:
    os.environ["LLMSERVICE_KERNELS"] = "triton" if args.device == "cuda" else "torch"
    runs, tokens = {}, {}
    for kv in ("auto", "fp8"):
        eng = _engine(loaded, args, dtype=args.dtype, kv_cache_dtype=kv)
        t = time.perf_counter()
        tokens[kv] = _generate(eng, args.prompts, args.max_tokens)
        blocks = eng.block_manager.num_blocks
        runs[kv] = {
            "num_blocks": blocks, "block_size": eng.config.block_size,
            "kv_bytes_per_token": eng.memory_plan.kv_bytes_per_token,
            "max_concurrent_full_length_seqs": blocks // -(-MAX_MODEL_LEN // eng.config.block_size),
            "pool_dtype": str(eng.runner.kv_caches[0][0].dtype), "generate_s": time.perf_counter() - t,
            "graph_replays": eng.runner.num_graph_replays, "free_blocks_after": eng.block_manager.num_free_blocks,
        }  # fmt: skip
        _release(eng)
    return {
        "runs": runs,
        "block_ratio_fp8_over_auto": runs["fp8"]["num_blocks"] / max(runs["auto"]["num_blocks"], 1),
        "greedy": agreement(tokens["fp8"], tokens["auto"]) | {"token_match": token_match(tokens["fp8"], tokens["auto"])},
    }  # fmt: skip


def triton_vs_torch(loaded, args) -> dict:
    """The same fp8 bytes read by both kernel paths (fp32 model): they differ only in
    summation order, so logits agree to fp32 rounding and tokens should be identical."""
    paths = ("triton", "torch") if args.device == "cuda" else ("torch", "torch")
    device = torch.device(args.device)
    model = LlamaModel(loaded.config, loaded.weights, device, torch.float32, 2048)
    ids = prompts(1, seed=3)[0] + prompts(1, seed=4)[0]
    logits, tokens, replays = [], [], []
    for path in paths:
        os.environ["LLMSERVICE_KERNELS"] = path
        logits.append(fp8_prefill_logits(model, ids))
        eng = _engine(loaded, args, dtype="float32", kv_cache_dtype="fp8", kv_cache_memory_gib=1.0)
        tokens.append(_generate(eng, min(args.prompts, 16), min(args.max_tokens, 24)))
        replays.append(eng.runner.num_graph_replays)
        _release(eng)
    ref = logits[1]
    return {
        "paths": list(paths), "prefill_tokens": len(ids),
        "logits_rel_err": float((logits[0] - ref).norm() / ref.norm()),
        "argmax_agree": float((logits[0].argmax(-1) == ref.argmax(-1)).float().mean()),
        "finite": bool(torch.isfinite(logits[0]).all()),
        "greedy": agreement(tokens[0], tokens[1]) | {"token_match": token_match(tokens[0], tokens[1])},
        "graph_replays": replays,
    }  # fmt: skip


@torch.inference_mode()
def fp8_prefill_logits(model: LlamaModel, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Logits at every position of one prefill written into and read from fp8 pools."""
    n = len(ids)
    nblocks = -(-n // block_size)
    caches = allocate_kv_caches(model, nblocks, block_size, "fp8")
    assert kv_quant.is_quantized(caches[0][0])
    dev = model.device
    meta = AttentionMetadata.one_sequence(n, block_size, dev)
    positions = torch.arange(n, device=dev)
    ids_t = torch.tensor(ids, device=dev)
    return model.forward(ids_t, positions, meta, caches, positions).float().cpu()


if __name__ == "__main__":
    main()
