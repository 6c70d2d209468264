"""The advisor's expectedEffect vs the measured effect of its recommendation, rules 1-4.

For each rule: run the offline engine with the seed's mistake on the workload that shows
it, with a real `ServerMetrics` registry fed the way the server feeds it (engine stats
every step, each request's token counts when it finishes); parse the page it renders
into a snapshot, run the advisor's rules, apply the recommended merge patch to the engine
config, run the same workload again, and put the measured ratio next to the estimate.

    .venv/bin/python bench/advisor_effect.py [--cases block_size,prefix_caching,max_model_len,preemptions]

Writes bench/results/advisor_effect.json.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace
from typing import Any

import common
from llmservice.operator.advisor import engine_settings, rules
from llmservice.operator.advisor.snapshot import Snapshot, parse
from llmservice.server.engine.core import engine_stats
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.metrics import CacheInfo, ServerMetrics

# spec field (spec.engine.*) -> EngineConfig field
SPEC_TO_CONFIG = {
    "blockSize": "block_size", "maxModelLen": "max_model_len", "maxNumSeqs": "max_num_seqs",
    "maxNumBatchedTokens": "max_num_batched_tokens", "enablePrefixCaching": "enable_prefix_caching",
    "enableChunkedPrefill": "enable_chunked_prefill", "preemptionMode": "preemption_mode",
    "swapSpaceGiB": "swap_space",
}  # fmt: skip


def run(config: dict[str, Any], work: list[tuple[list[int], int]]) -> tuple[dict, Snapshot, LLMEngine]:
    """One run: the trace summary, and the metrics snapshot the advisor would see."""
    eng = common.engine(**config)
    cfg = eng.config
    metrics = ServerMetrics("m", eng.max_model_len, CacheInfo(cfg.block_size, eng.memory_plan.num_blocks, 0, cfg.gpu_memory_utilization))
    metrics.advisor.set_engine_config(cfg)
    before = parse(metrics.render().decode())
    trace = common.drive(eng, [(0.0, p, common.greedy(n)) for p, n in work], on_step=lambda e: metrics.on_stats(engine_stats(e, True)))
    for rid, (prompt, _) in zip(sorted(trace.token_times, key=lambda r: int(r[1:])), work, strict=True):
        times = trace.token_times[rid]
        metrics.on_first_token(times[0] - trace.arrivals[rid], len(prompt))
        metrics.on_finish("length", times[-1] - trace.arrivals[rid], None, len(prompt), len(times), None)
    after = parse(metrics.render().decode())
    out = {**common.summary(trace), "preemptions": eng.scheduler.stats.num_preemptions}
    return out, Snapshot(before, after, trace.elapsed), eng


def patched(config: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The config with the patch applied; a fixed block count keeps its KV memory (tokens)."""
    out = dict(config)
    for key, value in (patch.get("engine") or {}).items():
        out[SPEC_TO_CONFIG[key]] = value
    if "num_gpu_blocks_override" in config and out.get("block_size") != config.get("block_size"):
        tokens = config["num_gpu_blocks_override"] * config.get("block_size", 16)
        out["num_gpu_blocks_override"] = tokens // out.get("block_size", 16)
    return out


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(300, 40000) for _ in range(n)]


def cases(rng: random.Random) -> dict[str, dict[str, Any]]:
    system = rand_tokens(rng, 1000)
    return {
        # seed 1: short answers (15-20 tokens) at block 32 in a small KV pool
        "block_size": {
            "rule": "block-size",
            "config": {"block_size": 32, "num_gpu_blocks_override": 64, "max_model_len": 512,
                       "max_num_seqs": 256, "enable_prefix_caching": False},
            "work": [(rand_tokens(rng, rng.randint(4, 12)), rng.randint(15, 20)) for _ in range(160)],
            "measure": ("saturated_mean_running", "concurrentRequestsFactor"),
        },
        # seed 3: a shared 1000-token system prompt with caching off
        "prefix_caching": {
            "rule": "prefix-caching-off",
            "config": {"enable_prefix_caching": False, "max_model_len": 2048, "kv_cache_memory_gib": 0.5,
                       "max_num_seqs": 4},
            "work": [(system + rand_tokens(rng, 40), 2) for _ in range(12)],
            "measure": ("elapsed_s", "prefillSpeedup"),  # prefill-bound: 2 tokens per answer
        },
        # seed 4: max_model_len 8192 for 200-token requests
        "max_model_len": {
            "rule": "max-model-len",
            "config": {"max_model_len": 8192, "kv_cache_memory_gib": 0.5, "max_num_seqs": 64,
                       "enable_chunked_prefill": False, "max_num_batched_tokens": 8192},
            "work": [(rand_tokens(rng, 150), 50) for _ in range(64)],
            "measure": ("max_running", "fullLengthConcurrency"),
        },
        # seed 2: long prompts in a tiny pool under recompute
        "preemptions": {
            "rule": "preemptions",
            # two 2100-token prompts fill 270 blocks of 16 before their answers do: preemptions
            "config": {"max_model_len": 4096, "num_gpu_blocks_override": 270, "max_num_seqs": 4,
                       "preemption_mode": "recompute", "swap_space": 1.0},
            "work": [(rand_tokens(rng, 2100), 200) for _ in range(4)],
            "measure": ("elapsed_s", "recomputedPromptTokensPerMinute"),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="block_size,prefix_caching,max_model_len,preemptions")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="advisor_effect", help="results name under bench/results/")
    args = ap.parse_args()
    common.setup(args.threads)
    all_cases = cases(random.Random(0))
    results: dict[str, Any] = {}
    for name in args.cases.split(","):
        case = all_cases[name]
        before, snap, eng = run(case["config"], case["work"])
        settings = engine_settings.from_metrics(snap.after)
        found = [f for f in rules.evaluate(snap, replace(settings)) if f.rule == case["rule"]]
        entry: dict[str, Any] = {"before": before, "rules_fired": [f.rule for f in rules.evaluate(snap, settings)]}
        if not found:
            entry["note"] = f"rule {case['rule']} did not fire on this run"
            results[name] = entry
            print(f"{name}: {entry['note']} (fired: {entry['rules_fired']})")
            continue
        finding = found[0]
        after, _, _ = run(patched(case["config"], finding.recommendation), case["work"])
        metric, estimate_key = case["measure"]
        b, a = before[metric], after[metric]
        measured = b / a if metric == "elapsed_s" else a / b if b else float("nan")
        estimate = finding.expected_effect.get(estimate_key)
        entry.update({
            "finding": finding.to_dict(), "after": after, "measured_metric": metric,
            "measured_ratio": measured, "estimate_key": estimate_key, "estimate": estimate,
            "output_tok_per_s_ratio": after["output_tok_per_s"] / before["output_tok_per_s"],
        })
        if estimate_key == "fullLengthConcurrency":
            entry["estimate_ratio"] = estimate / max(1, finding.evidence["fullLengthConcurrency"])
        elif estimate_key in ("concurrentRequestsFactor", "prefillSpeedup"):
            entry["estimate_ratio"] = estimate
        results[name] = entry
        print(f"{name}: {finding.rule} patch {finding.recommendation}; {metric} x{measured:.2f} measured, "
              f"{estimate_key} {estimate} estimated; throughput x{entry['output_tok_per_s_ratio']:.2f}")
    print(common.write(args.out, results))


if __name__ == "__main__":
    main()
