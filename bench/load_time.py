"""Model load time and peak host memory: the embedded GGUF and a sharded ~1 GB
safetensors model already on local disk (the Hub cache's state after a download).

Each measurement runs in a fresh subprocess that loads the model the way the engine does
(loader, then LlamaModel consuming the loaded tensors) and reads VmHWM (peak resident set)
from /proc/self/status. Reported: seconds, GB/s (weight bytes / load seconds), peak RSS,
and (peak RSS - RSS before loading) / weight bytes, against the bound the loader
promises: W + the largest shard. Files are read warm (in the page cache: the first,
unrecorded repeat reads them from disk).

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

# ~1 GB of fp32 weights: 248M parameters, saved into 5 shards
SHAPE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
SHARDS = 5


def status_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def measure(model: str) -> dict:
    """One load in this process (run as the child)."""
    import torch
    from llmservice.server.model.llama import LlamaModel
    from llmservice.server.model.loader import load_model

    torch.set_num_threads(1)
    before = status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    loaded = load_model(model, torch.float32)
    built = LlamaModel(loaded.config, loaded.weights, torch.device("cpu"), torch.float32, 2048, consume=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "weight_bytes": built.weight_bytes(), "rss_before": before,
            "peak_rss": status_kib("VmHWM") * 1024}


def make_sharded(folder: Path) -> Path:
    """Random weights of SHAPE in SHARDS safetensors files + index (once; reused after)."""
    if (folder / "model.safetensors.index.json").exists():
        return folder
    import torch
    from llmservice.server.model.config import ModelConfig
    from llmservice.server.model.dummy import dummy_weights
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    s = SHAPE
    config = ModelConfig("llama", s["num_hidden_layers"], s["hidden_size"], s["num_attention_heads"],
                         s["num_key_value_heads"], s["hidden_size"] // s["num_attention_heads"],
                         s["intermediate_size"], s["vocab_size"])
    weights = dummy_weights(config, torch.float32)
    names = list(weights)
    per = -(-len(names) // SHARDS)
    weight_map = {}
    for i in range(SHARDS):
        shard = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = {n: weights[n].contiguous() for n in names[i * per:(i + 1) * per]}
        save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": "float32", **SHAPE}))
    return folder


def run_child(model: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", model], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(name: str, model: str, runs: list[dict], largest_shard: int) -> dict:
    w = runs[0]["weight_bytes"]
    seconds = statistics.median(r["seconds"] for r in runs)
    peak = max(r["peak_rss"] for r in runs)
    added = max(r["peak_rss"] - r["rss_before"] for r in runs)
    out = {
        "model": model, "weight_bytes": w, "largest_shard_bytes": largest_shard,
        "load_seconds_median": round(seconds, 3), "load_seconds_runs": [round(r["seconds"], 3) for r in runs],
        "gb_per_s": round(w / 1e9 / seconds, 3),
        "peak_rss_bytes": peak, "rss_before_load_bytes": runs[0]["rss_before"],
        "peak_rss_over_weights": round(peak / w, 3),
        "peak_added_rss_over_weights": round(added / w, 3),
        "bound_weights_plus_largest_shard_over_weights": round((w + largest_shard) / w, 3),
        "within_bound": added <= w + largest_shard,
    }
    print(f"{name}: {w / 1e9:.2f} GB in {seconds:.2f} s = {out['gb_per_s']:.2f} GB/s; peak RSS {peak / 1e9:.2f} GB "
          f"({out['peak_rss_over_weights']:.2f} x W), added by loading {added / 1e9:.2f} GB "
          f"({out['peak_added_rss_over_weights']:.2f} x W; bound {out['bound_weights_plus_largest_shard_over_weights']:.2f} x W)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default="/tmp/llmservice-load-bench")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    sharded = make_sharded(Path(args.cache_dir) / "sharded-1gb")
    largest = max(p.stat().st_size for p in sharded.glob("*.safetensors"))
    from llmservice.server.model.registry import resolve_model_path

    gguf = resolve_model_path("builtin:smollm2-135m")
    results = {}
    for name, model, shard in (("embedded_gguf", "builtin:smollm2-135m", gguf.stat().st_size),
                               ("sharded_safetensors_1gb", str(sharded), largest)):
        run_child(model)  # warm-up: the files into the page cache
        runs = [run_child(model) for _ in range(args.repeats)]
        results[name] = summarize(name, model, runs, shard)
    results["machine"] = {"cpu_count": os.cpu_count(), "torch_threads": 1, "page_cache": "warm",
                          "note": "GGUF: Q4_1 file dequantized to fp32 weights (its 'shard' is the file)"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "load_time.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
