"""Inter-token latency under load: the fixed token budget vs the step-time budget.

One `llmservice serve` per mode (CPU, --num-threads 2 by default), each driven by
`llmservice bench serve --dataset sharegpt-like --max-concurrency 64 --ignore-eos`:
- fixed-2048: `--max-step-ms 0`, the token budget alone (the engine before the step budget);
- default: the step budget with its derived target (2x the predicted decode-only step);
- slo: `--max-step-ms MS`;
- tokens-256: `--max-step-ms 0 --max-num-batched-tokens 256`, a hand-tuned token budget.
Reports ITL p50/p99, TTFT p50/p99 and output tok/s of each, plus, from the server's own
metrics, step time p50/p99 by kind, the decode overruns and the fitted cost model.
Writes bench/results/itl_slo.json and .png.

    flock /tmp/llmservice-heavy.lock .venv/bin/python bench/itl_slo.py [--num-prompts 128]

Targets: default mode ITL p99 <= 3x its median; SLO mode ITL p99 within the
target; output tok/s of both >= 90 % of fixed-2048's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BIN = Path(sys.executable).parent / "llmservice"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def step_metrics(url: str) -> dict:
    """Step time quantiles by kind, decode overruns and the cost model, from /metrics."""
    from llmservice.operator.advisor.snapshot import parse
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict = {"coefficients": {}, "steps": {}}
    for family in text_string_to_metric_families(text):
        if family.name == "llmservice:step_cost_coefficient":
            out["coefficients"] = {s.labels["term"]: s.value for s in family.samples}
        if family.name == "llmservice:step_budget_decode_overruns":
            out["decode_overruns"] = sum(
                s.value for s in family.samples if s.name.endswith("_total")
            )
    ratio = "llmservice:step_time_over_target_ratio"
    for kind in ("decode", "prefill", "mixed", "forced"):
        lines = [ln for ln in text.splitlines() if ln.startswith(ratio) and f'kind="{kind}"' in ln]
        h = parse("\n".join(lines)).histograms.get(ratio)
        if h is not None and h.count:
            over = h.fraction_above(1.5) or 0.0
            out.setdefault("over_target", {})[kind] = {
                "steps": int(h.count),
                "over_1_5x": round(over * h.count),
            }
    for kind in ("decode", "prefill", "mixed"):
        lines = [
            ln
            for ln in text.splitlines()
            if not ln.startswith("llmservice:step_duration") or f'kind="{kind}"' in ln
        ]
        h = parse("\n".join(lines)).histograms.get("llmservice:step_duration_seconds")
        if h is not None and h.count:
            out["steps"][kind] = {"count": int(h.count), "p50_s": h.quantile(0.5), "p99_s": h.quantile(0.99),
                                  "mean_s": h.mean}  # fmt: skip
    return out


def run_mode(name: str, server_args: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN), "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--num-threads", str(args.threads), "--max-model-len", str(args.max_model_len),
           "--max-waiting-requests", "0", *server_args]  # fmt: skip
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc)
        result = workdir / f"{name}.json"
        bench = [str(BIN), "bench", "serve", "--base-url", url, "--dataset", "sharegpt-like",
                 "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
                 "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                 "--ignore-eos", "--seed", str(args.seed), "--disable-tqdm", "--result-file", str(result)]  # fmt: skip
        t0 = time.monotonic()
        subprocess.run(bench, check=True, timeout=args.timeout)
        wall = time.monotonic() - t0
        summary = json.loads(result.read_text())
        steps = step_metrics(url)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    itl, ttft = summary["itl"], summary["ttft"]
    row = {
        "server_args": server_args,
        "completed": summary["completed"],
        "num_requests": summary["num_requests"],
        "wall_s": wall,
        "output_tok_s": summary["output_throughput"],
        "itl_p50_ms": itl["p50_ms"],
        "itl_p99_ms": itl["p99_ms"],
        "itl_p99_over_p50": itl["p99_ms"] / itl["p50_ms"] if itl["p50_ms"] else None,
        "ttft_p50_ms": ttft["p50_ms"],
        "ttft_p99_ms": ttft["p99_ms"],
        **steps,
    }
    print(f"{name:>11}: out {row['output_tok_s']:.1f} tok/s | ITL p50 {row['itl_p50_ms']:.0f} p99 "
          f"{row['itl_p99_ms']:.0f} ms (x{row['itl_p99_over_p50']:.2f}) | TTFT p50 {row['ttft_p50_ms']:.0f} "
          f"p99 {row['ttft_p99_ms']:.0f} ms | steps {steps['steps']}", flush=True)  # fmt: skip
    return row


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["modes"])
    panels = [("ITL (ms)", "itl_p50_ms", "itl_p99_ms"), ("TTFT (s)", "ttft_p50_ms", "ttft_p99_ms")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (title, p50, p99) in zip(axes, panels, strict=False):
        scale = 1000.0 if title.startswith("TTFT") else 1.0
        xs = range(len(names))
        ax.bar(
            [x - 0.2 for x in xs],
            [results["modes"][n][p50] / scale for n in names],
            0.4,
            label="p50",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [results["modes"][n][p99] / scale for n in names],
            0.4,
            label="p99",
        )
        ax.set_xticks(list(xs), names)
        ax.set_title(title)
        ax.legend()
    if results.get("slo_ms"):
        axes[0].axhline(results["slo_ms"], color="gray", ls="--", lw=1, label="SLO target")
    axes[2].bar(names, [results["modes"][n]["output_tok_s"] for n in names], color="tab:green")
    axes[2].set_title("output tok/s")
    loads = [max(m["load_average"]["after"][0], m["load_average"]["before"][0])
             for m in results["modes"].values() if "load_average" in m]  # fmt: skip
    busiest = f", 1-min load up to {max(loads):.1f}" if loads else ""
    fig.suptitle(f"sharegpt-like, concurrency {results['workload']['concurrency']}, CPU "
                 f"{results['workload']['threads']} threads{busiest}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument(
        "--slo-ms",
        type=float,
        default=None,
        help="SLO mode target (default: 1.5x the default mode's measured decode step p50)",
    )
    ap.add_argument("--modes", default="fixed-2048,default,slo,tokens-256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=str(RESULTS / "itl_slo.json"))
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the modes already in --out (run modes one by one, each a short locked run)",
    )
    args = ap.parse_args()
    modes = args.modes.split(",")
    results: dict = {"workload": {k: getattr(args, k) for k in ("num_prompts", "concurrency", "input_len",
                                                                   "output_len", "threads", "model")},
                     "modes": {}}  # fmt: skip
    out = Path(args.out)
    if args.append and out.exists():
        previous = json.loads(out.read_text())
        if previous.get("workload") != results["workload"]:
            raise SystemExit(f"{out} holds another workload: {previous.get('workload')}")
        results["modes"] = previous["modes"]
        results["slo_ms"] = previous.get("slo_ms")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in modes:
            if name == "fixed-2048":
                server_args = ["--max-step-ms", "0"]
            elif name == "default":
                server_args = []
            elif name == "slo":
                slo = args.slo_ms
                if slo is None:
                    decode = results["modes"].get("default", {}).get("steps", {}).get("decode", {})
                    slo = round(1.5 * decode.get("p50_s", 0.3) * 1000 / 10) * 10
                results["slo_ms"] = slo
                server_args = ["--max-step-ms", str(slo)]
            elif name == "tokens-256":
                server_args = ["--max-step-ms", "0", "--max-num-batched-tokens", "256"]
            else:
                raise SystemExit(f"unknown mode {name!r}")
            load_before = os.getloadavg()
            results["modes"][name] = run_mode(name, server_args, args, workdir)
            # the machine's load around the run: figures taken beside other work are noisy
            results["modes"][name]["load_average"] = {"before": load_before, "after": os.getloadavg()}
    base = results["modes"].get("fixed-2048")
    if base:
        for row in results["modes"].values():
            row["output_tok_s_vs_fixed_2048"] = row["output_tok_s"] / base["output_tok_s"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
