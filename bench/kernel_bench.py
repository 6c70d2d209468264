"""GPU check and benchmark of the hot-path kernels (run by scripts/gpu_check.sh).

    .venv/bin/python bench/kernel_bench.py --smoke     # CPU plumbing check, ~1 minute

On CUDA, in well under 5 minutes:
1. correctness of every kernel at production sizes (Llama-3-8B attention shape, bf16)
   against the float64 references, plus a swap round trip through pinned memory;
2. the ceilings: device-to-device copy bandwidth (bytes read + written per second) and
   a bf16 8192^3 matmul rate, both measured here, not taken from a datasheet;
3. decode attention over batch 1-256 x context 512-32k (block 16): achieved GB/s of
   K/V read against the copy bandwidth; a num_warps/num_stages probe; split-KV on/off;
4. prefill attention (fresh prompts, chunks over cached prefixes, a mixed step) in
   TFLOP/s against the matmul rate;
5. a decode step of the embedded model (SmolLM2-135M) at batch 64, Triton vs torch.
Timings are `triton.testing.do_bench` medians. JSON goes to $OUT (else bench/results/)
as gpu-<date>.json; a short table is printed last.

Its parts, one idea each: kernel_plan (sizes, timer), kernel_checks (correctness),
kernel_timings (ceilings, decode, prefill), kernel_engine_step, kernel_metrics (verdict,
table). `--smoke` runs the same code on CPU with tiny shapes (Triton interpreter, wall-clock
medians) so the script itself is tested without a GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton_* module import

import torch
import triton
from kernel_checks import check_correctness
from kernel_engine_step import bench_engine_step
from kernel_metrics import summarize, table
from kernel_plan import Plan, Timer
from kernel_timings import bench_decode, bench_prefill, copy_bandwidth_gbps, matmul_tflops


def output_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return Path(__file__).resolve().parent / "results"


def run(plan: Plan, device: torch.device) -> dict:
    t0 = time.monotonic()
    deadline = t0 + plan.budget_s
    timer = Timer(device)
    torch.manual_seed(0)
    meta = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.processor() or 'unknown'})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
    }
    report: dict = {
        "meta": meta,
        "plan": {
            "shape": {k: str(v) for k, v in vars(plan.shape).items()},
            "decode_batches": plan.decode_batches,
            "decode_contexts": plan.decode_contexts,
        },
    }
    report["correctness"] = check_correctness(plan, device)
    report["copy_GBps"] = copy_bandwidth_gbps(plan, device, timer)
    report["matmul_TFLOPs"] = matmul_tflops(plan, device, timer)
    report["decode"], report["decode_tuning"], report["decode_split_ablation"] = bench_decode(
        plan, device, timer, deadline
    )
    report["prefill"] = bench_prefill(plan, device, timer, deadline)
    try:
        report["engine_step"] = bench_engine_step(plan, device, timer)
    except Exception as exc:  # the report must still be written; the error is in it
        report["engine_step"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["elapsed_s"] = time.monotonic() - t0
    report["summary"] = summarize(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny CPU run through the Triton interpreter"
    )
    parser.add_argument("--out", help="output folder (default: $OUT, else bench/results/)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the decode/prefill sweeps (default: the plan's; larger cases are skipped)")
    args = parser.parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
        plan = Plan.smoke()
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke for the CPU plumbing check", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        plan = Plan.full()
    if args.budget_s is not None:
        plan.budget_s = args.budget_s
    report = run(plan, device)
    out_dir = output_dir(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = "smoke" if args.smoke else "gpu"
    path = out_dir / f"{kind}-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}")
    print(table(report))
    return 0 if report["summary"]["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
