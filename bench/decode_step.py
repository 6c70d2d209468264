"""Decode step time and kernel launches per decode step, CUDA graphs on and off.

For each mode (eager: --enforce-eager; graphs: the default) and batch size, B requests
with CONTEXT-token prompts are prefilled, then decode steps are timed through
`engine.step()` (wall time, the device synchronised around the timed run; with
overlapped scheduling a step's wall time in steady state is the device's step time).
The torch profiler then counts, over a few more decode steps, per step:
- `python_ops`: top-level aten ops (each a dispatch from Python; an op called inside
  another op is not counted), on CPU and CUDA;
- `kernel_launches`: CUDA runtime/driver launch calls (cudaLaunchKernel, cuLaunchKernel:
  Triton, cudaLaunchKernelExC, ...), `graph_launches` (cudaGraphLaunch) and
  `memcpy` calls; `device_kernels`: kernels the GPU ran (inside graphs too).
The bandwidth floor is (weights + the batch's KV) / the measured copy bandwidth.

    python bench/decode_step.py --model .gpu/models/llama3-8b-shape --load-format dummy \
        --device cuda --batch 128 1 --context 512 --modes eager graphs --out $OUT
    python bench/decode_step.py --device cpu --batch 4 --context 64 --steps 4   # plumbing on CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import common
import torch
from torch.profiler import ProfilerActivity, profile

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes read + written per second by a device-to-device copy (the kernel bench's rule)."""
    if device.type != "cuda":
        nbytes = 1 << 26
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def device_memory(device: torch.device) -> dict:
    """What the device holds now and at peak: --gpu-memory-utilization 0.95 must not OOM."""
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"device_used_fraction": 1 - free / total, "max_reserved_bytes": torch.cuda.max_memory_reserved(device)}


def count_events(prof, steps: int) -> dict:
    """Per-step counts from a profile of `steps` decode steps (see the module docstring)."""
    ops = launches = graphs = memcpy = kernels = 0
    for e in prof.events():
        name = e.name
        if name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops += 1
        elif name.startswith(LAUNCH_CALLS):
            launches += 1
        elif name.startswith("cudaGraphLaunch"):
            graphs += 1
        elif name.startswith("cudaMemcpy"):
            memcpy += 1
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels += 1
    per = max(steps, 1)
    return {"python_ops": ops / per, "kernel_launches": launches / per, "graph_launches": graphs / per,
            "memcpy": memcpy / per, "device_kernels": kernels / per}  # fmt: skip


def run_mode(mode: str, batch: int, args, device: torch.device) -> dict:
    eng = common.engine(
        max_model_len=args.context + args.warmup + args.steps + args.profile_steps + 8,
        max_num_seqs=max(batch, 1),
        max_num_batched_tokens=max(2048, args.context),
        kv_cache_memory_gib=args.kv_cache_memory_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=mode == "eager",
        async_scheduling=None if args.async_scheduling == "auto" else args.async_scheduling == "on",
        max_step_ms=0,
        enable_prefix_caching=False,
    )
    g = torch.Generator().manual_seed(batch)
    vocab = eng.model_config.vocab_size
    out_len = args.warmup + args.steps + args.profile_steps + 4
    for _ in range(batch):
        prompt = torch.randint(10, min(vocab, 40000), (args.context - 1,), generator=g).tolist()
        eng.add_request(prompt, common.greedy(out_len))
    while not (eng.last_step.kind == "decode" and eng.last_step.num_batched_tokens == batch):
        eng.step()  # prefill until a whole decode step has run
    for _ in range(args.warmup):
        eng.step()
    sync(device)
    t0 = time.perf_counter()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    sync(device)
    step_s = (time.perf_counter() - t0) / args.steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            eng.step()
        sync(device)
    counts = count_events(prof, args.profile_steps)
    kv_read = batch * args.context * eng.memory_plan.kv_bytes_per_token
    result = {
        "mode": mode, "batch": batch, "context": args.context, "step_ms": step_s * 1e3,
        "step_ms_median": statistics.median(times) * 1e3, "tok_per_s": batch / step_s,
        "bytes_read": eng.model.weight_bytes() + kv_read, "async_scheduling": eng.async_scheduling,
        "graph_replays": eng.runner.num_graph_replays, "static_steps": eng.runner.num_static_steps,
        "graph_memory_bytes": eng.memory_plan.graph_bytes, "kv_blocks": eng.memory_plan.num_blocks,
        "memory_plan": eng.memory_plan.describe(),
    } | counts | device_memory(device)  # fmt: skip
    for rid in list(eng.scheduler.requests):
        eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 1])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["eager", "graphs"], choices=["eager", "graphs"])
    ap.add_argument("--async-scheduling", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--kv-cache-memory-gib", type=float, default=None,
                    help="default on CUDA: the --gpu-memory-utilization plan (graph memory taken out of it)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--threads", type=int, default=None)
    common.add_model_args(ap)
    args = ap.parse_args()
    common.setup(args.threads, args)
    device, dtype = common.device_and_dtype()
    bandwidth = copy_bandwidth(device)
    report: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "dtype": str(dtype), "model": args.model, "copy_bytes_per_s": bandwidth, "runs": []}  # fmt: skip
    path = common.result_path("decode_step")
    path.parent.mkdir(parents=True, exist_ok=True)
    for mode in args.modes:
        for batch in args.batch:
            r = run_mode(mode, batch, args, device)
            # the engine holds reference cycles (bound methods): free its KV pool before the
            # next one is planned, or a 0.95 plan finds the device still full
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            r["floor_ms"] = r["bytes_read"] / bandwidth * 1e3
            r["floor_fraction"] = r["floor_ms"] / r["step_ms"]
            report["runs"].append(r)
            print(json.dumps(r), flush=True)
            path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
