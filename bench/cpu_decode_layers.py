"""A decode step's decoder layers on CPU: the one-call C decoder against the Python loop.

Both give the same bits (tests/unit/engine/test_cpu_decoder.py); this measures what the
Python loop's ~10 calls per layer cost. For each batch size, `forward_hidden` of a
decode-only step (every sequence at CONTEXT tokens) is timed with the C decoder and with
the Python loop, alternating run by run so both see the same machine state; the ratio is
of the medians.

    .venv/bin/python bench/cpu_decode_layers.py --threads 2   # -> bench/results/cpu_decode_layers.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import torch
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.model.llama import LlamaModel

BLOCK = 16


def decode_meta(batch: int, context: int) -> AttentionMetadata:
    per = -(-context // BLOCK)
    return AttentionMetadata(
        slot_mapping=torch.tensor([b * per * BLOCK + context - 1 for b in range(batch)]),
        block_tables=torch.arange(batch * per, dtype=torch.int32).view(batch, per),
        seq_lens=torch.full((batch,), context, dtype=torch.int32),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        query_lens=[1] * batch,
        seq_lens_host=[context] * batch,
        num_decodes=batch,
        block_size=BLOCK,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--runs", type=int, default=60, help="timed runs per path and batch size")
    common.add_model_args(ap)
    args = ap.parse_args()
    loaded = common.setup(args.threads, args)
    cfg = loaded.config
    model = LlamaModel(cfg, loaded.weights, torch.device("cpu"), torch.float32, args.context + 1)
    fused = model.fused_decoder
    if fused is None:
        raise SystemExit("the C decoder does not take this model (not packed GGUF blocks, or no compiler)")
    blocks = max(args.batch) * -(-args.context // BLOCK)
    shape = (blocks, BLOCK, model.num_kv_heads, cfg.head_dim)
    kv = [(torch.randn(shape), torch.randn(shape)) for _ in model.layers]
    rows = []
    for batch in args.batch:
        ids = torch.randint(0, cfg.vocab_size, (batch,))
        positions = torch.full((batch,), args.context - 1)
        times: dict[str, list[float]] = {"c_decoder": [], "python_loop": []}
        for i in range(args.runs + 5):
            for name, decoder in (("c_decoder", fused), ("python_loop", None)):
                model.fused_decoder = decoder
                meta = decode_meta(batch, args.context)  # a new step: its per-step rows are built again
                t0 = time.perf_counter()
                model.forward_hidden(ids, positions, meta, kv)
                if i >= 5:  # warm-up runs are not counted
                    times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append({"batch": batch, "c_decoder_ms": med["c_decoder"], "python_loop_ms": med["python_loop"],
                     "ratio": med["c_decoder"] / med["python_loop"]})  # fmt: skip
        print(f"batch {batch:3d}: C decoder {med['c_decoder']:7.2f} ms  Python loop {med['python_loop']:7.2f} ms"
              f"  ratio {rows[-1]['ratio']:.3f}", flush=True)  # fmt: skip
    model.fused_decoder = fused
    common.write("cpu_decode_layers", {"threads": args.threads, "context": args.context, "runs": args.runs,
                                       "model": args.model, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
