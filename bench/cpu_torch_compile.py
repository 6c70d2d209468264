"""Does `torch.compile` pay on the CPU decode path? Eager against compiled, same session.

The issue asked to measure it before adopting it. Timed: `forward_hidden` of a
decode-only step at each batch size, on the packed weights (the default; the step is the
one-call C decoder, which torch.compile cannot look into) and on `--cpu-weights fp32`
(the Python layer loop over F.linear and the C per-layer ops), eager and under
`torch.compile(dynamic=True)`; also the first compiled call's time (compilation). The
compiled outputs are checked against eager's.

    .venv/bin/python bench/cpu_torch_compile.py --threads 2   # -> bench/results/cpu_torch_compile.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import torch
from cpu_decode_layers import BLOCK, decode_meta
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loader import load_model


def timed(fn, batch: int, context: int, kv, ids, positions, runs: int) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(runs):
        meta = decode_meta(batch, context)
        t0 = time.perf_counter()
        out = fn(ids, positions, meta, kv)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for weights in ("quantized", "fp32"):
        loaded = load_model(common.CHOICE.model, torch.float32, cpu_weights=weights)
        cfg = loaded.config
        model = LlamaModel(cfg, loaded.weights, torch.device("cpu"), torch.float32, args.context + 1)
        compiled = torch.compile(model.forward_hidden, dynamic=True)
        blocks = max(args.batch) * -(-args.context // BLOCK)
        shape = (blocks, BLOCK, model.num_kv_heads, cfg.head_dim)
        kv = [(torch.randn(shape), torch.randn(shape)) for _ in model.layers]
        for batch in args.batch:
            ids = torch.randint(0, cfg.vocab_size, (batch,))
            positions = torch.full((batch,), args.context - 1)
            t0 = time.perf_counter()
            compiled(ids, positions, decode_meta(batch, args.context), kv)
            first_s = time.perf_counter() - t0
            eager_ms, want = timed(model.forward_hidden, batch, args.context, kv, ids, positions, args.runs)
            compiled_ms, got = timed(compiled, batch, args.context, kv, ids, positions, args.runs)
            eager2_ms, _ = timed(model.forward_hidden, batch, args.context, kv, ids, positions, args.runs)
            eager_ms = min(eager_ms, eager2_ms)  # eager before and after: the better of the two
            row = {"weights": weights, "batch": batch, "eager_ms": eager_ms, "compiled_ms": compiled_ms,
                   "ratio": compiled_ms / eager_ms, "first_compiled_call_s": first_s,
                   "max_abs_diff": (got - want).abs().max().item()}  # fmt: skip
            rows.append(row)
            print(f"{weights:9s} batch {batch:3d}: eager {eager_ms:7.2f} ms  compiled {compiled_ms:7.2f} ms "
                  f"(x{row['ratio']:.2f})  first call {first_s:6.1f} s  |diff| {row['max_abs_diff']:.1e}", flush=True)  # fmt: skip
        torch._dynamo.reset()
    common.write("cpu_torch_compile", {"threads": args.threads, "context": args.context, "rows": rows})


if __name__ == "__main__":
    main()
