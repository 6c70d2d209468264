"""The engine loop: add_request / abort / step, and a synchronous generate() for offline use."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from llmservice.kernels.swap import copy_blocks, kv_pools
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine import memory
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.outputs import Detokenizer, RequestOutput
from llmservice.server.engine.request import Request, RequestStatus
from llmservice.server.engine.runner import ModelRunner
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler, SchedulerOutput
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace, fit_costs
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loaded import LoadedModel
from llmservice.server.model.loader import load_model
from llmservice.server.tokenizer import TextTokenizer

log = logging.getLogger("llmservice.engine")


class PromptTooLongError(ValueError):
    """prompt + max_tokens does not fit max_model_len (the server answers 400)."""


@dataclass
class StepStats:
    """What the last step did (for metrics: iteration tokens, step time)."""

    num_batched_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preempted: int = 0
    duration_s: float = 0.0
    finished: list[Request] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bf16 matmul is ~50x slower than fp32 on AVX2 CPUs (research/tooling.md)
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
        loaded: LoadedModel | None = None,
    ):
        """`loaded` lets tests and benchmarks build many engines from one parsed model."""
        self.config = config = config or EngineConfig()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        t0 = time.perf_counter()
        if loaded is None:
            loaded = load_model(
                config.model, torch.float32 if self.device.type == "cpu" else self.dtype, progress,
                load_format=config.load_format, device=self.device,
            )
        self.model_config = loaded.config
        self.tokenizer = TextTokenizer(loaded.tokenizer, loaded.config.eos_token_ids)
        self.config = config = config.resolve_lengths(loaded.config.max_position_embeddings)
        self.max_model_len = int(config.max_model_len)
        self.model = LlamaModel(loaded.config, loaded.weights, self.device, self.dtype, self.max_model_len)
        self.load_seconds = time.perf_counter() - t0
        self.memory_plan = self._plan_memory()
        log.info(self.memory_plan.describe())
        if self.memory_plan.num_blocks * config.block_size < self.max_model_len:
            raise ConfigError(
                f"the KV cache holds {self.memory_plan.num_blocks * config.block_size} tokens, fewer than "
                f"--max-model-len {self.max_model_len}; raise the KV memory or lower max-model-len"
            )
        self.block_manager = BlockManager(self.memory_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.runner = ModelRunner(self.model, self.block_manager, config.seed)
        self.swap_space, self.swap_pools = self._allocate_swap_space(kv_per_token_bytes=self.memory_plan.kv_bytes_per_token)
        self.preemption_costs = self._measure_preemption_costs() if config.preemption_mode == "auto" else PreemptionCosts()
        if config.preemption_mode == "auto":
            c = self.preemption_costs
            log.info(
                "preemption cost model: recompute %.3g s/token (prefill %.0f tok/s) vs swap %.3g s + %.3g s/token "
                "(copy %.2f GB/s)", c.recompute_s_per_token, c.prefill_tokens_per_s, c.swap_fixed_s,
                c.swap_s_per_token, c.copy_bytes_per_s / 1e9,
            )
        self.scheduler = Scheduler(config, self.block_manager, self.swap_space, self.preemption_costs)
        self.detokenizers: dict[str, Detokenizer] = {}
        self.last_step = StepStats()
        self._ids = itertools.count()

    @classmethod
    def from_config(
        cls,
        config: EngineConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
        loaded: LoadedModel | None = None,
    ) -> LLMEngine:
        """Load the model, plan memory, allocate the KV and swap pools, measure costs."""
        return cls(config, progress, loaded)

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    # ---- memory ----------------------------------------------------------------------
    def _plan_memory(self) -> memory.MemoryPlan:
        cfg = self.config
        kv_per_token = self.model_config.kv_bytes_per_token(torch.tensor([], dtype=self.dtype).element_size())
        weights = self.model.weight_bytes()
        if cfg.num_gpu_blocks_override:
            plan = memory.plan_cpu(1.0, weights, kv_per_token, cfg.block_size, self.max_model_len)
            plan.num_blocks = cfg.num_gpu_blocks_override
            plan.budget_source = f"num_gpu_blocks_override {cfg.num_gpu_blocks_override}"
            plan.device = self.device.type
            return plan
        if self.device.type == "cuda" and cfg.kv_cache_memory_gib is None:
            total = torch.cuda.mem_get_info(self.device)[1]
            return memory.plan_cuda(
                total, cfg.gpu_memory_utilization, weights, self._profile_activation_peak(),
                kv_per_token, cfg.block_size, self.max_model_len,
            )
        plan = memory.plan_cpu(cfg.kv_cache_memory_gib or 1.0, weights, kv_per_token, cfg.block_size, self.max_model_len)
        plan.device = self.device.type
        return plan

    def _profile_activation_peak(self) -> int:
        """Run one max-size prefill on a scratch KV pool and measure the memory beyond weights."""
        from llmservice.kernels.metadata import AttentionMetadata
        from llmservice.server.engine.runner import allocate_kv_caches

        n = min(int(self.config.max_num_batched_tokens), self.max_model_len)
        bs = self.config.block_size
        nblocks = -(-n // bs)
        caches = allocate_kv_caches(self.model, nblocks, bs)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, device=dev),
            block_tables=torch.arange(nblocks, dtype=torch.int32, device=dev)[None],
            seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
            query_lens=[n], seq_lens_host=[n], num_decodes=0, block_size=bs,
        )
        ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.model.forward(ids, torch.arange(n, device=dev), meta, caches, torch.arange(n, device=dev)[-1:])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del caches
        torch.cuda.empty_cache()
        return int(peak)

    # ---- swap ------------------------------------------------------------------------
    def _allocate_swap_space(self, kv_per_token_bytes: int) -> tuple[SwapSpace, list[torch.Tensor]]:
        """CPU pools mirroring the device pools, sized by --swap-space (only for swap/auto)."""
        cfg = self.config
        if cfg.preemption_mode == "recompute" or cfg.swap_space <= 0:
            return SwapSpace(0), []
        num_blocks = memory.blocks_for_budget(int(cfg.swap_space * memory.GIB), kv_per_token_bytes, cfg.block_size)
        pin = self.device.type == "cuda"
        pools = [
            torch.zeros((num_blocks, *pool.shape[1:]), dtype=pool.dtype, pin_memory=pin)
            for pool in kv_pools(self.runner.kv_caches)
        ]
        log.info("swap space: %d CPU blocks (%.2f GiB)", num_blocks, cfg.swap_space)
        return SwapSpace(num_blocks), pools

    def _measure_preemption_costs(self) -> PreemptionCosts:
        """Time prefills and block round trips at two sizes each, so `auto` compares
        this machine's real costs (fit_costs says how they are read)."""
        from llmservice.server.model.llama import score_tokens

        # A GPU needs sizes past launch overhead (prefills up to 1024 tokens, copies up to
        # 256 blocks) for the slopes to mean anything; on a CPU both are linear early.
        cuda = self.device.type == "cuda"
        bs = self.config.block_size

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

        n = min(1024 if cuda else 128, self.max_model_len, int(self.config.max_num_batched_tokens))
        ids = [(i * 7919) % self.model_config.vocab_size for i in range(n)]
        small = max(n // 8, 1)
        # a CPU needs no second warm-up: its cost is the time, and the small run warmed it
        prefill = tuple((k, timed(lambda k=k: score_tokens(self.model, ids[:k], bs), warm_up=cuda or k == small))
                        for k in (small, n))  # fmt: skip
        round_trip = None
        nblocks = min(256 if cuda else 16, self.block_manager.num_blocks, self.swap_space.num_blocks)
        if nblocks >= 2:
            device_pools = kv_pools(self.runner.kv_caches)

            def swap_round_trip(m: int) -> None:
                blocks = list(range(m))
                copy_blocks(device_pools, self.swap_pools, blocks, blocks).wait()
                copy_blocks(self.swap_pools, device_pools, blocks, blocks).wait()

            round_trip = tuple((m * bs, timed(lambda m=m: swap_round_trip(m))) for m in (1, nblocks))
        return fit_costs(prefill, round_trip, self.memory_plan.kv_bytes_per_token)

    def _do_swaps(self, sched: SchedulerOutput) -> None:
        device_pools = kv_pools(self.runner.kv_caches)
        if sched.swap_out:
            src, dst = zip(*sched.swap_out, strict=True)
            copy_blocks(device_pools, self.swap_pools, list(src), list(dst)).wait()
        if sched.swap_in:
            src, dst = zip(*sched.swap_in, strict=True)
            copy_blocks(self.swap_pools, device_pools, list(src), list(dst)).wait()

    @property
    def num_swapped(self) -> int:
        return len(self.scheduler.swapped)

    @property
    def swap_usage(self) -> float:
        """Fraction of the CPU swap pool in use (vllm:cpu_cache_usage_perc)."""
        return self.swap_space.usage

    @property
    def num_cpu_blocks(self) -> int:
        return self.swap_space.num_blocks

    # ---- requests --------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> Request:
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if max(ids) >= self.model_config.vocab_size or min(ids) < 0:
            raise ValueError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        n = len(ids)
        if params.max_tokens is None:
            if n >= self.max_model_len:
                raise PromptTooLongError(
                    f"the prompt has {n} tokens, but max_model_len is {self.max_model_len}"
                )
            max_tokens = self.max_model_len - n
        else:
            max_tokens = params.max_tokens
            if n + max_tokens > self.max_model_len:
                raise PromptTooLongError(
                    f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds "
                    f"max_model_len ({self.max_model_len}); shorten the prompt or lower max_tokens"
                )
        return Request(
            request_id=request_id or f"req-{next(self._ids)}",
            prompt_token_ids=ids,
            sampling_params=params,
            max_tokens=max_tokens,
            eos_token_ids=frozenset(self.tokenizer.eos_token_ids),
            priority=priority,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
        )

    def add_request(
        self,
        prompt: str | Sequence[int] | Request,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> Request:
        req = prompt if isinstance(prompt, Request) else self.make_request(prompt, params, request_id, priority, arrival_time)
        if req.request_id in self.scheduler.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.detokenizers[req.request_id] = Detokenizer(self.tokenizer, req)
        self.scheduler.add(req)
        return req

    def abort_request(self, request_id: str) -> bool:
        req = self.scheduler.abort(request_id)
        self.detokenizers.pop(request_id, None)
        return req is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ---- the loop ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        sched: SchedulerOutput = self.scheduler.schedule()
        stats = StepStats(num_preempted=len(sched.preempted))
        self._do_swaps(sched)
        if sched.is_empty:
            self.last_step = stats
            return []
        for req, n in sched.scheduled:
            # prompt tokens computed this step (recompute after preemption counts as prompt work)
            stats.num_prompt_tokens += max(0, min(req.num_prompt_tokens, req.num_computed_tokens + n) - req.num_computed_tokens)
        tokens, logprobs = self.runner.execute(sched)
        touched = self.scheduler.update(sched, tokens)
        stats.num_batched_tokens = sched.num_batched_tokens
        stats.num_generation_tokens = len(tokens)
        outputs = [self._make_output(req, logprobs.get(req.request_id)) for req in touched]
        stats.finished = [req for req in touched if req.is_finished]
        stats.duration_s = time.perf_counter() - t0
        self.last_step = stats
        return outputs

    def _make_output(self, req: Request, lp) -> RequestOutput:
        if lp is not None:
            req.logprobs.append(lp)
        detok = self.detokenizers.get(req.request_id)
        if detok is not None:
            detok.update(req)
            if detok.hit_stop is not None and not req.is_finished:
                req.stop_reason = detok.hit_stop
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        finished = req.is_finished
        new_text = detok.take_new_text(finished) if detok else ""
        if finished:
            self.detokenizers.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            new_token_ids=req.output_token_ids[-1:],
            text=detok.text if detok else "",
            new_text=new_text,
            finished=finished,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason,
            new_logprobs=[lp] if lp is not None else [],
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_preemptions=req.num_preemptions,
            arrival_time=req.arrival_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time,
            finish_time=req.finish_time,
        )

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Offline: run all prompts to completion; results in input order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        ids = []
        for prompt, sp in zip(prompts, params, strict=True):
            ids.append(self.add_request(prompt, sp).request_id)
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]


def default_threads() -> int:
    return len(os.sched_getaffinity(0))
