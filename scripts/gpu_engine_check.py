"""The engine on CUDA: Triton vs torch kernels, CUDA graphs vs eager, overlapped
scheduling on vs off, and swap/recompute preemption (graph replays under a tiny pool),
on a SmolLM2-shaped model with random weights (the GPU machine has no copy of the GGUF).

Random weights make greedy argmax fragile (small logit gaps), and the two kernel paths
round differently (Triton's fp32 dots use TF32), so the check reports agreement
figures and the logits' relative error rather than demanding identical tokens; the
exact-equality tests run on CPU in the test suite.

    python scripts/gpu_engine_check.py --model .gpu/models/smollm2-135m-shape --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.model.llama import score_tokens
from llmservice.server.model.loader import load_model

DEVICE = "cuda"  # --device cpu: a plumbing run here, with the torch path standing in for Triton


def use_kernels(name: str) -> None:
    os.environ["LLMSERVICE_KERNELS"] = name if DEVICE == "cuda" else "torch"


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(200, 40000, (int(torch.randint(20, 300, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]  # fmt: skip


def generate(loaded, kernels: str, **cfg) -> tuple[list[list[int]], LLMEngine]:
    use_kernels(kernels)
    config = dict(device=DEVICE, dtype="float32", max_model_len=1024, kv_cache_memory_gib=1.0, model="dummy")
    eng = LLMEngine.from_config(EngineConfig(**(config | cfg)), loaded=loaded)
    outs = eng.generate(prompts(12), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    return [o.token_ids for o in outs], eng


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Fraction of sequences identical, and mean length of the common prefix."""
    prefix = []
    for x, y in zip(a, b, strict=True):
        k = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
        prefix.append(k / max(len(x), 1))
    return {"identical": sum(x == y for x, y in zip(a, b, strict=True)) / len(a), "mean_common_prefix": sum(prefix) / len(prefix)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    report: dict = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__}
    out = Path(args.out) / "gpu-engine_check.json"
    t0 = time.time()

    def save():
        report["elapsed_s"] = time.time() - t0
        out.write_text(json.dumps(report, indent=2, default=str))

    loaded = load_model(args.model, torch.float32, load_format="dummy", device=DEVICE)
    for name, fn in [
        ("logits_triton_vs_torch", lambda: logits_check(loaded)),
        ("tokens_triton_vs_torch", lambda: kernel_paths(loaded)),
        ("graphs_vs_eager", lambda: graphs_vs_eager(loaded)),
        ("no_host_sync", lambda: no_host_sync(loaded)),
        ("preemption_modes", lambda: preemption(loaded)),
    ]:
        try:
            report[name] = fn()
        except Exception:  # the report says what broke; the next check still runs
            report[name] = {"error": traceback.format_exc(limit=6)}
        print(name, json.dumps(report[name], default=str)[:600], flush=True)
        save()
    os.environ.pop("LLMSERVICE_KERNELS", None)
    print(f"wrote {out}")


def logits_check(loaded) -> dict:
    from llmservice.server.model.llama import LlamaModel

    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaModel(loaded.config, loaded.weights, torch.device(DEVICE), dtype, 2048)
        ids = prompts(1, seed=3)[0] + prompts(1, seed=4)[0]
        logits = {}
        for k in ("torch", "triton"):
            use_kernels(k)
            logits[k] = score_tokens(model, ids).float()
        ref = logits["torch"]
        rel = ((logits["triton"] - ref).norm() / ref.norm()).item()
        res[str(dtype)] = {"tokens": len(ids), "rel_err": rel, "argmax_agree": (logits["triton"].argmax(-1) == ref.argmax(-1)).float().mean().item(),
                           "finite": bool(torch.isfinite(logits["triton"]).all())}  # fmt: skip
    return res


def kernel_paths(loaded) -> dict:
    tri, _ = generate(loaded, "triton")
    tor, _ = generate(loaded, "torch")
    return agreement(tri, tor)


def graphs_vs_eager(loaded) -> dict:
    """fp32: greedy tokens with CUDA graphs (the default) vs --enforce-eager, each with
    overlapped scheduling on and off; the graphed runs must have replayed graphs. Padding
    changes a GEMM's batch size (cuBLAS may pick another kernel) and the graphs size decode
    attention's splits from max_model_len, so fp32 rounding may differ from plain eager in
    the last bits: agreement is reported. `vs_static_eager` compares with the same padded
    inputs and split counts run without capture, which a replay must match exactly."""
    eager, eng_e = generate(loaded, "triton", enforce_eager=True, async_scheduling=False)
    res: dict = {"eager_replays": eng_e.runner.num_graph_replays}
    # the same padded static inputs and split counts run eagerly: a replay must match it exactly
    static_eager, _ = generate(loaded, "triton", enforce_eager=True, static_decode_inputs=True, async_scheduling=False)
    for name, cfg in {"graphs_sync": dict(async_scheduling=False), "graphs_async": dict(async_scheduling=True),
                      "eager_async": dict(enforce_eager=True, async_scheduling=True)}.items():  # fmt: skip
        toks, eng = generate(loaded, "triton", **cfg)
        res[name] = agreement(toks, eager) | {
            "vs_static_eager": agreement(toks, static_eager),
            "graph_replays": eng.runner.num_graph_replays, "static_steps": eng.runner.num_static_steps,
            "async": eng.async_scheduling, "free_blocks_after": eng.block_manager.num_free_blocks,
            "num_blocks": eng.block_manager.num_blocks,
            "captured_sizes": len(eng.runner.graphs.sizes) if eng.runner.graphs else 0,
            "capture_s": eng.runner.graphs.capture_seconds if eng.runner.graphs else 0.0,
        }  # fmt: skip
    return res


def _scheduled(rid: str, tokens: list[int], start: int, blocks: list[int], table_start: int):
    from llmservice.server.engine.step import ScheduledRequest

    return ScheduledRequest(rid, tokens, start, table_start, blocks, sample=True, output_index=0)


def no_host_sync(loaded) -> dict:
    """Launching a step makes no host synchronisation, for a mixed
    prefill + decode step and a pure-decode step, eager and replayed from a CUDA graph.
    torch.cuda.set_sync_debug_mode("error") raises at the first synchronising call
    (its message names it); the step's tokens are read after the mode is reset."""
    from llmservice.server.engine.runner import ModelRunner
    from llmservice.server.engine.step import SchedulerOutput
    from llmservice.server.model.llama import LlamaModel

    if DEVICE != "cuda":
        return {"skipped": "CUDA only"}
    use_kernels("triton")
    model = LlamaModel(loaded.config, loaded.weights, torch.device(DEVICE), torch.float32, 1024)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    res = {}
    for graphs in (False, True):
        runner = ModelRunner(model, 64, 16, 0, [1, 2, 4, 8] if graphs else None, 1024)
        if graphs:
            runner.capture_graphs()
        a, b = prompts(2, seed=7)
        first = runner.execute(SchedulerOutput(scheduled=[_scheduled("a", a, 0, list(range(0, 20)), 0)],
                                               new_requests={"a": greedy}))  # fmt: skip
        steps = {
            "mixed": SchedulerOutput(scheduled=[_scheduled("a", first.tokens["a"], len(a), [], 20),
                                                _scheduled("b", b, 0, list(range(20, 40)), 0)],
                                     new_requests={"b": greedy}),
        }  # fmt: skip
        out = {}
        for name, step in steps.items():
            out[name] = _launch_without_sync(runner, step)
        # both decode now (a at len(a) + 1, b at len(b)): a pure-decode step, padded to 2
        last = out["mixed"].get("tokens", {})
        if "a" in last and "b" in last:
            decode = SchedulerOutput(scheduled=[_scheduled("a", last["a"], len(a) + 1, [], 20),
                                                _scheduled("b", last["b"], len(b), [], 20)])  # fmt: skip
            out["decode"] = _launch_without_sync(runner, decode) | {"graph_replays": runner.num_graph_replays}
        res["graphs" if graphs else "eager"] = out
    return res


def _launch_without_sync(runner, step) -> dict:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = runner.submit(step)
        error = None
    except RuntimeError as exc:
        pending, error = None, str(exc)[:300]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    if pending is None:
        return {"synced": True, "error": error}
    return {"synced": False, "tokens": pending.result().tokens}


def preemption(loaded) -> dict:
    """A pool of 26 blocks (416 tokens) for 12 requests of up to ~320 tokens forces
    preemptions; CUDA graphs (and overlap) are on, so decode steps replay graphs between
    preemptions."""
    base, _ = generate(loaded, "triton")
    res = {}
    for mode in ("recompute", "swap", "auto"):
        toks, eng = generate(loaded, "triton", preemption_mode=mode, num_gpu_blocks_override=26, swap_space=0.5,
                             max_model_len=400)  # fmt: skip
        s = eng.scheduler.stats
        res[mode] = agreement(toks, base) | {"preemptions": s.num_preemptions, "swap_outs": s.num_swap_outs,
                                             "free_blocks_after": eng.block_manager.num_free_blocks,
                                             "graph_replays": eng.runner.num_graph_replays,
                                             "overlap_syncs": eng.overlap_syncs,
                                             "num_blocks": eng.block_manager.num_blocks}  # fmt: skip
        if mode == "auto":
            res[mode]["cost_model"] = vars(eng.preemption_costs)
    return res


if __name__ == "__main__":
    main()
