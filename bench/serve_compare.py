"""Our server vs llama.cpp's (llama-cpp-python[server]) on the same GGUF, same prompts.

Starts both servers, runs `bench serve`'s load generator at each concurrency level
(default 1, 8, 32) with identical prompts and output lengths (EOS suppressed on both:
`ignore_eos` for ours, a -100 logit bias for llama.cpp), probes our `/health` during the
concurrency-32 run (seed mistake 5: the event loop must stay responsive under load), and
writes a JSON + PNG comparison of output tok/s, TTFT and ITL p50/p99.

    make bench-peers            # builds .venv-peers (llama-cpp-python, ~10 min) once
    .venv/bin/python bench/serve_compare.py --llama-venv .venv-peers

Targets: at concurrency 32 our output tok/s >= 1.5x llama.cpp's; /health p99 <= 20 ms.
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
TARGET_SPEEDUP = 1.5
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


def start_ours(model: str, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).parent / "llmservice"), "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", str(args.max_model_len), *args.our_args]
    if args.threads:
        cmd += ["--num-threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/ready", proc)
    return proc


def start_llama(gguf: Path, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    python = Path(args.llama_venv).resolve() / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} not found: run `make bench-peers` (builds llama-cpp-python[server]) first")
    cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(args.max_model_len),
           # Its default (True) cuts a streaming answer short whenever another request
           # arrives: under concurrency most answers would end after a few tokens.
           "--interrupt_requests", "False"]
    if args.threads:
        cmd += ["--n_threads", str(args.threads)]
    # Not from the repository root: `python -m` puts the working directory on sys.path,
    # where our top-level operator/ folder would shadow the standard library's `operator`.
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    wait_http(f"http://127.0.0.1:{port}/v1/models", proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def eos_token_id(gguf: Path) -> int:
    from gguf import GGUFReader
    from llmservice.server.model.gguf_loader import read_tokenizer

    return int(read_tokenizer(GGUFReader(gguf)).eos_token_id)


def bench_one(base_url: str, model: str, extra: dict, concurrency: int, args: argparse.Namespace,
              probe_health: bool) -> tuple[dict, list]:
    n = max(args.min_prompts, args.prompts_per_slot * concurrency)
    prompts = make_prompts("random", n, args.input_len, args.output_len, seed=args.seed)
    payloads = [(build_payload("/v1/completions", model, p, 0.0, extra), p.approx_prompt_len) for p in prompts]
    probe = HealthProbe(base_url + "/health") if probe_health else None
    if probe:
        probe.__enter__()
    try:
        results, duration = asyncio.run(run_load(base_url, "/v1/completions", payloads, float("inf"), 1.0,
                                                 concurrency, args.seed))
    finally:
        if probe:
            probe.__exit__()
    summary = summarize(results, duration)
    if probe:
        ms = sorted(v * 1000 for v in probe.latencies)
        summary["health"] = {"probes": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
    return summary, results


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(report["servers"])
    levels = report["concurrency"]
    panels = [("output tok/s", lambda s: s["output_throughput"]),
              ("TTFT p50 (ms)", lambda s: s["ttft"]["p50_ms"]), ("TTFT p99 (ms)", lambda s: s["ttft"]["p99_ms"]),
              ("ITL p50 (ms)", lambda s: s["itl"]["p50_ms"]), ("ITL p99 (ms)", lambda s: s["itl"]["p99_ms"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    width = 0.8 / len(servers)
    for ax, (title, pick) in zip(axes, panels, strict=True):
        for k, name in enumerate(servers):
            values = [pick(report["servers"][name][str(c)]) for c in levels]
            ax.bar([i + k * width for i in range(len(levels))], values, width, label=name)
        ax.set_xticks([i + width * (len(servers) - 1) / 2 for i in range(len(levels))], [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{report['model']}: llmservice vs llama.cpp (input {report['input_len']}, output {report['output_len']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:smollm2-135m")
    p.add_argument("--llama-venv", default=str(ROOT / ".venv-peers"))
    p.add_argument("--skip-llama", action="store_true", help="benchmark only our server")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompts-per-slot", type=int, default=2, help="prompts = this x concurrency")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for each server (default: theirs)")
    p.add_argument("--our-args", nargs=argparse.REMAINDER, default=[], help="extra `llmservice serve` flags")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_compare"))
    args = p.parse_args()

    gguf = resolve_model_path(args.model)
    if gguf.is_dir():
        gguf = sorted(gguf.glob("*.gguf"))[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"model": args.model, "gguf": str(gguf), "concurrency": args.concurrency,
                    "input_len": args.input_len, "output_len": args.output_len, "servers": {},
                    "machine": {"cpus": os.cpu_count()}}
    runs = [("llmservice", start_ours, {"ignore_eos": True})]
    if not args.skip_llama:
        runs.append(("llama.cpp", start_llama, {"logit_bias": {str(eos_token_id(gguf)): -100.0}}))
    for name, start, extra in runs:
        port = free_port()
        proc = start(args.model if name == "llmservice" else gguf, port, args, out.with_suffix(f".{name}.log"))
        base = f"http://127.0.0.1:{port}"
        model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        report["servers"][name] = {}
        try:
            for c in args.concurrency:
                probe = name == "llmservice" and c == max(args.concurrency)
                summary, _ = bench_one(base, model, extra, c, args, probe)
                expected = summary["num_requests"] * args.output_len
                # >=: without usage in its stream, llama.cpp is counted by chunks (+1 final chunk)
                summary["all_tokens_delivered"] = summary["total_output_tokens"] >= expected
                if not summary["all_tokens_delivered"]:
                    print(f"WARNING: {name} delivered {summary['total_output_tokens']} of {expected} output tokens "
                          "at this concurrency: its throughput is not comparable", flush=True)
                report["servers"][name][str(c)] = summary
                print(f"{name:<11} c={c:<3} out {summary['output_throughput']:7.1f} tok/s  "
                      f"TTFT p50/p99 {summary['ttft']['p50_ms']:7.0f}/{summary['ttft']['p99_ms']:7.0f} ms  "
                      f"ITL p50/p99 {summary['itl']['p50_ms']:6.1f}/{summary['itl']['p99_ms']:6.1f} ms"
                      + (f"  /health p99 {summary['health']['p99_ms']:.2f} ms" if "health" in summary else ""),
                      flush=True)
        finally:
            stop(proc)
    top = str(max(args.concurrency))
    ours = report["servers"]["llmservice"][top]
    checks = {"health_p99_ms": ours["health"]["p99_ms"], "health_target_ms": TARGET_HEALTH_P99_MS,
              "health_ok": ours["health"]["p99_ms"] <= TARGET_HEALTH_P99_MS}
    if "llama.cpp" in report["servers"]:
        theirs = report["servers"]["llama.cpp"][top]
        ratio = ours["output_throughput"] / theirs["output_throughput"]
        valid = ours["all_tokens_delivered"] and theirs["all_tokens_delivered"]
        checks.update({"speedup_at_top_concurrency": ratio, "speedup_target": TARGET_SPEEDUP,
                       "comparable": valid, "speedup_ok": valid and ratio >= TARGET_SPEEDUP})
    report["targets"] = checks
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(report, out.with_suffix(".png"))
    print(json.dumps(checks, indent=2))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
