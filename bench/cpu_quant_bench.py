"""Packed GGUF matmul on CPU: the old direct kernel vs the new paths vs fp32 torch, and the
model's 512-token prefill and batch-1 decode on packed vs fp32 weights.

    .venv/bin/python bench/cpu_quant_bench.py                 # ~5 minutes on 2 cores
    .venv/bin/python bench/cpu_quant_bench.py --quick         # fewer matrices and reps

Kernels: ms per matrix of the model's gate_up shape (3072 x 576, Q4_1) for each M and
thread count, cycling through enough different matrices that the packed set (and so the
fp32 set) is larger than the L3 cache: weights come from memory, as in the model. Every
implementation is timed in the same run, interleaved rep by rep (the order rotates), so
the ratios hold on a shared machine even when the absolute figures drift; the median of
the reps is reported with the load average (5x the reps for M <= 8, whose passes are short). "old" is qk_matmul built from the source of
`--old-rev` (the kernel before the tiled path), "new" is `cpu_quant.matmul` as the model
calls it (`choose_path`); each M also checks that new and old give the same bits.

Model: one 512-token prompt (fresh random ids each rep, so no prefix-cache hit) and one
request decoding 64 tokens at batch 1, on an engine over packed weights and one over
fp32 weights (`--cpu-weights fp32`), interleaved. JSON: bench/results/cpu_quant_bench.json.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from llmservice.kernels import cpu_native, cpu_quant
from llmservice.kernels.cpu_quant import Q4_1, Packed

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
OLD_REV = "761bb62"  # kernels/cpu_quant.c before the tiled path


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages (the machine is shared: say how busy it was)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def random_blocks(kind: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random quant bytes with finite fp16 scales (and mins) of realistic size."""
    g = torch.Generator().manual_seed(seed)
    nb, bb = cols // 32, cpu_quant.BLOCK_BYTES[kind]
    raw = torch.randint(0, 256, (rows * nb, bb), dtype=torch.uint8, generator=g)
    raw[:, 0:2] = (
        (torch.rand(rows * nb, generator=g) * 0.02 + 1e-4).half().view(torch.uint8).view(-1, 2)
    )
    if kind == Q4_1:
        raw[:, 2:4] = (
            (-torch.rand(rows * nb, generator=g) * 0.15).half().view(torch.uint8).view(-1, 2)
        )
    return raw.view(rows, nb * bb).contiguous()


def library_at(rev: str, name: str) -> ctypes.CDLL:
    """kernels/<name>.c as it was at `rev`, compiled with today's compiler and flags."""
    src = subprocess.run(
        ["git", "show", f"{rev}:kernels/{name}.c"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"{name}_old.c"
    path.write_text(src)
    return ctypes.CDLL(str(cpu_native.build(path)))


def old_kernel(rev: str) -> Callable[[torch.Tensor, Packed], torch.Tensor]:
    """qk_matmul compiled from kernels/cpu_quant.c at `rev` (same compiler and flags)."""
    lib = library_at(rev, "cpu_quant")
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.qk_matmul.argtypes = [i32, p, i64, i64, p, i64, i64, p, i64, p, i32]
    lib.qk_matmul.restype = None

    def run(x: torch.Tensor, w: Packed) -> torch.Tensor:
        """Through the same Python checks and allocation as cpu_quant.matmul."""
        x2 = cpu_quant._check_x(w, x)
        out = torch.empty((x2.shape[0], w.data.shape[0]), dtype=torch.float32)
        lib.qk_matmul(w.kind, w.data.data_ptr(), w.rows, w.cols, x2.data_ptr(), x2.shape[0], x2.stride(0),
                      out.data_ptr(), out.stride(0), None, torch.get_num_threads())  # fmt: skip
        return out

    return run


def time_interleaved(impls: dict[str, Callable[[int], object]], count: int, reps: int) -> dict[str, float]:
    """Median ms per call of each implementation, called on matrices 0..count-1 in turn,
    over `reps` reps after a warm-up one; the order rotates each rep, so a drift in the
    machine's speed falls on every implementation alike."""
    times: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for rep in range(reps + 1):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            for i in range(count):
                impls[name](i)
            if rep:  # the first rep warms up
                times[name].append((time.perf_counter() - t0) / count * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def bench_kernels(args: argparse.Namespace) -> list[dict]:
    n, k = args.rows, args.cols
    packed = [Packed(Q4_1, random_blocks(Q4_1, n, k, seed=i), k) for i in range(args.matrices)]
    dense = [cpu_quant.dequantize(p) for p in packed]
    old = old_kernel(args.old_rev)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m in args.m:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            bits = torch.equal(cpu_quant.matmul(x, packed[0]), old(x, packed[0]))
            impls: dict[str, Callable[[int], object]] = {
                "fp32": lambda i, x=x: F.linear(x, dense[i]),
                "old": lambda i, x=x: old(x, packed[i]),
                "new": lambda i, x=x: cpu_quant.matmul(x, packed[i]),
            }
            reps = args.reps * 5 if m <= 8 else args.reps  # short timings: more samples
            ms = time_interleaved(impls, len(packed), reps)
            row = {
                "threads": threads,
                "m": m,
                "path": cpu_quant.choose_path(m),
                "ms_fp32": ms["fp32"],
                "ms_old": ms["old"],
                "ms_new": ms["new"],
                "new_vs_fp32": ms["new"] / ms["fp32"],
                "new_vs_old": ms["new"] / ms["old"],
                "bit_identical_to_old": bits,
                "loadavg": loadavg(),
            }
            rows.append(row)
            print(
                f"threads {threads} M {m:4d} ({row['path']:6s}): fp32 {ms['fp32']:7.3f}  old {ms['old']:7.3f}  "
                f"new {ms['new']:7.3f} ms  new/fp32 {row['new_vs_fp32']:.2f}  new/old {row['new_vs_old']:.2f}  "
                f"bits {'same' if bits else 'DIFFER'}  load {row['loadavg']}",
                flush=True,
            )
    return rows


def bench_model(args: argparse.Namespace, threads: int) -> dict:
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams
    from llmservice.server.model.loader import load_model

    torch.set_num_threads(threads)
    engines = {}
    vocab = 0
    for name, cpu_weights in (("packed", "quantized"), ("fp32", "fp32")):
        loaded = load_model(args.model, torch.float32, device="cpu", cpu_weights=cpu_weights)
        vocab = loaded.config.vocab_size
        engines[name] = LLMEngine.from_config(
            EngineConfig(
                max_model_len=1024,
                max_num_seqs=4,
                max_num_batched_tokens=1024,
                kv_cache_memory_gib=0.25,
                device="cpu",
                num_threads=threads,
            ),
            loaded=loaded,
        )
    g = torch.Generator().manual_seed(0)
    prefill: dict[str, list[float]] = {name: [] for name in engines}
    decode: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(args.model_reps + 1):
        for name in list(engines) if rep % 2 == 0 else list(engines)[::-1]:
            eng = engines[name]
            ids = torch.randint(100, vocab, (args.prefill_tokens,), generator=g).tolist()
            eng.add_request(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
            t0 = time.perf_counter()
            while eng.has_unfinished_requests():
                eng.step()
            if rep:
                prefill[name].append((time.perf_counter() - t0) * 1e3)
            ids = torch.randint(100, vocab, (16,), generator=g).tolist()
            eng.add_request(
                ids, SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
            )
            steps = []
            while eng.has_unfinished_requests():
                t0 = time.perf_counter()
                eng.step()
                if eng.last_step.num_prompt_tokens == 0:
                    steps.append(time.perf_counter() - t0)
            if rep:
                decode[name].append(len(steps) / sum(steps))
    result = {
        "threads": threads,
        "prefill_tokens": args.prefill_tokens,
        "prefill_ms": {name: statistics.median(v) for name, v in prefill.items()},
        "decode_batch1_tok_per_s": {name: statistics.median(v) for name, v in decode.items()},
        "loadavg": loadavg(),
    }
    result["prefill_packed_vs_fp32"] = result["prefill_ms"]["packed"] / result["prefill_ms"]["fp32"]
    print(
        f"model ({threads} threads): {args.prefill_tokens}-token prefill packed "
        f"{result['prefill_ms']['packed']:.1f} ms vs fp32 {result['prefill_ms']['fp32']:.1f} ms "
        f"({result['prefill_packed_vs_fp32']:.2f}x); decode batch 1: packed "
        f"{result['decode_batch1_tok_per_s']['packed']:.1f} tok/s vs fp32 "
        f"{result['decode_batch1_tok_per_s']['fp32']:.1f}  load {result['loadavg']}",
        flush=True,
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 32, 64, 128, 512])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, default=3072, help="N: gate_up of SmolLM2-135M")
    ap.add_argument("--cols", type=int, default=576, help="K")
    ap.add_argument("--matrices", type=int, default=56, help="cycled so the weights exceed L3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--model-threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model-reps", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--quick", action="store_true", help="8 matrices, 1 rep (a smoke run)")
    ap.add_argument("--out", default=str(RESULTS / "cpu_quant_bench.json"))
    args = ap.parse_args()
    if args.quick:
        args.matrices, args.reps, args.model_reps, args.decode_tokens = 8, 1, 1, 8
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "cpu": _cpu_name(),
        },
        "torch": torch.__version__,
        "shape": {"n": args.rows, "k": args.cols, "kind": "Q4_1", "matrices": args.matrices},
        "loadavg_start": loadavg(),
        "kernels": bench_kernels(args),
    }
    if not args.skip_model:
        report["model"] = [bench_model(args, t) for t in args.model_threads]
    report["loadavg_end"] = loadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
