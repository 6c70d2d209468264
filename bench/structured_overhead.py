"""What structured outputs cost a batch: output tok/s with 0 %, 50 % and 100 % of the
requests constrained by a JSON schema, and the per-step mask time (grammar.py fills
each constrained row's bitmask; the sampler applies it).

Every request generates exactly --max-tokens tokens (free ones ignore EOS; the
constrained ones follow a schema that cannot complete sooner: an array of at least
1000 bounded integers inside an object), so the three batches do the same model work
and differ only in grammar work. The grammar is compiled before timing (the cache
serves every request; compile time is reported apart). Configurations are interleaved
over --repeats rounds and the median is kept, since the machine is shared.

    python bench/structured_overhead.py                      # CPU, builtin model
    python bench/structured_overhead.py --device cuda --model DIR --load-format dummy
"""

from __future__ import annotations

import argparse
import json
import time

import common
from llmservice.server.engine import sampler as sampler_module
from llmservice.server.engine.grammar_spec import StructuredSpec
from llmservice.server.engine.sampling_params import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["train", "test"]},
        "values": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 999},
            "minItems": 1000,
        },
    },
    "required": ["label", "values"],
}
SPEC = StructuredSpec("json_schema", json.dumps(SCHEMA))


class ApplyTimer:
    """Wraps the sampler's bitmask application to time it (synchronizing on CUDA)."""

    def __init__(self):
        self.seconds = 0.0
        self.original = sampler_module.apply_bitmasks

    def __call__(self, logits, rows):
        import torch

        t0 = time.perf_counter()
        self.original(logits, rows)
        if logits.is_cuda and any(r.bitmask is not None for r in rows):
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0


def run_batch(eng, batch: int, fraction: float, max_tokens: int, timer: ApplyTimer) -> dict:
    constrained = round(batch * fraction)
    prompt = eng.tokenizer.encode("Write the measurements as JSON:")
    for i in range(batch):
        structured = SPEC if i < constrained else None
        eng.add_request(
            prompt,
            SamplingParams(
                temperature=0, max_tokens=max_tokens, ignore_eos=True, structured=structured
            ),
        )
    mask0, apply0 = eng.grammars.mask_seconds, timer.seconds
    steps, tokens = 0, 0
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        tokens += sum(len(d.new_token_ids) for d in eng.step())
        steps += 1
    elapsed = time.perf_counter() - t0
    return {
        "constrained": constrained,
        "output_tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
        "steps": steps,
        "fill_ms_per_step": (eng.grammars.mask_seconds - mask0) / steps * 1e3,
        "apply_ms_per_step": (timer.seconds - apply0) / steps * 1e3,
        "step_ms": elapsed / steps * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common.add_model_args(ap)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    common.setup(args.threads, args)
    eng = common.engine(max_model_len=512, max_num_seqs=max(args.batch, 8))
    timer = ApplyTimer()
    sampler_module.apply_bitmasks = timer
    t0 = time.perf_counter()
    eng.grammars.compiler.submit(SPEC).result()
    compile_s = (
        time.perf_counter() - t0
    )  # first use: xgrammar import + vocabulary tables + this schema
    run_batch(eng, args.batch, 0.5, 4, timer)  # warm-up (matchers, kernels)
    fractions = (0.0, 0.5, 1.0)
    rounds = {f: [] for f in fractions}
    for _ in range(args.repeats):
        for f in fractions:
            rounds[f].append(run_batch(eng, args.batch, f, args.max_tokens, timer))
    summary = {}
    for f, runs in rounds.items():
        best = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]  # the median run
        summary[f"{int(f * 100)}%"] = {**best, "tok_s_all": [round(r["tok_s"], 2) for r in runs]}
    base = summary["0%"]["tok_s"]
    for row in summary.values():
        row["throughput_vs_free"] = row["tok_s"] / base
    result = {
        "benchmark": "structured_overhead",
        "model": common.CHOICE.model,
        "device": str(common.device_and_dtype()[0]),
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "first_compile_s": compile_s,
        "schema": SCHEMA,
        "results": summary,
        "target": "50 % constrained costs at most 10 % of throughput",
        "note": "medians of interleaved rounds (machine.load_average says how busy it was)",
    }
    print(f"first compile (import + vocab tables + schema): {compile_s:.2f} s")
    print(
        f"{'constrained':>11} {'tok/s':>8} {'vs free':>8} {'step ms':>8} {'fill ms':>8} {'apply ms':>9}"
    )
    for name, row in summary.items():
        print(
            f"{name:>11} {row['tok_s']:8.1f} {row['throughput_vs_free']:8.3f} {row['step_ms']:8.2f} "
            f"{row['fill_ms_per_step']:8.3f} {row['apply_ms_per_step']:9.3f}"
        )
    path = common.result_path("structured_overhead")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
