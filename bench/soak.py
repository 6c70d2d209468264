"""Soak: a real `llmservice serve` under mixed traffic for a long time (`make soak`: 20 min).

Traffic mixes streams, non-streamed `n > 1`, long prompts, client aborts mid-stream and
client disconnects before the answer, against a small KV pool so the engine preempts.
Every request is accounted for (ok, 503 with Retry-After, aborted by the client on
purpose, or failed: must be 0). The server's RSS (API process + engine core) is sampled
every --rss-every-s; at the end the engine must be idle with 0 KV blocks in use, and the
RSS after warm-up may grow by less than --max-rss-growth. A request unanswered after
--client-timeout-s (600) is failed, as a hang; completed ones report latency p50/p99/max
per kind (a first 20-minute run with a 120 s client timeout failed one n=2 request on it). Writes JSON + PNG under
bench/results/. Exit code 1 if a check fails.

    .venv/bin/python bench/soak.py --duration-s 1200          # what `make soak` runs
    .venv/bin/python bench/soak.py --duration-s 60 --warmup-s 20  # a quick proof
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

RESULTS = Path(__file__).parent / "results"
BIN = Path(sys.executable).parent / "llmservice"
KINDS = ("stream", "n2", "long_prompt", "abort", "disconnect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """RSS of the process and its children (the engine core), from /proc."""
    total = 0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            total += int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text()).group(1)) * 1024
        except (OSError, AttributeError):
            pass
    return total


def metric(text: str, name: str) -> float:
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))  # fmt: skip


def rss_growth(samples: list[tuple[float, int]], warmup_s: float) -> float:
    """Relative RSS growth from the first sample after warm-up to the mean of the last
    quarter of samples (one late sample's noise does not decide)."""
    after = [rss for t, rss in samples if t >= warmup_s]
    if len(after) < 2:
        return 0.0
    tail = after[-max(1, len(after) // 4):]
    return (sum(tail) / len(tail)) / after[0] - 1.0


def body_for(kind: str, rng: random.Random, model: str) -> dict:
    words = " ".join(rng.choice(("alpha", "river", "stone", "cloud", "seven", "green")) for _ in range(8))
    body: dict = {"model": model, "temperature": 0.8, "max_tokens": rng.randint(8, 48), "ignore_eos": True}
    if kind == "long_prompt":
        body["prompt"] = (words + " ") * rng.randint(20, 40)
    elif kind == "n2":
        body["messages"] = [{"role": "user", "content": words}]
        body["n"] = 2
    else:
        body["messages"] = [{"role": "user", "content": words}]
    body["stream"] = kind in ("stream", "abort")
    return body


async def one_request(http: httpx.AsyncClient, kind: str, rng: random.Random, model: str) -> str:
    """The outcome: ok, rejected_503, aborted (by us, on purpose) or failed:<why>."""
    body = body_for(kind, rng, model)
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    try:
        if kind == "disconnect":
            try:
                r = await http.post(path, json=body, timeout=rng.uniform(0.05, 0.5))
            except httpx.TimeoutException:
                return "aborted"
            return "ok" if r.status_code == 200 else _refused(r)
        if body["stream"]:
            async with http.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return _refused(r)
                stop_after = rng.randint(1, 4) if kind == "abort" else None
                chunks, done = 0, False
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                        break
                    if line.startswith("data: "):
                        if '"error"' in line[:20]:
                            return f"failed:error event {line[:200]}"
                        chunks += 1
                        if stop_after is not None and chunks >= stop_after:
                            return "aborted"  # leaving the block closes the connection
                return "ok" if done else "failed:stream ended without [DONE]"
        r = await http.post(path, json=body)
        if r.status_code != 200:
            return _refused(r)
        choices = r.json()["choices"]
        return "ok" if len(choices) == body.get("n", 1) else f"failed:{len(choices)} choices"
    except httpx.HTTPError as exc:
        return f"failed:{type(exc).__name__}: {exc}"


def _refused(r: httpx.Response) -> str:
    if r.status_code == 503 and r.headers.get("retry-after"):
        return "rejected_503"
    return f"failed:HTTP {r.status_code} {r.text[:200]}"


async def drive(url: str, duration_s: float, concurrency: int, rss_every_s: float, pid: int, model: str,
                seed: int, client_timeout_s: float) -> dict:
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failures: list[str] = []
    latencies: dict[str, list[float]] = {}
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    stop_at = t0 + duration_s

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=client_timeout_s) as http:
            while time.monotonic() < stop_at:
                kind = rng.choice(KINDS)
                kinds[kind] += 1
                started = time.monotonic()
                outcome = await one_request(http, kind, rng, model)
                took = time.monotonic() - started
                outcomes[outcome.split(":", 1)[0]] += 1
                if outcome == "ok":
                    latencies.setdefault(kind, []).append(took)
                if outcome.startswith("failed"):
                    failures.append(f"{kind} after {took:.1f} s: {outcome}")

    async def sampler() -> None:
        while time.monotonic() < stop_at:
            samples.append((time.monotonic() - t0, rss_bytes(pid)))
            await asyncio.sleep(rss_every_s)

    await asyncio.gather(sampler(), *(worker(i) for i in range(concurrency)))
    samples.append((time.monotonic() - t0, rss_bytes(pid)))
    return {"outcomes": dict(outcomes), "kinds": dict(kinds), "failures": failures[:50], "rss": samples,
            "ok_latency_s": {kind: latency_summary(v) for kind, v in sorted(latencies.items())}}


def latency_summary(values: list[float]) -> dict[str, float]:
    """p50 / p99 / max of one kind's completed requests, in seconds."""
    v = sorted(values)
    return {"n": len(v), "p50": round(v[len(v) // 2], 2), "p99": round(v[min(len(v) - 1, int(0.99 * len(v)))], 2),
            "max": round(v[-1], 2)}


def wait_idle(url: str, timeout_s: float) -> tuple[float, float]:
    """(running + waiting, KV usage) once nothing runs, or at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(url + "/metrics", timeout=10).text
        busy = metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
        kv = metric(text, "vllm:kv_cache_usage_perc")
        if (busy == 0 and kv == 0) or time.monotonic() > deadline:
            return busy, kv
        time.sleep(0.5)


def plot(samples: list[tuple[float, int]], warmup_s: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t / 60 for t, _ in samples], [r / 2**20 for _, r in samples], marker=".")
    ax.axvline(warmup_s / 60, color="grey", linestyle="--", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS, API + engine core (MiB)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=1200)
    p.add_argument("--warmup-s", type=float, default=180, help="RSS growth is measured after this")
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--rss-every-s", type=float, default=10)
    p.add_argument("--max-rss-growth", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client-timeout-s", type=float, default=600,
                   help="a request still unanswered after this is failed (a hang), not slow")
    p.add_argument("--out", default=str(RESULTS / "soak"), help="path prefix of the JSON and PNG")
    p.add_argument(
        "server_args", nargs="*", help="more `llmservice serve` options, after `--`"
    )
    args = p.parse_args()

    port = free_port()
    model = "builtin:smollm2-135m"
    # A small KV pool (preemptions) and a small queue bound (503s) on purpose.
    cmd = [str(BIN), "serve", model, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
           "--num-gpu-blocks-override", "64", "--max-num-seqs", "16", "--max-waiting-requests", "16",
           *args.server_args]
    log_path = Path(args.out + ".server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                print(f"server did not start; see {log_path}", file=sys.stderr)
                return 1
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        before = httpx.get(url + "/metrics", timeout=10).text
        run = asyncio.run(drive(url, args.duration_s, args.concurrency, args.rss_every_s, server.pid, model,
                                args.seed, args.client_timeout_s))
        busy, kv = wait_idle(url, 60)
        after = httpx.get(url + "/metrics", timeout=10).text
    finally:
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(60)
    sent = sum(run["kinds"].values())
    accounted = sum(run["outcomes"].values())
    growth = rss_growth(run["rss"], args.warmup_s)
    preemptions = metric(after, "vllm:num_preemptions_total") - metric(before, "vllm:num_preemptions_total")
    checks = {
        "every request accounted for": accounted == sent,
        "no failed request": run["outcomes"].get("failed", 0) == 0,
        "engine idle at the end": busy == 0,
        "0 KV blocks in use at the end": kv == 0,
        f"RSS growth after warm-up < {args.max_rss_growth:.0%}": growth < args.max_rss_growth,
        "preemptions happened": preemptions > 0,
        "server exited 0 on SIGTERM": exit_code == 0,
    }
    report = {
        "command": " ".join(sys.argv), "server": cmd[1:], "duration_s": args.duration_s,
        "concurrency": args.concurrency, "sent": sent, **run, "preemptions": preemptions,
        "kv_cache_usage_end": kv, "running_or_waiting_end": busy, "rss_growth_after_warmup": growth,
        "server_exit_code": exit_code, "checks": checks, "passed": all(checks.values()),
    }
    Path(args.out + ".json").write_text(json.dumps(report, indent=1))
    plot(run["rss"], args.warmup_s, Path(args.out + ".png"),
         f"soak {args.duration_s / 60:.0f} min: {sent} requests, RSS growth {growth:+.1%}")
    for name, ok in checks.items():
        print(f"{'ok ' if ok else 'FAIL'} {name}")
    print(f"sent {sent}: {run['outcomes']}; preemptions {preemptions:.0f}; RSS growth {growth:+.2%}; "
          f"{args.out}.json / .png")
    for kind, lat in run["ok_latency_s"].items():
        print(f"  {kind}: {lat['n']} ok, latency p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
