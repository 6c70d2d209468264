"""Start-up breakdown: from 'process started' to 'first token', phase by phase, for the
embedded GGUF and a random ~1 GB sharded-safetensors Llama saved by transformers, against
the time to read the same files (`cat` to /dev/null).

Each run is a fresh subprocess that builds the engine the way `LLMEngine.from_config`
does, one phase at a time, so each phase gets its own clock:
process start (exec to the first line of Python), imports, tokenizer + config, weight read
(the loader), weight placement (LlamaModel: device copy, fusing, packing), KV pool (memory
plan + engine with its pools), warm-up (step-cost profile + preemption-cost timing), first
token (one greedy request of a 16-token prompt). Peak RSS (VmHWM) is recorded too.

The page cache: when /proc/sys/vm/drop_caches is writable, every run (and every `cat`)
starts cold; otherwise both are warm (one unrecorded run first) and the JSON says which.

    .venv/bin/python bench/load_time.py [--repeats 3] [--cache-dir /tmp/llmservice-load-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# ~1 GB of fp32 weights: 248M parameters; transformers shards it at 250 MB
SHAPE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
SHARD_SIZE = "250MB"
PHASES = ("process_start", "imports", "tokenizer", "weight_read", "weight_placement", "kv_pool", "warm_up",
          "first_token")


def status_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def measure(model: str, spawned_at: float) -> dict:
    """One start-up in this process (run as the child), phase by phase."""
    marks = {"process_start": time.time() - spawned_at}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        marks[name] = now - t
        t = now

    import torch
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine import startup
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams
    from llmservice.server.model.llama import LlamaModel
    from llmservice.server.model.loader import load_model, read_model_info
    from llmservice.server.tokenizer import TextTokenizer
    mark("imports")
    config = EngineConfig(model=model, device="cpu", max_model_len=2048)
    read_model_info(model)
    mark("tokenizer")
    rss_before = status_kib("VmRSS") * 1024
    loaded = load_model(model, torch.float32, device=torch.device("cpu"), cpu_weights=config.cpu_weights)
    mark("weight_read")
    config = config.resolve_lengths(loaded.config.max_position_embeddings)
    built = LlamaModel(loaded.config, loaded.weights, torch.device("cpu"), torch.float32, 2048, consume=True)
    mark("weight_placement")
    plan = startup.plan_memory(config, built)
    engine = LLMEngine(config, built, TextTokenizer(loaded.tokenizer, loaded.config.eos_token_ids), plan, 0.0)
    mark("kv_pool")
    profiled = engine.seed_cost_model() if engine.scheduler.time_budget_on else []
    engine.scheduler.costs = startup.measure_preemption_costs(
        config, built, engine.runner.kv_caches, engine.swap_pools, plan.num_blocks,
        engine.swap_space.num_blocks, plan.kv_bytes_per_token, prefill=startup.profiled_prefills(profiled))
    mark("warm_up")
    engine.add_request(list(range(1, 17)), SamplingParams(temperature=0.0, max_tokens=1), "first")
    while engine.has_unfinished_requests():
        engine.step()
    mark("first_token")
    return {"phases": marks, "weight_bytes": built.weight_bytes(), "rss_before_weights": rss_before,
            "peak_rss": status_kib("VmHWM") * 1024}


def save_tokenizer(folder: Path) -> None:
    """A small byte-level BPE tokenizer.json (the loader needs one; its ids fit the vocab)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["The capital of France is Paris. " * 8, "def f(x): return x + 1\n" * 8], trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def make_transformers_llama(folder: Path) -> Path:
    """Random weights of SHAPE, saved by transformers in SHARD_SIZE shards (once; reused)."""
    if (folder / "model.safetensors.index.json").exists():
        if not (folder / "tokenizer.json").exists():
            save_tokenizer(folder)
        return folder
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=SHARD_SIZE)
    save_tokenizer(folder)
    return folder


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def cat_seconds(files: list[Path], cold: bool) -> float:
    if cold:
        drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run_child(model: str, cold: bool) -> dict:
    if cold:
        drop_caches()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count())))
    done = subprocess.run([sys.executable, __file__, "--child", model, "--spawned-at", repr(time.time())],
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(name: str, model: str, files: list[Path], runs: list[dict], cat_s: float, cold: bool) -> dict:
    phases = {p: round(statistics.median(r["phases"][p] for r in runs), 3) for p in PHASES}
    ready = sum(phases[p] for p in PHASES if p != "first_token")
    w = runs[0]["weight_bytes"]
    peak_added = max(r["peak_rss"] - r["rss_before_weights"] for r in runs)
    out = {
        "model": model, "file_bytes": sum(f.stat().st_size for f in files), "weight_bytes": w,
        "page_cache": "cold" if cold else "warm", "phases_seconds_median": phases,
        "ready_seconds": round(ready, 3), "first_token_seconds": round(ready + phases["first_token"], 3),
        "cat_seconds": round(cat_s, 3), "ready_over_cat": round(ready / cat_s, 2),
        "peak_rss_bytes": max(r["peak_rss"] for r in runs),
        "peak_added_rss_over_weights": round(peak_added / w, 3),
        "runs": [{p: round(r["phases"][p], 3) for p in PHASES} for r in runs],
    }
    print(f"{name}: ready {ready:.2f} s (cat {cat_s:.2f} s, {out['ready_over_cat']:.1f}x), first token "
          f"{out['first_token_seconds']:.2f} s; added RSS {peak_added / 1e9:.2f} GB "
          f"({out['peak_added_rss_over_weights']:.2f} x W)")
    for p in PHASES:
        print(f"  {p:>16}: {phases[p]:7.3f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default="/tmp/llmservice-load-bench")
    ap.add_argument("--output", default=str(RESULTS / "load_time.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.spawned_at)))
        return
    llama = make_transformers_llama(Path(args.cache_dir) / "transformers-llama-1gb")
    from llmservice.server.model.registry import resolve_model_path

    gguf = resolve_model_path("builtin:smollm2-135m")
    cold = drop_caches()
    results: dict = {}
    for name, model, files in (("embedded_gguf", "builtin:smollm2-135m", [gguf]),
                               ("transformers_llama_1gb", str(llama), sorted(llama.glob("*.safetensors")))):
        if not cold:
            run_child(model, cold)  # the files into the page cache, for the runs and the cat alike
        runs = [run_child(model, cold) for _ in range(args.repeats)]
        cat_s = statistics.median(cat_seconds(files, cold) for _ in range(3))
        results[name] = summarize(name, model, files, runs, cat_s, cold)
    results["machine"] = {"cpu_count": os.cpu_count(), "device": "cpu",
                          "note": "ready = every phase before first_token; GGUF: Q4_1 matrices kept packed"}
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
