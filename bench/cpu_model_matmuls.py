"""The embedded model's packed matmuls, in forward order, this tree's kernel vs a revision's.

Every packed matrix of SmolLM2-135M's GGUF once, as a decode step does: 30 layers of Q4_1
(q, k, v, o, gate, up, down: the GGUF's own matrices, which the model fuses into QKV and
gate_up) and the Q8_0 tied head, ~96 MB, more than the L3 cache, so the weights come from
memory as in the engine. For each batch size M this times all of them
with `cpu_quant.matmul` (the model's entry) and with `qk_matmul` compiled from `--rev`
(same compiler and flags), interleaved rep by rep, and checks the two give the same bits.

    .venv/bin/python bench/cpu_model_matmuls.py --rev 589b8e8

It also reports how much of the process's memory sat on transparent huge pages: torch
asks for them (THP_MEM_ALLOC_ENABLE=1) only for allocations of 2 MiB and more, which the
layers' matrices are not; copying them all into one huge-page arena changed nothing
measurable (docs/cpu.md), so the server does not.

JSON: bench/results/cpu_model_matmuls.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from cpu_quant_bench import loadavg, old_kernel
from llmservice.kernels import cpu_quant
from llmservice.server.model.loader import load_model

RESULTS = Path(__file__).resolve().parent / "results"


def huge_pages_kib() -> int:
    """This process's anonymous memory on huge pages (0 where THP did not apply)."""
    text = Path("/proc/self/smaps_rollup").read_text()
    return int(text.split("AnonHugePages:")[1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="git revision whose kernels/cpu_quant.c is the baseline")
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 5, 8, 16, 64])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    packed = load_model(args.model, torch.float32).weights.packed
    mats = list(packed.values())
    old = old_kernel(args.rev)
    rows = []
    for m in args.m:
        xs = {p.cols: torch.randn(m, p.cols, generator=torch.Generator().manual_seed(m)) for p in mats}
        same = all(torch.equal(old(xs[p.cols], p), cpu_quant.matmul(xs[p.cols], p)) for p in mats)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for rep in range(args.reps):
            order = (("old", old), ("new", cpu_quant.matmul))
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                for p in mats:
                    fn(xs[p.cols], p)
                times[name].append(time.perf_counter() - t0)
        o, n = (statistics.median(times[k]) * 1e3 for k in ("old", "new"))
        rows.append({"m": m, "old_ms": round(o, 3), "new_ms": round(n, 3), "new_over_old": round(n / o, 3),
                     "same_bits": same, "load_avg": loadavg()})  # fmt: skip
        print(f"M={m:3d}: {len(mats)} matrices  old {o:7.2f} ms  new {n:7.2f} ms  "
              f"new/old {n / o:.2f}  same bits: {same}  load {loadavg()}", flush=True)  # fmt: skip
    result = {
        "rev": args.rev,
        "threads": args.threads,
        "matrices": len(mats),
        "packed_mb": round(sum(p.nbytes for p in mats) / 1e6, 1),
        "huge_pages_kib": huge_pages_kib(),
        "rows": rows,
    }
    out = RESULTS / "cpu_model_matmuls.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"huge pages: {result['huge_pages_kib']} KiB; wrote {out}")


if __name__ == "__main__":
    main()
