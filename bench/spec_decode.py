"""Speculative decoding on CPU: speed-up over speculation off, mean accepted length and
acceptance by position, per workload and batch size (the targets: ngram >= 1.8x
at batch 1 on copy-heavy text, never more than 5 % slower than off on random text).

Workloads (the engine's own SmolLM2-135M and tokenizer, greedy, ignore_eos, the same
output lengths on and off, so both runs compute the very same tokens):
- copy-heavy: "repeat / fix this" prompts over real text and code (stdlib sources), the
  answer quoting the prompt, as summaries and edits do;
- chat: short natural questions (ShareGPT-like turns, scaled to this CPU);
- random: uniformly random token ids (no n-gram in the prompt to find).
Methods (`--methods`, comma-separated): `ngram`, `layer_skip:L` (the target's first L
layers draft) and `draft_model:MODEL` (e.g. `draft_model:builtin:smollm2-135m`, the
target drafting for itself: an upper bound on acceptance, not a speed-up, since the draft
costs as much as the target). Each (workload, batch) runs off and every method
alternately, `--repeats` times each, and the median throughput of each is compared: the machine is shared with other work, so a
single run would measure the neighbours. Prefix caching is off so repeats do not turn
prefill into cache hits. Two speed-ups: `speedup` over whole requests (prefill + decode
output tok/s), and `decode_speedup` over the decoding alone (each repeat also times the
same prompts' prefill with max_tokens 1 and takes it off: speculation does not touch
prefill, and the tokens after the first are what a user sees faster).

    flock /tmp/llmservice-heavy.lock .venv/bin/python bench/spec_decode.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import textwrap
import time

import common
from llmservice.server.engine.sampling_params import SamplingParams

CHAT = [
    "What is the capital of France, and why is it famous?",
    "Explain how a hash table works to a beginner.",
    "Write a short poem about the sea.",
    "How do I make a cup of green tea?",
    "What are the benefits of regular exercise?",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Describe a good morning routine.",
]


def copy_heavy_texts() -> list[str]:
    """Real text to quote: stdlib functions' source (code) and docstrings (prose)."""
    funcs = [textwrap.wrap, textwrap.dedent, json.dumps, statistics.median, random.shuffle,
             statistics.mean, textwrap.indent, json.loads]  # fmt: skip
    out = []
    for i, f in enumerate(funcs):
        src = inspect.getsource(f)[:1200]
        if i % 2:
            out.append(
                f"Fix the typos in this code and repeat it in full:\n\n{src}\n\nFixed code:\n\n"
            )
        else:
            doc = (inspect.getdoc(f) or src)[:900]
            out.append(
                f"Summarize by quoting the key sentences of this text:\n\n{doc}\n\nQuoted summary:\n\n{doc[:40]}"
            )
    return out


def workload(name: str, tok, n: int, max_tokens: int) -> list[list[int]]:
    rng = random.Random(0)
    if name == "copy":
        texts = copy_heavy_texts()
        return [tok.encode(texts[i % len(texts)]) for i in range(n)]
    if name == "chat":
        return [tok.encode(f"Question: {CHAT[i % len(CHAT)]}\nAnswer:") for i in range(n)]
    return [[rng.randrange(200, 48000) for _ in range(64)] for _ in range(n)]


def run(eng, prompts: list[list[int]], batch: int, max_tokens: int) -> tuple[float, int, float]:
    """Output tokens per second over the prompts, `batch` at a time; the tokens; seconds."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(prompts), batch):
        for out in eng.generate(prompts[i : i + batch], params):
            tokens += len(out.token_ids)
    seconds = time.perf_counter() - t0
    return tokens / seconds, tokens, seconds


def decode_rate(full: tuple[float, int, float], prefill: tuple[float, int, float]) -> float:
    """Tokens after the first per second of decoding: the run less the same prompts'
    prefill alone (max_tokens 1: the first token). The prompts are the same on and off, so
    the prefill is too; speculation only changes this part (the TPOT a user sees)."""
    _, tokens, seconds = full
    _, first_tokens, prefill_seconds = prefill
    return (tokens - first_tokens) / max(1e-9, seconds - prefill_seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="copy,chat,random")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--methods", default="ngram", help="ngram, layer_skip:L, draft_model:MODEL")
    args = ap.parse_args()
    common.setup(args.threads, args)
    base = dict(
        enable_prefix_caching=False, max_num_seqs=8, num_threads=args.threads, max_model_len=2048
    )
    off = common.engine(**base)
    specs = {m: method_config(m, args.tokens) for m in args.methods.split(",")}
    engines = {m: common.engine(**base, speculative_config=json.dumps(c)) for m, c in specs.items()}
    tok = off.tokenizer
    results = []
    for name in args.workloads.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            prompts = workload(name, tok, max(batch, 4 if batch == 1 else batch), args.max_tokens)
            if batch == 1:
                prompts = prompts[:2]  # two requests one after the other: batch 1 is slow
            run(off, prompts[:1], 1, 8)  # warm them all
            for on in engines.values():
                run(on, prompts[:1], 1, 8)
            before = {m: on.speculator.stats.totals() for m, on in engines.items()}
            rates: dict[str, list[float]] = {"off": [], **{m: [] for m in engines}}
            decode: dict[str, list[float]] = {"off": [], **{m: [] for m in engines}}
            for _ in range(args.repeats):
                prefill = run(off, prompts, batch, 1)
                for m, eng in {"off": off, **engines}.items():
                    full = run(eng, prompts, batch, args.max_tokens)
                    rates[m].append(full[0])
                    decode[m].append(decode_rate(full, prefill))
            for m, on in engines.items():
                results.append(summarize(name, batch, prompts, m, rates["off"], rates[m],
                                         before[m], on.speculator.stats.totals(),
                                         decode["off"], decode[m]))  # fmt: skip
    common.write(
        "spec_decode",
        {
            "methods": specs,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "note": "CPU: medians of alternating runs (machine.load_average says how busy it was)",
            "results": results,
        },
    )


def method_config(method: str, k: int) -> dict:
    """`ngram`, `layer_skip:L` or `draft_model:MODEL` as a --speculative-config."""
    kind, _, arg = method.partition(":")
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if kind == "layer_skip":
        return {"method": "layer_skip", "num_speculative_tokens": k, "num_layers": int(arg)}
    if kind == "draft_model":
        return {"method": "draft_model", "num_speculative_tokens": k, "model": arg}
    raise SystemExit(f"--methods: unknown method {method!r} (ngram, layer_skip:L, draft_model:MODEL)")


def summarize(
    name: str, batch: int, prompts: list, method: str, off_rates: list[float], on_rates: list[float],
    before: tuple, after: tuple, decode_off: list[float], decode_on: list[float],
) -> dict:
    """One row: the method's median throughput over off's, and its acceptance in this run."""
    drafts, draft_tokens, accepted = (
        a - b for a, b in zip(after[:3], before[:3], strict=True)
    )
    per_pos = [a - b for a, b in zip(after[3], before[3], strict=True)]
    r = {
        "workload": name,
        "batch": batch,
        "method": method,
        "requests": len(prompts),
        "tok_s_off": statistics.median(off_rates),
        "tok_s_on": statistics.median(on_rates),
        "runs_off": off_rates,
        "runs_on": on_rates,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "mean_accepted_length": 1 + accepted / drafts if drafts else None,
        "acceptance_by_position": [p / drafts for p in per_pos] if drafts else [],
    }
    r["speedup"] = r["tok_s_on"] / r["tok_s_off"]
    r["decode_tok_s_off"] = statistics.median(decode_off)
    r["decode_tok_s_on"] = statistics.median(decode_on)
    r["decode_speedup"] = r["decode_tok_s_on"] / r["decode_tok_s_off"]
    mal = f"{r['mean_accepted_length']:.2f}" if drafts else "-"
    print(
        f"{name:7s} batch {batch}: off {r['tok_s_off']:6.1f} tok/s, {method} {r['tok_s_on']:6.1f} tok/s, "
        f"x{r['speedup']:.2f} (decoding alone x{r['decode_speedup']:.2f}), mean accepted length {mal}, "
        f"by position {[round(a, 2) for a in r['acceptance_by_position']]}"
    )
    return r


if __name__ == "__main__":
    main()
