"""Helpers shared by the seed-claim benchmarks: one parsed model, a timed driver, plots."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.startup import resolve_device, resolve_dtype
from llmservice.server.loadgen.stats import percentile
from llmservice.server.model.loader import load_model

RESULTS = Path(__file__).parent / "results"
_LOADED = None


@dataclass
class ModelChoice:
    """Which model the benchmark engines run, and where (set from --model/--device/...)."""

    model: str = "builtin:smollm2-135m"
    load_format: str = "auto"
    device: str = "auto"
    dtype: str = "auto"


CHOICE = ModelChoice()


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """--model/--load-format/--device/--dtype/--out: the GPU runs use an 8B-shaped dummy model."""
    ap.add_argument("--model", default=CHOICE.model, help="builtin:NAME, a .gguf file or an HF directory")
    ap.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                    help="dummy: random weights of the model's shape (config + tokenizer only)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")


def setup(threads: int | None = None, args: argparse.Namespace | None = None):
    """Load the model once; `args` from add_model_args choose which and where."""
    global _LOADED, RESULTS
    if args is not None:
        CHOICE.model, CHOICE.load_format = args.model, args.load_format
        CHOICE.device, CHOICE.dtype = args.device, args.dtype
        if args.out:
            RESULTS = Path(args.out)
    if threads:
        torch.set_num_threads(threads)
    if _LOADED is None:
        device, dtype = device_and_dtype()
        _LOADED = load_model(CHOICE.model, dtype, load_format=CHOICE.load_format, device=device)
    return _LOADED


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    """As the engine resolves them (weights stay float32 on CPU)."""
    device = resolve_device(CHOICE.device)
    return device, torch.float32 if device.type == "cpu" else resolve_dtype(CHOICE.dtype, device)


def on_gpu() -> bool:
    return resolve_device(CHOICE.device).type == "cuda"


def result_path(name: str, suffix: str = ".json") -> Path:
    """bench/results/NAME.json, or gpu-NAME.json for a GPU run (both kept side by side)."""
    return RESULTS / f"{'gpu-' if on_gpu() else ''}{name}{suffix}"


def engine(**overrides) -> LLMEngine:
    overrides.setdefault("max_model_len", 4096)
    overrides.setdefault("device", CHOICE.device)
    overrides.setdefault("dtype", CHOICE.dtype)
    overrides.setdefault("model", CHOICE.model)
    return LLMEngine.from_config(EngineConfig(**overrides), loaded=setup())


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


@dataclass
class Trace:
    """Per-request token timestamps from a driven run."""

    arrivals: dict[str, float] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    max_running: int = 0
    running_samples: list[int] = field(default_factory=list)
    # (step seconds, running) for steps that left requests waiting: demand exceeded
    # what the KV pool admitted, so `running` there measures capacity, not demand
    saturated_steps: list[tuple[float, int]] = field(default_factory=list)
    elapsed: float = 0.0
    output_tokens: int = 0

    def ttft(self) -> list[float]:
        return [t[0] - self.arrivals[r] for r, t in self.token_times.items() if t]

    def itl(self) -> list[float]:
        return [b - a for t in self.token_times.values() for a, b in zip(t, t[1:], strict=False)]

    def latency(self) -> list[float]:
        return [t[-1] - self.arrivals[r] for r, t in self.token_times.items() if t]


def drive(eng: LLMEngine, schedule: list[tuple[float, list[int], SamplingParams]], on_step: Callable | None = None) -> Trace:
    """Run the engine; each (offset_s, prompt, params) is added once offset_s has elapsed."""
    trace = Trace()
    pending = sorted(schedule, key=lambda x: x[0])
    t0 = time.perf_counter()
    i = 0
    while i < len(pending) or eng.has_unfinished_requests():
        now = time.perf_counter() - t0
        while i < len(pending) and pending[i][0] <= now:
            _, prompt, sp = pending[i]
            req = eng.add_request(prompt, sp, request_id=f"r{i}")
            trace.arrivals[req.request_id] = time.perf_counter()
            trace.token_times[req.request_id] = []
            i += 1
        if not eng.has_unfinished_requests():
            time.sleep(min(0.01, max(0.0, pending[i][0] - now)))
            continue
        started = time.perf_counter()
        outs = eng.step()
        stamp = time.perf_counter()
        trace.max_running = max(trace.max_running, eng.num_running)
        trace.running_samples.append(eng.num_running)
        if eng.num_waiting:
            trace.saturated_steps.append((stamp - started, eng.num_running))
        for out in outs:
            trace.token_times[out.request_id].extend([stamp] * len(out.new_token_ids))
            trace.output_tokens += len(out.new_token_ids)
        if on_step:
            on_step(eng)
    trace.elapsed = time.perf_counter() - t0
    return trace


def saturated_mean_running(trace: Trace) -> float:
    """Time-weighted mean of running requests over the steps where others were waiting."""
    total = sum(d for d, _ in trace.saturated_steps)
    return sum(d * n for d, n in trace.saturated_steps) / total if total else 0.0


def summary(trace: Trace) -> dict:
    return {
        "elapsed_s": trace.elapsed,
        "output_tokens": trace.output_tokens,
        "output_tok_per_s": trace.output_tokens / trace.elapsed if trace.elapsed else 0.0,
        "max_running": trace.max_running,
        "mean_running": statistics.fmean(trace.running_samples) if trace.running_samples else 0.0,
        "saturated_mean_running": saturated_mean_running(trace),
        "ttft_p50_s": percentile(trace.ttft(), 50),
        "ttft_p99_s": percentile(trace.ttft(), 99),
        "itl_p50_s": percentile(trace.itl(), 50),
        "itl_p99_s": percentile(trace.itl(), 99),
        "latency_p50_s": percentile(trace.latency(), 50),
        "latency_p99_s": percentile(trace.latency(), 99),
        "latency_mean_s": statistics.fmean(trace.latency()) if trace.latency() else float("nan"),
    }


def write(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if on_gpu():
        machine |= {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    machine |= {"model": CHOICE.model, "load_format": CHOICE.load_format}
    # 1/5/15-minute load when written: figures taken beside other work are noisy
    machine |= {"load_average": os.getloadavg()}
    result.setdefault("machine", machine)
    path = result_path(name)
    path.write_text(json.dumps(result, indent=2, default=float))
    print(f"wrote {path}")
    return path


def bar_plot(name: str, title: str, panels: dict[str, dict[str, float]], columns: int = 4) -> Path:
    """One bar chart per metric: panels = {metric: {variant: value}}, at most `columns` a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(len(panels), columns)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (metric, values) in zip(axes, panels.items(), strict=False):
        ax.bar(list(values), list(values.values()), color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(values)])
        ax.set_title(metric, fontsize=10)
        for x, v in enumerate(values.values()):
            ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = result_path(name, ".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
