"""The Triton fused MoE (kernels/triton_moe.py) against a torch per-expert loop, one
Qwen3-30B-A3B MoE layer (H=2048, I=768, E=128, K=8, bf16), T = 1, 16, 128, 1024 tokens.

    python bench/moe_kernel.py --out DIR           # CUDA: DIR/gpu-moe_kernel.json
    python bench/moe_kernel.py --smoke --out DIR   # CPU, Triton interpreter, tiny shape

The loop is what a model without the kernel does: sort the (token, k) pairs by expert,
copy the per-expert counts to the host, and per used expert one F.linear for gate/up,
SiLU-and-mul, one F.linear for down, scale by the routing weight and index_add into the
output. Routing is a softmax over random logits, top-K, renormalised (Qwen3's
norm_topk_prob). Per T: both times (triton.testing.do_bench medians on CUDA, wall-clock
medians on CPU), the speed-up, the weight bytes of the experts used over the fused time
(decode is bound by those bytes), TFLOP/s, the fused output's relative error against the
loop's, and the fused time of a few other tile configs (the defaults are untuned).
`--smoke` checks the plumbing only; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import torch
import torch.nn.functional as F
import triton
from llmservice.kernels import reference
from llmservice.kernels.triton_moe import MoEConfig, choose_config, fused_moe

FULL = {"hidden": 2048, "inter": 768, "experts": 128, "top_k": 8, "tokens": [1, 16, 128, 1024]}
SMOKE = {"hidden": 64, "inter": 48, "experts": 8, "top_k": 2, "tokens": [1, 5]}
SWEEP = [MoEConfig(16, 64, 64), MoEConfig(32, 64, 64), MoEConfig(64, 64, 64, 8),
         MoEConfig(64, 128, 64, 8), MoEConfig(16, 128, 64)]  # fmt: skip


def torch_moe(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The per-expert loop: one F.linear pair per expert that has tokens."""
    num_tokens, top_k = topk_ids.shape
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()  # a host sync
    weights = topk_weights.reshape(-1)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        tokens = pairs // top_k
        gate_up = F.linear(x[tokens], w13[expert])
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(h, w2[expert]).float() * weights[pairs, None]
        out.index_add_(0, tokens, y)
        start += count
    return out.to(x.dtype)


def routing(num_tokens: int, num_experts: int, top_k: int, device, gen):
    logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
    weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def timer(device: torch.device, reps: int) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of fn: do_bench on CUDA, wall clock on CPU."""
    if device.type == "cuda":
        return lambda fn: float(
            triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        )

    def wall(fn) -> float:
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return wall


def run(
    shape: dict, device: torch.device, dtype: torch.dtype, reps: int, sweep: list[MoEConfig]
) -> dict:
    gen = torch.Generator(device).manual_seed(0)  # on the device: 1.2 GB of weights on CUDA
    hidden, inter = shape["hidden"], shape["inter"]
    experts, top_k = shape["experts"], shape["top_k"]

    def randn(*size: int, scale: float) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=device) * scale).to(dtype)

    w13 = randn(experts, 2 * inter, hidden, scale=hidden**-0.5)
    w2 = randn(experts, hidden, inter, scale=inter**-0.5)
    expert_bytes = (w13[0].numel() + w2[0].numel()) * w13.element_size()
    time_ms = timer(device, reps)
    rows = []
    for num_tokens in shape["tokens"]:
        x = randn(num_tokens, hidden, scale=1.0)
        weights, ids = routing(num_tokens, experts, top_k, device, gen)
        args = (x, w13, w2, weights, ids)
        fused_ms = time_ms(lambda args=args: fused_moe(*args))
        loop_ms = time_ms(lambda args=args: torch_moe(*args))
        used = int(torch.unique(ids).numel())
        flops = 2 * num_tokens * top_k * 3 * hidden * inter
        default = choose_config(num_tokens * top_k, experts, dtype)
        configs = {}
        for cfg in sweep:
            key = f"m{cfg.block_m}_n{cfg.block_n}_k{cfg.block_k}_w{cfg.num_warps}"
            configs[key] = time_ms(lambda args=args, cfg=cfg: fused_moe(*args, config=cfg))
        rows.append({
            "tokens": num_tokens,
            "experts_used": used,
            "fused_ms": fused_ms,
            "loop_ms": loop_ms,
            "speedup": loop_ms / fused_ms,
            "weight_GBps": used * expert_bytes / fused_ms / 1e6,
            "TFLOPs": flops / fused_ms / 1e9,
            "rel_err_vs_loop": reference.relative_error(fused_moe(*args), torch_moe(*args)),
            "default_config": vars(default),
            "config_ms": configs,
        })  # fmt: skip
        r = rows[-1]
        print(
            f"T={num_tokens:5d} experts used {used:3d}: fused {fused_ms:8.3f} ms, loop {loop_ms:8.3f} ms"
            f" ({r['speedup']:5.1f}x), {r['weight_GBps']:7.1f} GB/s of weights, {r['TFLOPs']:6.2f} TFLOP/s,"
            f" rel err {r['rel_err_vs_loop']:.1e}"
        )
        if configs:
            best = min(configs, key=configs.get)
            print(f"         default {vars(default)}; best of sweep {best} {configs[best]:.3f} ms")
    return {
        "shape": {k: v for k, v in shape.items() if k != "tokens"},
        "dtype": str(dtype),
        "results": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (Triton interpreter)")
    ap.add_argument("--out", default=None, help="results folder (default $OUT, else bench/results)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the other tile configs")
    args = ap.parse_args(argv)
    if args.smoke:
        device, shape, reps, sweep = torch.device("cpu"), SMOKE, 3, SWEEP[:1]
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke for the CPU plumbing check", file=sys.stderr)
            return 2
        device, shape, reps, sweep = torch.device("cuda"), FULL, 0, SWEEP
    report = {
        "meta": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        },
        **run(shape, device, torch.bfloat16, reps, [] if args.no_sweep else sweep),
    }
    out_dir = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{'smoke' if args.smoke else 'gpu'}-moe_kernel.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
