"""The prefix cache's host tier (--kv-offloading-size): multi-turn chats whose histories
outgrow the device KV pool, with the host tier off vs on (prefix caching on in both).

N conversations of T turns; each turn appends ~U user tokens to the conversation's
history, and the assistant reply (the model's own greedy output, R tokens) joins it too.
Turns interleave (turn t of every conversation before turn t+1) and C requests are in
flight at a time (a closed loop: a finished request frees its slot for the next), so
TTFT measures the request's own prefill, not a queue. The device pool holds only
--pool-fraction of all final histories, so a conversation's prefix is evicted from it
between its turns: off, every turn prefills the whole history again; on, it is copied
back from the host pool.
    .venv/bin/python bench/kv_tiers.py [--quick] [--conversations 32 --turns 8]
Writes bench/results/kv_tiers.json and kv_tiers.png (TTFT per turn, both settings).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import common
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.loadgen.stats import percentile


@dataclass(frozen=True)
class Workload:
    conversations: int
    turns: int
    user_tokens: int
    reply_tokens: int
    concurrency: int
    block_size: int = 16

    @property
    def final_history_tokens(self) -> int:
        """One conversation's prompt at its last turn, plus that turn's reply."""
        return self.turns * (self.user_tokens + self.reply_tokens)


def device_pool_blocks(w: Workload, pool_fraction: float) -> int:
    """A device pool holding `pool_fraction` of all final histories, never less than the
    running requests' own blocks (each running history at full length, plus one)."""
    per_conv = math.ceil(w.final_history_tokens / w.block_size) + 1
    return max(math.ceil(pool_fraction * w.conversations * per_conv), w.concurrency * per_conv)


def host_pool_gib(w: Workload, kv_bytes_per_token: int, headroom: float = 1.25) -> float:
    """Host tier size holding every history at once, with headroom for partial blocks."""
    return headroom * w.conversations * w.final_history_tokens * kv_bytes_per_token / 2**30


def user_turns(w: Workload, seed: int = 0) -> list[list[list[int]]]:
    """[conversation][turn] -> user token ids (ids from the ordinary vocabulary range)."""
    rng = random.Random(seed)
    return [[[rng.randrange(200, 40000) for _ in range(w.user_tokens)] for _ in range(w.turns)]
            for _ in range(w.conversations)]


@dataclass
class TurnRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    ttft_s: float
    cached_tokens: int = 0


@dataclass
class Run:
    records: list[TurnRecord] = field(default_factory=list)
    elapsed_s: float = 0.0
    output_tokens: int = 0


def run_conversations(eng: LLMEngine, w: Workload, turns: list[list[list[int]]]) -> Run:
    """Drive the closed loop; the order of requests is (turn, conversation)."""
    queue = deque((t, c) for t in range(w.turns) for c in range(w.conversations))
    history: list[list[int]] = [[] for _ in range(w.conversations)]
    in_flight: dict[str, dict] = {}
    run = Run()
    params = common.greedy(w.reply_tokens)
    t0 = time.perf_counter()
    while queue or in_flight:
        while queue and len(in_flight) < w.concurrency:
            t, c = queue.popleft()
            prompt = history[c] + turns[c][t]
            rid = f"c{c}t{t}"
            eng.add_request(prompt, params, request_id=rid)
            in_flight[rid] = {"c": c, "t": t, "prompt": prompt, "start": time.perf_counter(), "out": []}
        deltas = eng.step()
        stamp = time.perf_counter()
        for d in deltas:
            info = in_flight[d.request_id]
            if not info["out"] and d.new_token_ids:
                run.records.append(TurnRecord(info["c"], info["t"], len(info["prompt"]), stamp - info["start"],
                                              d.num_cached_tokens))
            info["out"].extend(d.new_token_ids)
            run.output_tokens += len(d.new_token_ids)
            if d.finished:
                history[info["c"]] = info["prompt"] + info["out"]
                del in_flight[d.request_id]
    run.elapsed_s = time.perf_counter() - t0
    return run


def summarize(run: Run, w: Workload, stats) -> dict:
    ttfts = [r.ttft_s for r in run.records]
    per_turn = {t: [r.ttft_s for r in run.records if r.turn == t] for t in range(w.turns)}
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_mean_by_turn_s": [statistics.fmean(per_turn[t]) for t in range(w.turns)],
        "ttft_p50_by_turn_s": [percentile(per_turn[t], 50) for t in range(w.turns)],
        "elapsed_s": run.elapsed_s,
        "output_tokens": run.output_tokens,
        "output_tok_per_s": run.output_tokens / run.elapsed_s,
        "prefix_queries_tokens": stats.prefix_queries,
        "prefix_hits_device_tokens": stats.prefix_hits,
        "prefix_hits_host_tokens": stats.prefix_host_hits,
        "num_preemptions": getattr(stats, "num_preemptions", None),
    }


def plot(w: Workload, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    turns = list(range(1, w.turns + 1))
    for key, label in (("offload_off", "host tier off"), ("offload_on", "host tier on")):
        ax.plot(turns, [s * 1000 for s in results[key]["ttft_mean_by_turn_s"]], marker="o", label=label)
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT, mean over conversations (ms)")
    ax.set_title(f"{w.conversations} conversations x {w.turns} turns, device pool "
                 f"{results['sizes']['device_pool_fraction_of_histories']:.2f} of all histories", fontsize=10)
    ax.legend()
    fig.tight_layout()
    path = common.result_path(results["name"], ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user-tokens", type=int, default=200)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pool-fraction", type=float, default=0.25,
                    help="device KV pool size as a share of all conversations' final histories")
    ap.add_argument("--quick", action="store_true", help="smoke run: 6 conversations x 3 turns, short turns")
    ap.add_argument("--threads", type=int, default=None)
    common.add_model_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.conversations, args.turns, args.user_tokens, args.reply_tokens, args.concurrency = 6, 3, 48, 4, 2
    w = Workload(args.conversations, args.turns, args.user_tokens, args.reply_tokens, args.concurrency)
    common.setup(args.threads, args)
    blocks = device_pool_blocks(w, args.pool_fraction)
    turns = user_turns(w)
    results: dict = {"name": "kv_tiers-quick" if args.quick else "kv_tiers"}
    for key, offload in (("offload_off", False), ("offload_on", True)):
        model_len = w.final_history_tokens + w.block_size  # the longest prompt + reply fits the pool
        probe = common.engine(num_gpu_blocks_override=blocks, enable_prefix_caching=True, max_num_seqs=w.concurrency,
                              max_model_len=model_len)
        bytes_per_token = probe.memory_plan.kv_bytes_per_token
        host_gib = host_pool_gib(w, bytes_per_token) if offload else 0.0
        if offload:
            del probe
            eng = common.engine(num_gpu_blocks_override=blocks, enable_prefix_caching=True,
                                max_num_seqs=w.concurrency, kv_offloading_size=host_gib, max_model_len=model_len)
        else:
            eng = probe
        results["sizes"] = {
            "block_size": w.block_size,
            "device_pool_blocks": blocks,
            "device_pool_tokens": blocks * w.block_size,
            "device_pool_gib": blocks * w.block_size * bytes_per_token / 2**30,
            "all_histories_tokens": w.conversations * w.final_history_tokens,
            "device_pool_fraction_of_histories": blocks * w.block_size / (w.conversations * w.final_history_tokens),
            "kv_bytes_per_token": bytes_per_token,
        }
        run = run_conversations(eng, w, turns)
        results[key] = summarize(run, w, eng.scheduler.stats) | {"kv_offloading_size_gib": host_gib}
        r = results[key]
        print(f"{key}: TTFT p50 {r['ttft_p50_s'] * 1000:.0f} ms p99 {r['ttft_p99_s'] * 1000:.0f} ms, "
              f"{r['output_tok_per_s']:.1f} out tok/s, {r['elapsed_s']:.1f} s, prefix hits device "
              f"{r['prefix_hits_device_tokens']} / host {r['prefix_hits_host_tokens']} of "
              f"{r['prefix_queries_tokens']} tokens (host tier {host_gib:.2f} GiB)")
        del eng
    s = results["sizes"]
    print(f"device pool {s['device_pool_blocks']} blocks = {s['device_pool_tokens']} tokens "
          f"({s['device_pool_gib']:.2f} GiB), all histories {s['all_histories_tokens']} tokens "
          f"(pool = {s['device_pool_fraction_of_histories']:.2f} of them)")
    off, on = results["offload_off"], results["offload_on"]
    results["ttft_p50_ratio_off_over_on"] = off["ttft_p50_s"] / on["ttft_p50_s"]
    results["throughput_ratio_on_over_off"] = on["output_tok_per_s"] / off["output_tok_per_s"]
    results["workload"] = {"conversations": w.conversations, "turns": w.turns, "user_tokens_per_turn": w.user_tokens,
                           "reply_tokens": w.reply_tokens, "concurrency": w.concurrency,
                           "order": "turn t of every conversation before turn t+1, closed loop"}
    print(f"TTFT p50 off/on = {results['ttft_p50_ratio_off_over_on']:.2f}x, "
          f"throughput on/off = {results['throughput_ratio_on_over_off']:.2f}x")
    common.write(results["name"], results)
    plot(w, results)


if __name__ == "__main__":
    main()
