"""Tensor parallelism on CPU: offline throughput at TP=1 vs TP=N (1 torch thread per
rank), and what the step's message passing costs.

Two cores cannot show a speed-up at TP=3 (three ranks share them, and every layer adds
two gloo all-reduces); the point is the overhead per step. Measured in the same run:
- throughput of the same greedy workload at TP=1 and TP=N, and whether the tokens agree;
- per step at TP=N: the executor's message passing (pickling the SchedulerOutput, the
  pipes to N ranks, rank 0's reply, unpickling) = round trip minus rank 0's own time;
- an empty step's round trip (no forward: the floor of the engine <-> ranks exchange).

    .venv/bin/python bench/tp_overhead.py [--tp 3] [--num-requests 24] [--model builtin:smollm2-135m]

Writes bench/results/tp_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.step import SchedulerOutput
from workloads import sharegpt_like

RESULTS = Path(__file__).parent / "results"


def run(model: str, tp: int, work: list[tuple[list[int], int]]) -> dict:
    config = EngineConfig(model=model, tensor_parallel_size=tp, num_threads=1, max_model_len=1024,
                          kv_cache_memory_gib=0.25, preemption_mode="recompute",
                          max_step_ms=0)  # token budget alone at both sizes (the step-time budget profiles a local model only)  # fmt: skip
    t0 = time.perf_counter()
    engine = LLMEngine.from_config(config)
    start_s = time.perf_counter() - t0
    prompts = [p for p, _ in work]
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in work]
    steps: list[float] = []
    for prompt, sp in zip(prompts, params, strict=True):
        engine.add_request(prompt, sp)
    t0 = time.perf_counter()
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        for delta in engine.step():
            tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        steps.append(time.perf_counter() - s0)
    wall = time.perf_counter() - t0
    out_tokens = sum(len(t) for t in tokens.values())
    result = {
        "tp": tp, "start_s": round(start_s, 2), "wall_s": round(wall, 3), "steps": len(steps),
        "output_tokens": out_tokens, "output_tokens_per_s": round(out_tokens / wall, 2),
        "mean_step_ms": round(1e3 * statistics.mean(steps), 3),
        "median_step_ms": round(1e3 * statistics.median(steps), 3),
        "tokens": [tokens[k] for k in sorted(tokens, key=lambda r: int(r.split("-")[-1]))],
    }  # fmt: skip
    if tp > 1:
        ipc = engine.runner.ipc
        result["ipc_per_step_us"] = round(ipc.mean_us, 1)
        result["ipc_share_of_step"] = round(ipc.seconds / sum(steps), 4)
        result["payload_bytes_per_step"] = round(ipc.payload_bytes / max(ipc.steps, 1), 1)
        empty = []
        for _ in range(200):
            e0 = time.perf_counter()
            engine.runner.execute(SchedulerOutput())
            empty.append(time.perf_counter() - e0)
        result["empty_step_round_trip_us"] = {
            "median": round(1e6 * statistics.median(empty), 1),
            "p90": round(1e6 * sorted(empty)[int(0.9 * len(empty))], 1),
        }
        engine.runner.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--out", default=str(RESULTS / "tp_overhead.json"))
    args = ap.parse_args()
    work = [(p[:128], min(o, 32)) for p, o in sharegpt_like(args.num_requests, seed=0)]
    load_before = os.getloadavg()
    base = run(args.model, 1, work)
    sharded = run(args.model, args.tp, work)
    same = base.pop("tokens") == sharded.pop("tokens")
    report = {
        "benchmark": "tp_overhead",
        "model": args.model,
        "workload": f"{args.num_requests} requests, prompts <= 128 tokens, <= 32 greedy output tokens",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "threads_per_rank": 1,
        "note": "2 shared cores, other work running: TP=N ranks share them, so no speed-up is possible; "
        "read the per-step message-passing cost, not the throughput ratio, as the result",
        "tp1": base,
        f"tp{args.tp}": sharded,
        "greedy_tokens_identical": same,
        "throughput_ratio": round(sharded["output_tokens_per_s"] / base["output_tokens_per_s"], 3),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
