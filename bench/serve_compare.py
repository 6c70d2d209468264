"""Our server vs llama.cpp's own `llama-server` (parallel slots) on the same GGUF and load.

Starts both servers (ours with `--num-threads T`, llama-server with `-t T -np SLOTS
--cont-batching`, built by hack/build-llama-server.sh), then at each concurrency level
(default 1, 8, 32) runs `bench serve`'s load generator against each in turn, the order
alternating between levels, with identical random prompts (64 words) and 64 output tokens
(`ignore_eos`, which both honour). Our `/health` is probed during the top level (the
event loop must stay responsive under load). Writes JSON + PNG: output tok/s, TTFT and
ITL p50/p99, and each server's peak RSS (VmHWM).

    hack/build-llama-server.sh        # once, ~12 min on 2 cores
    flock /tmp/llmservice-heavy.lock .venv/bin/python bench/serve_compare.py --threads 2

Targets: ours / llama.cpp output tok/s >= 1.0 at concurrency 1, >= 1.5 at 8 and
32; ITL p99 at 32 no worse than llama.cpp's; /health p99 <= 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from llmservice.server.loadgen.client import HealthProbe, build_payload, run_load
from llmservice.server.loadgen.datasets import make_prompts
from llmservice.server.loadgen.stats import percentile, summarize
from llmservice.server.model.registry import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = {1: 1.0, 8: 1.5, 32: 1.5}  # ours / llama-server output tok/s, by concurrency
TARGET_HEALTH_P99_MS = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def start_ours(
    model: str, port: int, args: argparse.Namespace, log: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    cmd = [
        str(Path(sys.executable).parent / "llmservice"),
        "serve",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        *args.our_args,
        *extra,
    ]
    if args.threads:
        cmd += ["--num-threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/ready", proc)
    return proc


def llama_server_binary(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    out = subprocess.run(
        [str(ROOT / "hack" / "build-llama-server.sh"), "--print"], capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def start_llama(gguf: Path, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    binary = llama_server_binary(args.llama_server)
    if not binary.exists():
        raise SystemExit(f"{binary} not found: run hack/build-llama-server.sh first")
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(args.slots), "-c", str(args.slots * args.slot_ctx), "--cont-batching",
           "--no-webui"]  # fmt: skip
    if args.threads:
        cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
    proc = subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tempfile.gettempdir()
    )
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    return proc


def peak_rss_mb(proc: subprocess.Popen) -> float | None:
    """VmHWM of a running process (Linux), in MB."""
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench_one(
    base_url: str,
    model: str,
    extra: dict,
    concurrency: int,
    args: argparse.Namespace,
    probe_health: bool,
) -> tuple[dict, list]:
    n = max(args.min_prompts, args.prompts_per_slot * concurrency)
    prompts = make_prompts("random", n, args.input_len, args.output_len, seed=args.seed)
    payloads = [
        (build_payload("/v1/completions", model, p, 0.0, extra), p.approx_prompt_len)
        for p in prompts
    ]
    probe = HealthProbe(base_url + "/health") if probe_health else None
    if probe:
        probe.__enter__()
    try:
        results, duration = asyncio.run(
            run_load(
                base_url, "/v1/completions", payloads, float("inf"), 1.0, concurrency, args.seed
            )
        )
    finally:
        if probe:
            probe.__exit__()
    summary = summarize(results, duration)
    if probe:
        ms = sorted(v * 1000 for v in probe.latencies)
        summary["health"] = {
            "probes": len(ms),
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
        }
    return summary, results


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(report["servers"])
    levels = report["concurrency"]
    panels = [
        ("output tok/s", lambda s: s["output_throughput"]),
        ("TTFT p50 (ms)", lambda s: s["ttft"]["p50_ms"]),
        ("TTFT p99 (ms)", lambda s: s["ttft"]["p99_ms"]),
        ("ITL p50 (ms)", lambda s: s["itl"]["p50_ms"]),
        ("ITL p99 (ms)", lambda s: s["itl"]["p99_ms"]),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    width = 0.8 / len(servers)
    for ax, (title, pick) in zip(axes, panels, strict=True):
        for k, name in enumerate(servers):
            values = [pick(report["servers"][name][str(c)]) for c in levels]
            ax.bar([i + k * width for i in range(len(levels))], values, width, label=name)
        ax.set_xticks(
            [i + width * (len(servers) - 1) / 2 for i in range(len(levels))],
            [str(c) for c in levels],
        )
        ax.set_xlabel("concurrency")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{report['model']}: llmservice vs llama.cpp (input {report['input_len']}, output {report['output_len']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="builtin:smollm2-135m")
    p.add_argument(
        "--llama-server", default=None, help="binary (default: hack/build-llama-server.sh --print)"
    )
    p.add_argument("--slots", type=int, default=32, help="llama-server -np (parallel sequences)")
    p.add_argument(
        "--slot-ctx",
        type=int,
        default=256,
        help="llama-server context per slot (-c = slots x this)",
    )
    p.add_argument("--skip-llama", action="store_true", help="benchmark only our server")
    p.add_argument(
        "--also-fp32",
        action="store_true",
        help="a third server: ours with --cpu-weights fp32 (the dequantized reference), same run",
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompts-per-slot", type=int, default=2, help="prompts = this x concurrency")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for each server")
    p.add_argument(
        "--our-args", nargs=argparse.REMAINDER, default=[], help="extra `llmservice serve` flags"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_compare"))
    args = p.parse_args()

    gguf = resolve_model_path(args.model)
    if gguf.is_dir():
        gguf = sorted(gguf.glob("*.gguf"))[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"model": args.model, "gguf": str(gguf), "concurrency": args.concurrency,
                    "input_len": args.input_len, "output_len": args.output_len, "threads": args.threads,
                    "our_args": args.our_args, "servers": {}, "peak_rss_mb": {},
                    "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}}  # fmt: skip
    starts = {"llmservice": lambda port, log: start_ours(args.model, port, args, log)}
    if args.also_fp32:
        starts["llmservice-fp32"] = lambda port, log: start_ours(
            args.model, port, args, log, ("--cpu-weights", "fp32")
        )
    if not args.skip_llama:
        starts["llama.cpp"] = lambda port, log: start_llama(gguf, port, args, log)
        info = llama_server_binary(args.llama_server).parent.parent / "build_info.json"
        report["llama_server_build"] = json.loads(info.read_text()) if info.exists() else None
    procs: dict[str, subprocess.Popen] = {}
    bases: dict[str, tuple[str, str]] = {}
    try:
        for name, start in starts.items():
            port = free_port()
            procs[name] = start(port, out.with_suffix(f".{name}.log"))
            base = f"http://127.0.0.1:{port}"
            bases[name] = (base, httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"])
            report["servers"][name] = {}
        for level, c in enumerate(args.concurrency):
            order = (
                list(starts) if level % 2 == 0 else list(reversed(starts))
            )  # alternate who goes first
            for name in order:
                base, model = bases[name]
                probe = name == "llmservice" and c == max(args.concurrency)
                summary, _ = bench_one(base, model, {"ignore_eos": True}, c, args, probe)
                expected = summary["num_requests"] * args.output_len
                summary["all_tokens_delivered"] = summary["total_output_tokens"] >= expected
                if not summary["all_tokens_delivered"]:
                    print(
                        f"WARNING: {name} delivered {summary['total_output_tokens']} of {expected} output tokens "
                        "at this concurrency: its throughput is not comparable",
                        flush=True,
                    )
                report["servers"][name][str(c)] = summary
                print(f"{name:<11} c={c:<3} out {summary['output_throughput']:7.1f} tok/s  "
                      f"TTFT p50/p99 {summary['ttft']['p50_ms']:7.0f}/{summary['ttft']['p99_ms']:7.0f} ms  "
                      f"ITL p50/p99 {summary['itl']['p50_ms']:6.1f}/{summary['itl']['p99_ms']:6.1f} ms"
                      + (f"  /health p99 {summary['health']['p99_ms']:.2f} ms" if "health" in summary else ""),
                      flush=True)  # fmt: skip
        report["peak_rss_mb"] = {name: peak_rss_mb(proc) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop(proc)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["targets"] = targets(report, args)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(report, out.with_suffix(".png"))
    print(json.dumps({"peak_rss_mb": report["peak_rss_mb"], **report["targets"]}, indent=2))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def targets(report: dict, args: argparse.Namespace) -> dict:
    """Speed-up per level against its target, ITL p99 at the top level, /health p99."""
    top = str(max(args.concurrency))
    ours = report["servers"]["llmservice"]
    checks: dict = {"health_p99_ms": ours[top]["health"]["p99_ms"], "health_target_ms": TARGET_HEALTH_P99_MS,
                    "health_ok": ours[top]["health"]["p99_ms"] <= TARGET_HEALTH_P99_MS}  # fmt: skip
    if "llmservice-fp32" in report["servers"]:
        base = report["servers"]["llmservice-fp32"]
        checks["quantized_vs_fp32_weights"] = {
            str(c): round(ours[str(c)]["output_throughput"] / base[str(c)]["output_throughput"], 3)
            for c in args.concurrency
        }
    theirs = report["servers"].get("llama.cpp")
    if not theirs:
        return checks
    for c in args.concurrency:
        a, b = ours[str(c)], theirs[str(c)]
        ratio = a["output_throughput"] / b["output_throughput"]
        want = TARGET_SPEEDUP.get(c, 1.5)
        valid = a["all_tokens_delivered"] and b["all_tokens_delivered"]
        checks[f"c{c}"] = {"speedup": round(ratio, 3), "target": want, "comparable": valid,
                           "ok": valid and ratio >= want,
                           "itl_p50_ms": [a["itl"]["p50_ms"], b["itl"]["p50_ms"]]}  # fmt: skip
    checks["itl_p99_at_top_ms"] = [ours[top]["itl"]["p99_ms"], theirs[top]["itl"]["p99_ms"]]
    checks["itl_p99_at_top_ok"] = ours[top]["itl"]["p99_ms"] <= theirs[top]["itl"]["p99_ms"]
    return checks


if __name__ == "__main__":
    sys.exit(main())
