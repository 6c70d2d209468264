"""`llmservice bench serve`: load-test a running OpenAI-compatible server the way
`vllm bench serve` does (gamma arrivals, concurrency cap, TTFT/TPOT/ITL/E2EL, goodput)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

from llmservice.server.loadgen.datasets import DATASETS


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default=None, help="default: the first model of GET /v1/models")
    p.add_argument("--dataset", choices=DATASETS, default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128, help="prompt words (random; suffix for prefix; median for sharegpt-like)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens (median for sharegpt-like)")
    p.add_argument("--prefix-len", type=int, default=256)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 Poisson, <1 burstier")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:500 tpot:50")
    p.add_argument("--percentiles", default="50,99", help="comma-separated percentiles to report")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM extra) so outputs reach max_tokens")
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--health-probe", action="store_true", help="probe GET /health during the run and report its latency")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the summary (and per-request data) as JSON")
    p.add_argument("--plot", default=None, help="write latency CDFs to this PNG")
    p.add_argument("--disable-tqdm", action="store_true")


def _model(base_url: str) -> str:
    import httpx

    data = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()
    return data["data"][0]["id"]


def format_summary(s: dict) -> str:
    lines = [
        f"{'requests (ok/total)':<32}{s['completed']}/{s['num_requests']}",
        f"{'duration (s)':<32}{s['duration_s']:.2f}",
        f"{'request throughput (req/s)':<32}{s['request_throughput']:.2f}",
        f"{'output token throughput (tok/s)':<32}{s['output_throughput']:.2f}",
        f"{'total token throughput (tok/s)':<32}{s['total_token_throughput']:.2f}",
    ]
    if "goodput" in s:
        lines.append(f"{'goodput (req/s)':<32}{s['goodput']['request_goodput']:.2f}  SLOs {s['goodput']['slos_ms']}")
    for name in ("ttft", "tpot", "itl", "e2el"):
        stats = "  ".join(f"{k[:-3]} {v:.1f}" for k, v in s[name].items() if k != "std_ms")
        lines.append(f"{name.upper() + ' (ms)':<32}{stats}")
    if "health" in s:
        h = s["health"]
        lines.append(f"{'/health under load (ms)':<32}p50 {h['p50_ms']:.2f}  p99 {h['p99_ms']:.2f}  (n={h['probes']})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> tuple[dict, list]:
    from llmservice.server.loadgen.client import HealthProbe, build_payload, run_load
    from llmservice.server.loadgen.datasets import make_prompts
    from llmservice.server.loadgen.stats import parse_goodput, percentile, summarize
    from tqdm import tqdm

    slos = parse_goodput(args.goodput)
    percentiles = [float(p) for p in args.percentiles.split(",") if p.strip()]
    model = args.model or _model(args.base_url)
    prompts = make_prompts(args.dataset, args.num_prompts, args.input_len, args.output_len,
                           args.prefix_len, args.num_prefixes, seed=args.seed)
    extra = json.loads(args.extra_body) if args.extra_body else {}
    if args.ignore_eos:
        extra["ignore_eos"] = True
    payloads = [(build_payload(args.endpoint, model, p, args.temperature, extra), p.approx_prompt_len) for p in prompts]
    bar = tqdm(total=len(payloads), desc="requests", disable=args.disable_tqdm, file=sys.stderr)
    probe = HealthProbe(args.base_url.rstrip("/") + "/health") if args.health_probe else None
    if probe:
        probe.__enter__()
    try:
        results, duration = asyncio.run(run_load(
            args.base_url, args.endpoint, payloads, args.request_rate, args.burstiness,
            args.max_concurrency, args.seed, on_done=lambda _: bar.update(1),
        ))
    finally:
        bar.close()
        if probe:
            probe.__exit__()
    summary = summarize(results, duration, slos, percentiles)
    summary["config"] = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in vars(args).items()
                         if k not in ("func",)}
    summary["config"]["model"] = model
    if probe:
        ms = [v * 1000 for v in probe.latencies]
        summary["health"] = {"probes": len(ms), "failures": probe.failures,
                             "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
    errors = [r.error for r in results if not r.success]
    if errors:
        summary["errors"] = errors[:10]
    return summary, results


def run_bench_serve(args: argparse.Namespace) -> int:
    from llmservice.server.loadgen.stats import parse_goodput

    try:
        parse_goodput(args.goodput)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary, results = run(args)
    print(format_summary(summary))
    if args.result_file:
        data = {**summary, "requests": [vars(r) for r in results]}
        Path(args.result_file).write_text(json.dumps(data, indent=2, default=str))
    if args.plot:
        from llmservice.server.loadgen.plot import plot_cdfs

        plot_cdfs({args.base_url: results}, args.plot, title=f"{args.dataset}, rate {args.request_rate}")
    return 0 if summary["completed"] else 1
