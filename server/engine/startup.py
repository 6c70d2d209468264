"""The expensive half of building an engine: device choice, the memory plan (a profiled
prefill on CUDA), the CPU swap pools, and timing the two preemption modes.

`LLMEngine.from_config` calls these; tests build a plain `LLMEngine` without them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from llmservice.kernels import kv_quant
from llmservice.kernels.swap import copy_blocks, kv_pools
from llmservice.server.config import CPU_KV_CACHE_GIB, ConfigError, EngineConfig
from llmservice.server.engine import memory, spec_draft, zero_pages
from llmservice.server.engine.cost_model import StepShape
from llmservice.server.engine.host_tier import available_host_bytes, check_offload_fits
from llmservice.server.engine.measure_key import measurement_key
from llmservice.server.engine.runner import allocate_kv_caches
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace, fit_costs
from llmservice.server.model.llama import LlamaModel, score_tokens

log = logging.getLogger("llmservice.engine")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bf16 matmul is far slower than fp32 on AVX2 CPUs (measured ~50x on our build machines)
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


FP8_KV_DEVICES = ("cpu", "cuda")  # the torch path on CPU, the Triton kernels on CUDA


def check_kv_cache_dtype(kv_cache_dtype: str, device: torch.device) -> None:
    """fp8 KV needs an attention path that reads e4m3 pools: the torch path (CPU) or the
    Triton kernels (CUDA); any other device would fail at the first step, so refuse it here."""
    if kv_quant.is_fp8(kv_cache_dtype) and device.type not in FP8_KV_DEVICES:
        raise ConfigError(
            f"--kv-cache-dtype {kv_cache_dtype} is not supported on {device.type}: 8-bit KV runs on "
            "cpu (torch attention path) and cuda (Triton kernels); use --kv-cache-dtype auto"
        )


def plan_memory(config: EngineConfig, model: LlamaModel) -> memory.MemoryPlan:
    """How many KV blocks to allocate: an override, the CUDA budget after a profiled
    prefill, or the explicit CPU budget (default CPU_KV_CACHE_GIB)."""
    check_kv_cache_dtype(config.kv_cache_dtype, model.device)
    # a draft model (speculative decoding) keeps its KV in the same blocks (spec_draft.py),
    # at the model's dtype whatever --kv-cache-dtype says
    kv_per_token = model.kv_bytes_per_token(kv_quant.element_bytes(config.kv_cache_dtype, model.dtype))
    kv_per_token += spec_draft.draft_kv_bytes_per_token(config, model)
    weights = model.weight_bytes() + spec_draft.draft_weight_bytes(config, model)
    max_model_len = int(config.max_model_len)
    device = model.device
    if config.num_gpu_blocks_override:
        plan = memory.plan_cpu(1.0, weights, kv_per_token, config.block_size, max_model_len)
        plan.num_blocks = config.num_gpu_blocks_override
        plan.budget_source = f"num_gpu_blocks_override {config.num_gpu_blocks_override}"
        plan.device = device.type
        return plan
    if device.type == "cuda" and config.kv_cache_memory_gib is None:
        total = torch.cuda.mem_get_info(device)[1]
        return memory.plan_cuda(
            total, config.gpu_memory_utilization, weights, profile_activation_peak(config, model),
            kv_per_token, config.block_size, max_model_len,
        )
    plan = memory.plan_cpu(config.kv_cache_memory_gib or CPU_KV_CACHE_GIB, weights, kv_per_token, config.block_size, max_model_len)
    plan.device = device.type
    return plan


def profile_activation_peak(config: EngineConfig, model: LlamaModel) -> int:
    """Run one max-size prefill on a scratch KV pool and measure the memory beyond weights."""
    from llmservice.kernels.metadata import AttentionMetadata

    n = min(int(config.max_num_batched_tokens), int(config.max_model_len))
    bs = config.block_size
    nblocks = -(-n // bs)
    caches = allocate_kv_caches(model, nblocks, bs)
    dev = model.device
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=dev),
        block_tables=torch.arange(nblocks, dtype=torch.int32, device=dev)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
        query_lens=[n], seq_lens_host=[n], num_decodes=0, block_size=bs,
    )
    ids = torch.zeros(n, dtype=torch.int64, device=dev)
    model.forward(ids, torch.arange(n, device=dev), meta, caches, torch.arange(n, device=dev)[-1:])
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(dev) - base
    del caches
    torch.cuda.empty_cache()
    return int(peak)


def allocate_swap_space(
    config: EngineConfig, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], kv_per_token_bytes: int
) -> tuple[SwapSpace, list[torch.Tensor]]:
    """CPU pools mirroring the device pools, one host pool shared by swap preemption
    (--swap-space, only for swap/auto) and the prefix cache's host tier (--kv-offloading-size)."""
    swap_gib = 0.0 if config.preemption_mode == "recompute" else config.swap_space
    host_gib = swap_gib + config.kv_offloading_size
    if host_gib <= 0:
        return SwapSpace(0), []
    check_offload_fits(config.kv_offloading_size, swap_gib, available_host_bytes())
    num_blocks = memory.blocks_for_budget(int(host_gib * memory.GIB), kv_per_token_bytes, config.block_size)
    device_pools = kv_pools(kv_caches)
    pin = device_pools[0].device.type == "cuda"
    pools = [
        torch.zeros((num_blocks, *pool.shape[1:]), dtype=pool.dtype, pin_memory=True) if pin
        else zero_pages.zeros((num_blocks, *pool.shape[1:]), pool.dtype)
        for pool in device_pools
    ]
    log.info("host KV pool: %d blocks (%.2f GiB: swap %.2f, prefix host tier %.2f)",
             num_blocks, host_gib, swap_gib, config.kv_offloading_size)
    return SwapSpace(num_blocks), pools


def measure_preemption_costs(
    config: EngineConfig,
    model: LlamaModel,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    swap_pools: list[torch.Tensor],
    num_device_blocks: int,
    num_swap_blocks: int,
    kv_bytes_per_token: int,
    prefill: tuple[tuple[int, float], ...] | None = None,
    device_blocks: list[int] | None = None,
    swap_blocks: list[int] | None = None,
) -> PreemptionCosts:
    """Time prefills and block round trips (when there is swap space) at two sizes each,
    so `auto` compares this machine's real costs (fit_costs says how they are read) and
    the advisor can price a preemption (exported as llmservice:preemption_* gauges).
    `prefill`: two (tokens, seconds) prefills already timed (the step-cost profile's,
    see `profiled_prefills`), so start-up does not time prefills twice. `device_blocks`,
    `swap_blocks`: the blocks a round trip may copy (free ones; by default the first)."""
    # A GPU needs sizes past launch overhead (prefills up to 1024 tokens, copies up to
    # 256 blocks) for the slopes to mean anything; on a CPU both are linear early.
    cuda = model.device.type == "cuda"
    bs = config.block_size

    def timed(fn, warm_up: bool = True) -> float:
        # The warm-up runs at the timed size: first use compiles kernel variants and
        # allocates pinned staging buffers (cudaHostAlloc, ms each, cached afterwards;
        # an H200 run that timed them read 17 MB/s instead of GB/s).
        if warm_up:
            fn()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return max(time.perf_counter() - t0, 1e-9)

    if prefill is None:
        prefill = timed_prefills(config, model, timed, cuda)
    round_trip = None
    nblocks = min(256 if cuda else 16, num_device_blocks, num_swap_blocks)
    if nblocks >= 2:
        device_pools = kv_pools(kv_caches)

        def swap_round_trip(m: int) -> None:
            src = device_blocks[:m] if device_blocks is not None else list(range(m))
            dst = swap_blocks[:m] if swap_blocks is not None else list(range(m))
            copy_blocks(device_pools, swap_pools, src, dst).wait()
            copy_blocks(swap_pools, device_pools, dst, src).wait()

        round_trip = tuple((m * bs, timed(lambda m=m: swap_round_trip(m))) for m in (1, nblocks))
    costs = fit_costs(prefill, round_trip, kv_bytes_per_token)
    if costs.swap_measured:
        log.info(
            "preemption cost model: recompute %.3g s/token (prefill %.0f tok/s) vs swap %.3g s + %.3g s/token "
            "(copy %.2f GB/s)", costs.recompute_s_per_token, costs.prefill_tokens_per_s, costs.swap_fixed_s,
            costs.swap_s_per_token, costs.copy_bytes_per_s / 1e9,
        )  # fmt: skip
    else:
        log.info("preemption cost model: recompute %.3g s/token (prefill %.0f tok/s); no swap space",
                 costs.recompute_s_per_token, costs.prefill_tokens_per_s)  # fmt: skip
    return costs


def timed_prefills(config: EngineConfig, model: LlamaModel, timed: Callable[..., float],
                   cuda: bool) -> tuple[tuple[int, float], ...]:
    """Two scored prefills, (tokens, seconds), when no step-cost profile ran."""
    n = min(1024 if cuda else 128, int(config.max_model_len), int(config.max_num_batched_tokens))
    ids = [(i * 7919) % model.config.vocab_size for i in range(n)]
    small = max(n // 8, 1)
    bs = config.block_size
    key = measurement_key(model, n, bs)
    if key not in _PREFILL_TIMINGS:  # once per process (tests and benchmarks build many engines)
        # a CPU needs no second warm-up: its cost is the time, and the small run warmed it
        _PREFILL_TIMINGS[key] = tuple(
            (k, timed(lambda k=k: score_tokens(model, ids[:k], bs), warm_up=cuda or k == small))
            for k in (small, n)
        )
    return _PREFILL_TIMINGS[key]


def profiled_prefills(samples: list[tuple[StepShape, float]]) -> tuple[tuple[int, float], ...] | None:
    """The step-cost profile's prefill-only steps of the smallest and largest size, as
    (tokens, seconds): a recompute is such a prefill through the same runner, so these
    price it without timing prefills again. None without two such sizes."""
    prefills: dict[int, float] = {}
    for shape, seconds in samples:
        if shape.decode_tokens == 0 and shape.prefill_tokens > 0:
            prefills.setdefault(shape.prefill_tokens, seconds)
    if len(prefills) < 2:
        return None
    low, high = min(prefills), max(prefills)
    return (low, prefills[low]), (high, prefills[high])


_PREFILL_TIMINGS: dict[tuple, tuple[tuple[int, float], ...]] = {}
