"""Start-up breakdown: from 'process started' to 'first token', phase by phase, for the
embedded GGUF and a random ~1 GB sharded-safetensors Llama saved by transformers, against
the time to read the same files (`cat` to /dev/null).

Each run is a fresh subprocess that builds the engine the way `serve`'s engine core does
(`LLMEngine.from_config(..., defer_warm_up=True)`), one phase at a time, so each phase
gets its own clock: process start (exec to the first line of Python), imports, tokenizer
+ config (the model metadata and the tokenizer built from it), weight read (the loader),
weight placement (LlamaModel: device copy, fusing, packing), KV pool (memory plan + engine
with its pools), warm-up (what runs before ready: nothing on CPU; CUDA graphs on a GPU),
first token (one greedy request of a 16-token prompt, right after ready). After it, the
deferred start-up measurements (step-cost profile + preemption prices, warm_up.py) are
timed too, as the core runs them once idle; they are not part of ready. Peak RSS (VmHWM)
is recorded too.

Then the real thing, `llmservice serve` (API process + engine-core process, both on the
same cores): seconds from exec to `/ready` answering 200, and to the first completion.
Last, sleep mode on one `serve --enable-sleep-mode`: from `POST /wake_up` after a level-1
sleep to the first completion, against the cold `serve`'s exec to first completion.

The page cache: every run (and every `cat`) starts cold. Where /proc/sys/vm/drop_caches
is writable it is used; otherwise the model's own files are evicted with
POSIX_FADV_DONTNEED (no privilege needed), and the JSON says which. `--warm` keeps the
files cached instead (one unrecorded run first) for both.

    .venv/bin/python bench/load_time.py [--repeats 3] [--cache-dir /tmp/llmservice-load-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

# ~1 GB of fp32 weights: 248M parameters; transformers shards it at 250 MB
SHAPE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
SHARD_SIZE = "250MB"
PHASES = ("process_start", "imports", "tokenizer", "weight_read", "weight_placement", "kv_pool", "warm_up",
          "first_token")
AFTER_READY = ("deferred_warm_up",)


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

    try:  # as `serve` does before it spawns the engine core (a checkout without it: no prefetch)
        from llmservice.server.model.prefetch import prefetch_weights
    except ImportError:
        prefetch_weights = None
    if prefetch_weights is not None:
        prefetch_weights(model)
    import torch
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine import startup
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams
    from llmservice.server.engine.warm_up import WarmUp
    from llmservice.server.model.llama import LlamaModel
    from llmservice.server.model.loader import load_model, read_model_info
    from llmservice.server.tokenizer import TextTokenizer
    mark("imports")
    config = EngineConfig(model=model, device="cpu", max_model_len=2048)
    _, info, source = read_model_info(model)
    tokenizer = TextTokenizer(source, info.eos_token_ids)
    mark("tokenizer")
    rss_before = status_kib("VmRSS") * 1024
    loaded = load_model(model, torch.float32, device=torch.device("cpu"), cpu_weights=config.cpu_weights)
    mark("weight_read")
    config = config.resolve_lengths(loaded.config.max_position_embeddings)
    built = LlamaModel(loaded.config, loaded.weights, torch.device("cpu"), torch.float32, 2048, consume=True)
    mark("weight_placement")
    plan = startup.plan_memory(config, built)
    engine = LLMEngine(config, built, tokenizer, plan, 0.0)
    mark("kv_pool")
    engine.warm_up = WarmUp(engine)  # deferred, as serve's engine core builds it (CPU: no graphs)
    mark("warm_up")
    engine.add_request(list(range(1, 17)), SamplingParams(temperature=0.0, max_tokens=1), "first")
    while engine.has_unfinished_requests():
        engine.step()
    mark("first_token")
    peak_ready = status_kib("VmHWM") * 1024
    engine.warm_up.run()
    mark("deferred_warm_up")
    return {"phases": marks, "weight_bytes": built.weight_bytes(), "rss_before_weights": rss_before,
            "peak_rss": peak_ready, "peak_rss_after_warm_up": status_kib("VmHWM") * 1024}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_serve(model: str, *extra: str) -> tuple[subprocess.Popen, str, float]:
    """`llmservice serve MODEL` started and polled until /ready == 200: the process, its URL
    and the seconds from exec to ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = Path(sys.executable).with_name("llmservice")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(cli), "serve", model, "--port", str(port), "--host", "127.0.0.1", "--device", "cpu",
                             "--max-model-len", "2048", "--log-level", "warning", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"serve {model} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=5) as answer:
                if answer.status == 200:
                    return proc, url, time.perf_counter() - t0
        except OSError:
            time.sleep(0.02)
        if time.perf_counter() - t0 > 900:
            stop(proc)
            raise RuntimeError(f"serve {model} not ready in 900 s")


def post(url: str, payload: dict | None = None) -> dict:
    body = json.dumps(payload or {}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.load(answer)


def first_completion(url: str, model: str) -> None:
    post(url + "/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 1,
                                   "temperature": 0})


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_seconds(model: str, files: list[Path], cold: bool) -> dict:
    """`llmservice serve MODEL` from exec to /ready == 200 and to a first completion."""
    if cold:
        make_cold(files)
    t0 = time.perf_counter()
    proc, url, ready = start_serve(model)
    try:
        first_completion(url, model)
        return {"ready": ready, "first_token": time.perf_counter() - t0}
    finally:
        stop(proc)


def wake_seconds(model: str, repeats: int) -> list[float]:
    """Sleep mode on one `serve --enable-sleep-mode`: seconds from a level-1 sleep's end to
    the first completion after `POST /wake_up` (the wake-up call, then the request), each
    repeat on the same server."""
    proc, url, _ = start_serve(model, "--enable-sleep-mode")
    try:
        first_completion(url, model)
        seconds = []
        for _ in range(repeats):
            post(url + "/sleep?level=1")
            t0 = time.perf_counter()
            post(url + "/wake_up")
            first_completion(url, model)
            seconds.append(time.perf_counter() - t0)
        return seconds
    finally:
        stop(proc)


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


def evict(files: list[Path]) -> None:
    """The files' pages out of the page cache (clean pages: the files were synced)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_cold(files: list[Path]) -> str:
    """Start cold: the whole page cache dropped where this process may, else the model's
    files evicted. Which of the two, for the JSON."""
    if drop_caches():
        return "cold (drop_caches)"
    evict(files)
    return "cold (the model's files evicted with POSIX_FADV_DONTNEED)"


def cat_seconds(files: list[Path], cold: bool) -> float:
    if cold:
        make_cold(files)
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run_child(model: str, files: list[Path], cold: bool) -> dict:
    if cold:
        make_cold(files)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count())))
    done = subprocess.run([sys.executable, __file__, "--child", model, "--spawned-at", repr(time.time())],
                          capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(name: str, model: str, files: list[Path], runs: list[dict], cat_s: float, page_cache: str,
              serves: list[dict]) -> dict:
    phases = {p: round(statistics.median(r["phases"][p] for r in runs), 3) for p in PHASES + AFTER_READY}
    ready = sum(phases[p] for p in PHASES if p != "first_token")
    w = runs[0]["weight_bytes"]
    peak_added = max(r["peak_rss"] - r["rss_before_weights"] for r in runs)
    out = {
        "model": model, "file_bytes": sum(f.stat().st_size for f in files), "weight_bytes": w,
        "page_cache": page_cache, "phases_seconds_median": phases,
        "ready_seconds": round(ready, 3), "first_token_seconds": round(ready + phases["first_token"], 3),
        "cat_seconds": round(cat_s, 3), "ready_over_cat": round(ready / cat_s, 2),
        "peak_rss_bytes": max(r["peak_rss"] for r in runs),
        "peak_rss_after_warm_up_bytes": max(r["peak_rss_after_warm_up"] for r in runs),
        "peak_added_rss_over_weights": round(peak_added / w, 3),
        "runs": [{p: round(r["phases"][p], 3) for p in PHASES + AFTER_READY} for r in runs],
        "serve_ready_seconds": round(statistics.median(r["ready"] for r in serves), 3),
        "serve_first_token_seconds": round(statistics.median(r["first_token"] for r in serves), 3),
        "serve_ready_over_cat": round(statistics.median(r["ready"] for r in serves) / cat_s, 2),
        "serve_runs": [{k: round(v, 3) for k, v in r.items()} for r in serves],
    }
    print(f"{name}: ready {ready:.2f} s (cat {cat_s:.2f} s, {out['ready_over_cat']:.1f}x), first token "
          f"{out['first_token_seconds']:.2f} s; added RSS {peak_added / 1e9:.2f} GB "
          f"({out['peak_added_rss_over_weights']:.2f} x W)")
    for p in PHASES + AFTER_READY:
        print(f"  {p:>16}: {phases[p]:7.3f} s")
    print(f"  llmservice serve: ready {out['serve_ready_seconds']:.2f} s ({out['serve_ready_over_cat']:.1f}x cat), "
          f"first token {out['serve_first_token_seconds']:.2f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default="/tmp/llmservice-load-bench")
    ap.add_argument("--output", default=str(RESULTS / "load_time.json"))
    ap.add_argument("--warm", action="store_true", help="keep the files in the page cache instead")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.spawned_at)))
        return
    llama = make_transformers_llama(Path(args.cache_dir) / "transformers-llama-1gb")
    from llmservice.server.model.registry import resolve_model_path

    gguf = resolve_model_path("builtin:smollm2-135m")
    cold = not args.warm
    results: dict = {}
    for name, model, files in (("embedded_gguf", "builtin:smollm2-135m", [gguf]),
                               ("transformers_llama_1gb", str(llama), sorted(llama.glob("*.safetensors")))):
        page_cache = make_cold(files) if cold else "warm"
        if not cold:
            run_child(model, files, cold)  # the files into the page cache, for the runs and the cat alike
        runs = [run_child(model, files, cold) for _ in range(args.repeats)]
        serves = [serve_seconds(model, files, cold) for _ in range(args.repeats)]
        cat_s = statistics.median(cat_seconds(files, cold) for _ in range(3))
        results[name] = summarize(name, model, files, runs, cat_s, page_cache, serves)
        wakes = wake_seconds(model, args.repeats)
        wake = statistics.median(wakes)
        results[name].update(wake_to_first_token_seconds=round(wake, 3), wake_runs=[round(w, 3) for w in wakes],
                             cold_over_wake=round(results[name]["serve_first_token_seconds"] / wake, 1))
        print(f"  wake-up to first token: {wake:.2f} s ({results[name]['cold_over_wake']}x faster than a cold serve)")
    results["machine"] = {"cpu_count": os.cpu_count(), "device": "cpu",
                          "note": "ready = every phase before first_token (the deferred warm-up runs after "
                                  "ready); serve = the real two-process server; GGUF: Q4_1 matrices kept packed"}
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
