"""The engine loop: add_request / abort / step, and a synchronous generate() for offline use."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from llmservice.kernels.swap import copy_blocks, kv_pools
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine import (
    cuda_graphs,
    memory,
    overlap,
    spec_decode,
    startup,
    step_profile,
)
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.cost_model import StepCostModel, StepShape
from llmservice.server.engine.grammar import GrammarCompilerService, GrammarStates
from llmservice.server.engine.host_tier import HostTier
from llmservice.server.engine.outputs import Delta, Detokenizer, RequestOutput
from llmservice.server.engine.request import Request, RequestStatus, TokenLogprob
from llmservice.server.engine.runner import ModelRunner, StepResult
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.step import SchedulerOutput
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace
from llmservice.server.engine.tp_executor import TPExecutor, build_tp_engine
from llmservice.server.engine.warm_up import WarmUp
from llmservice.server.lora.adapter import LoRAAdapterError
from llmservice.server.lora.manager import LoRAManager
from llmservice.server.lora.modules import check_lora_name_or_raise, parse_lora_modules
from llmservice.server.lora.weights import lora_weights_for
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loaded import LoadedModel
from llmservice.server.model.loader import load_model
from llmservice.server.tokenizer import TextTokenizer

log = logging.getLogger("llmservice.engine")


class PromptTooLongError(ValueError):
    """prompt + max_tokens does not fit max_model_len (the server answers 400)."""


class UnknownAdapterError(ValueError):
    """A request names a LoRA adapter the engine does not serve (the server answers 404)."""


# An empty step while grammars compile waits this long for one (releasing the GIL): a
# step loop spinning on "not ready yet" starved the compile thread, and a first
# structured request took 140 s on 2 cores instead of seconds.
GRAMMAR_WAIT_S = 0.005


@dataclass
class StepStats:
    """What the last step did (for metrics: iteration tokens, step time)."""

    num_batched_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preempted: int = 0
    duration_s: float = 0.0
    kind: str = ""  # "decode" (no prompt token), "prefill" (no decode), "mixed"; "" when empty
    target_s: float | None = None  # the step-time budget's target (None: no time limit)
    predicted_s: float = 0.0  # the cost model's prediction when the step was planned


@dataclass
class _InFlight:
    """A step launched by overlapped scheduling whose tokens are not read yet."""

    sched: SchedulerOutput
    pending: overlap.PendingStep
    launched_at: float
    stats: StepStats


def decode_graph_plan(config: EngineConfig, device: torch.device) -> tuple[bool, list[int]]:
    """(capture CUDA graphs?, the padded decode sizes for the static inputs; [] = none).
    Graphs: CUDA, the Triton kernels, one rank, unless --enforce-eager. Static inputs:
    with graphs, or where --static-decode-inputs asks (CPU tests of the same path)."""
    from llmservice.kernels import ops

    triton = device.type == "cuda" and ops.backend_for(torch.empty(0, device=device)) == "triton"
    if device.type == "cuda" and not triton and not config.enforce_eager:
        log.warning("CUDA graphs are off: LLMSERVICE_KERNELS selects the torch kernels, which sync the host")
    graphs = device.type == "cuda" and triton and not config.enforce_eager and config.tensor_parallel_size == 1
    static = graphs if config.static_decode_inputs is None else bool(config.static_decode_inputs)
    if graphs and not static:
        raise ConfigError("CUDA graphs replay the static decode inputs: drop --no-static-decode-inputs or add "
                          "--enforce-eager")  # fmt: skip
    sizes = cuda_graphs.sizes_to_capture(config.max_cudagraph_capture_size, config.max_num_seqs) if static else []
    return graphs, sizes


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model: LlamaModel,
        tokenizer: TextTokenizer,
        memory_plan: memory.MemoryPlan,
        load_seconds: float = 0.0,
        runner: TPExecutor | None = None,
    ):
        """Cheap: wires the parts around an already-built model and a memory plan (the KV
        and swap pools are allocated here). `from_config` does the loading and measuring."""
        if config.max_model_len is None or config.max_num_batched_tokens is None:
            raise ValueError(
                "LLMEngine needs a config with resolved lengths (EngineConfig.resolve_lengths)"
            )
        self.config = config
        self.model = model
        self.model_config = model.config
        self.device = model.device
        self.dtype = model.dtype
        self.tokenizer = tokenizer
        self.max_model_len = int(config.max_model_len)
        self.memory_plan = memory_plan
        self.load_seconds = load_seconds
        self.detokenize_seconds = 0.0  # cumulative (llmservice:detokenize_seconds_total)
        num_blocks = memory_plan.num_blocks
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.capture_graphs, decode_sizes = decode_graph_plan(config, model.device) if runner is None else (False, [])
        if runner is None:
            self.runner = ModelRunner(
                model, num_blocks, config.block_size, config.seed, decode_sizes, self.max_model_len,
                config.kv_cache_dtype,
            )
            self.swap_space, self.swap_pools = startup.allocate_swap_space(
                config, self.runner.kv_caches, memory_plan.kv_bytes_per_token
            )
            if config.kv_offloading_size > 0:
                self.block_manager.host_tier = HostTier(
                    self.swap_space,
                    memory.blocks_for_budget(
                        int(config.kv_offloading_size * memory.GIB), memory_plan.kv_bytes_per_token, config.block_size
                    ),
                )
        else:  # tensor-parallel ranks (tp_executor.py) hold the KV and swap pools
            self.runner = runner
            self.swap_space, self.swap_pools = SwapSpace(runner.num_swap_blocks), []
        self.cost_model = StepCostModel()
        self.scheduler = Scheduler(
            config,
            self.block_manager,
            self.swap_space,
            PreemptionCosts(),
            cost_model=self.cost_model,
        )
        # Structured outputs: compiles off the step loop; the scheduler skips a request
        # whose grammar is still compiling (Scheduler._can_admit asks admission_gate).
        self.grammars = GrammarStates(GrammarCompilerService(tokenizer, model.config.vocab_size))
        self.scheduler.admission_gate = self._can_start
        # --enable-lora: the slot pool on the model, the host LRU and the loader thread
        self.lora: LoRAManager | None = None
        if config.enable_lora:
            if model.lora is None:
                model.lora = lora_weights_for(config, model)
            self.lora = LoRAManager(model.lora, model.config, self.model_name,
                                    config.max_cpu_loras or config.max_loras)  # fmt: skip
            self.scheduler.lora_slots = self.lora.slots
        self.detokenizers: dict[str, Detokenizer] = {}
        self.last_step = StepStats()
        self._ids = itertools.count()
        # --speculative-config: drafts proposed after each step (spec_decode.py)
        self.speculator = spec_decode.make_speculator(config, self.max_model_len, model, num_blocks)
        # --async-scheduling (overlap.py): plan step N+1 while step N runs
        try:
            self.async_scheduling = overlap.resolve_async_scheduling(
                config.async_scheduling, model.device.type, self.speculator is not None, config.tensor_parallel_size
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.launcher = (
            overlap.InlineLauncher() if model.device.type == "cuda" or not self.async_scheduling
            else overlap.ThreadLauncher()
        )  # fmt: skip
        self._in_flight: _InFlight | None = None
        self.warm_up: WarmUp | None = None  # the start-up measurements (from_config sets it)
        self._last_resolved_at = 0.0
        self.overlap_syncs: dict[str, int] = {}  # steps that waited for the one in flight, by reason

    @classmethod
    def from_config(
        cls,
        config: EngineConfig | None = None,
        progress: Callable[[int, int], None] | None = None,
        loaded: LoadedModel | None = None,
        defer_warm_up: bool = False,
    ) -> LLMEngine:
        """Load the model, plan memory, allocate the KV and swap pools, then profile step
        costs and price both preemption modes on this machine (warm_up.py). `loaded`
        lets tests and benchmarks build many engines from one parsed model.
        `defer_warm_up`: return before the measurements; whoever steps the engine runs
        `engine.warm_up.run_piece()` while idle (the engine core does)."""
        config = config or EngineConfig()
        if config.tensor_parallel_size > 1 and loaded is None:
            return build_tp_engine(cls, config)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        device = startup.resolve_device(config.device)
        dtype = startup.resolve_dtype(config.dtype, device)
        t0 = time.perf_counter()
        owned = loaded is None  # ours: the model may free the unfused tensors as it fuses them
        if loaded is None:
            loaded = load_model(
                config.model,
                torch.float32 if device.type == "cpu" else dtype,
                progress,
                load_format=config.load_format,
                device=device,
                cpu_weights=config.cpu_weights,
            )
        config = config.resolve_lengths(loaded.config.max_position_embeddings)
        max_model_len = int(config.max_model_len)
        model = LlamaModel(
            loaded.config, loaded.weights, device, dtype, max_model_len, consume=owned
        )
        if config.enable_lora:  # before the memory plan: the slot pool is device memory too
            model.lora = lora_weights_for(config, model)
        load_seconds = time.perf_counter() - t0
        plan = startup.plan_memory(config, model)
        graphs, sizes = decode_graph_plan(config, device)
        if graphs and plan.budget_source.startswith("--gpu-memory-utilization"):
            # measured, then taken from the KV pool: the real capture comes after the pool
            pad_block = plan.kv_bytes_per_token * config.block_size
            plan = memory.reserve_for_graphs(
                plan, cuda_graphs.measure_graph_bytes(model, config.block_size, max_model_len, sizes) + pad_block
            )
        log.info(plan.describe())
        if plan.num_blocks * config.block_size < max_model_len:
            raise ConfigError(
                f"the KV cache holds {plan.num_blocks * config.block_size} tokens, fewer than "
                f"--max-model-len {max_model_len}; raise the KV memory or lower max-model-len"
            )
        tokenizer = TextTokenizer(loaded.tokenizer, loaded.config.eos_token_ids)
        engine = cls(config, model, tokenizer, plan, load_seconds)
        engine.add_lora_modules()
        if engine.capture_graphs:
            captured = engine.runner.capture_graphs()
            log.info("CUDA graphs: %d decode sizes up to %d captured in %.1f s", len(captured.sizes),
                     captured.sizes[-1], captured.capture_seconds)  # fmt: skip
        engine.warm_up = WarmUp(engine)
        if not defer_warm_up:
            engine.warm_up.run()
        return engine

    def seed_cost_model(
        self, samples: list[tuple[StepShape, float]] | None = None, seconds: float | None = None
    ) -> list[tuple[StepShape, float]]:
        """Seed the step cost model with profiled steps (`samples`, measured in `seconds`;
        by default timed now, step_profile.py) and return them (their prefills also price
        a recompute preemption)."""
        t0 = time.perf_counter()
        if samples is None:
            samples = step_profile.profile_step_costs(
                self.runner, self.config, self.memory_plan.num_blocks
            )
            seconds = time.perf_counter() - t0
        c = self.cost_model.seed(samples)
        for shape, seconds in self.cost_model.dropped:
            log.warning("step cost model: left a start-up sample out of the prior, %s in %.1f ms: the other "
                        "samples contradict it", shape, seconds * 1e3)  # fmt: skip
        log.info(
            "step cost model (start-up profile, %.2f s): %.2f ms + %.3f ms/prefill token + %.3f ms/decode "
            "token + %.3g ms/attended pair",
            seconds or 0.0,
            c.fixed * 1e3,
            c.prefill_token * 1e3,
            c.decode_token * 1e3,
            c.attended_pair * 1e3,
        )
        return samples

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    @property
    def preemption_costs(self) -> PreemptionCosts:
        return self.scheduler.costs

    # ---- swap ------------------------------------------------------------------------
    def _do_swaps(self, sched: SchedulerOutput) -> None:
        if not self.swap_pools:  # none, or on the tensor-parallel ranks
            return
        device_pools = kv_pools(self.runner.kv_caches)
        if sched.swap_out:
            src, dst = zip(*sched.swap_out, strict=True)
            copy_blocks(device_pools, self.swap_pools, list(src), list(dst)).wait()
        if sched.swap_in:
            src, dst = zip(*sched.swap_in, strict=True)
            copy_blocks(self.swap_pools, device_pools, list(src), list(dst)).wait()
        if self.block_manager.host_tier is not None:
            self.block_manager.host_tier.step_done()

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
        lora_name: str | None = None,
    ) -> Request:
        params = params or SamplingParams()
        lora_key = None
        if lora_name is not None:
            lora_key = self.lora.key_of(lora_name) if self.lora is not None else None
            if lora_key is None:
                raise UnknownAdapterError(f"the LoRA adapter {lora_name!r} is not loaded; loaded: {self.lora_names()}")
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
            lora_name=lora_key,
        )

    def add_request(
        self,
        prompt: str | Sequence[int] | Request,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        lora_name: str | None = None,
    ) -> Request:
        req = (
            prompt
            if isinstance(prompt, Request)
            else self.make_request(prompt, params, request_id, priority, arrival_time, lora_name)
        )
        if req.request_id in self.scheduler.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.detokenizers[req.request_id] = Detokenizer(self.tokenizer, req.sampling_params)
        self.scheduler.add(req)
        if req.sampling_params.structured is not None:
            self.grammars.add(req.request_id, req.sampling_params.structured)
        return req

    def _grammar_ready(self, req: Request) -> bool:
        return req.sampling_params.structured is None or self.grammars.ready(req.request_id)

    def _can_start(self, req: Request) -> bool:
        """The admission gate: its grammar compiled, its adapter in host memory with a slot."""
        if not self._grammar_ready(req):
            return False
        return req.lora_name is None or self.lora is None or self.lora.can_start(req.lora_name)

    # ---- LoRA adapters (server/lora) ------------------------------------------------------
    def add_lora_modules(self) -> None:
        """Register --lora-modules; ConfigError names the adapter and its problem."""
        if self.lora is None:
            return
        for module in parse_lora_modules(self.config.lora_modules):
            try:
                self.lora.add(module.name, module.path)
            except LoRAAdapterError as err:
                raise ConfigError(f"--lora-modules: {err}") from None

    def add_lora(self, name: str, path: str) -> None:
        """Load an adapter at run time; LoRAAdapterError (nothing changes) when refused."""
        if self.lora is None:
            raise LoRAAdapterError("LoRA serving is off: start the server with --enable-lora")
        self._retire_adapters()
        self.lora.add(check_lora_name_or_raise(name), path)

    def remove_lora(self, name: str) -> None:
        """Unload: new requests cannot name it; those already in the engine finish with it.
        KeyError when no such adapter is loaded."""
        if self.lora is None:
            raise KeyError(name)
        self.lora.remove(name)
        self._retire_adapters()

    def lora_names(self) -> list[str]:
        return sorted(self.lora.entries) if self.lora is not None else []

    def lora_request_names(self) -> tuple[list[str], list[str]]:
        """Adapters of the running and of the waiting requests (vllm:lora_requests_info)."""
        if self.lora is None:
            return [], []
        running = {self.lora.name_of(r.lora_name) for r in self.scheduler.running if r.lora_name}
        waiting = {self.lora.name_of(r.lora_name) for r in self.scheduler.waiting + self.scheduler.swapped
                   if r.lora_name}  # fmt: skip
        return sorted(running), sorted(waiting)

    def _prepare_adapters(self) -> None:
        """Before a step runs: copy newly placed adapters into their slots."""
        if self.lora is not None:
            self.lora.copy_pending()
            self._retire_adapters()

    def _retire_adapters(self) -> None:
        if self.lora is not None and len(self.lora.by_key) > len(self.lora.entries):
            self.lora.retire_unused({r.lora_name for r in self.scheduler.requests.values() if r.lora_name})

    def abort_request(self, request_id: str) -> bool:
        req = self.scheduler.abort(request_id)
        self.detokenizers.pop(request_id, None)
        self.grammars.release(request_id)
        return req is not None

    def has_unfinished_requests(self) -> bool:
        """Requests to run, or (overlap) a launched step whose tokens are not read yet."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ---- the loop ----------------------------------------------------------------------
    def step(self) -> list[Delta]:
        """One scheduler decision, run and sampled; a Delta for each request that got
        tokens (or finished). With --async-scheduling: launch this step, then return the
        Deltas of the step launched before (overlap.py)."""
        if self.async_scheduling:
            return self._step_overlapped()
        t0 = time.perf_counter()
        failed = self._grammar_failures() if self.grammars else []
        sched = self.scheduler.schedule()
        stats = StepStats(num_preempted=len(sched.preempted_request_ids))
        self._do_swaps(sched)
        self._prepare_adapters()
        if self.grammars:
            self._fill_bitmasks(sched)
        result = self.runner.execute(sched)
        if sched.is_empty:
            self.last_step = stats
            if not failed:
                self._wait_while_idle()
            return failed
        return failed + self._finish_step(sched, result, stats, t0, launched=False)

    def _wait_while_idle(self) -> None:
        """After an empty step: sleep a moment on what the waiting requests wait for (grammar
        compiles, adapter reads) instead of spinning; nothing pending returns at once."""
        self.grammars.wait_for_compiles(GRAMMAR_WAIT_S)
        if self.lora is not None:
            self.lora.wait_for_reads(GRAMMAR_WAIT_S)

    def _finish_step(
        self, sched: SchedulerOutput, result: StepResult, stats: StepStats, t0: float, launched: bool
    ) -> list[Delta]:
        """Apply a run step's tokens: stop rules, grammars, Deltas, drafts, timing."""
        stats.num_prompt_tokens = sched.num_prompt_tokens
        stats.num_batched_tokens = sched.num_batched_tokens
        touched = self.scheduler.update(sched, result.tokens, launched=launched)
        if self.grammars:
            self._advance_grammars(touched)
        deltas = [
            self._make_delta(req, tokens, result.logprobs.get(req.request_id, []))
            for req, tokens in touched
        ]
        if self.speculator is not None:
            self.speculator.after_step(sched, result.tokens, self.scheduler.running, self.block_manager)
        stats.num_generation_tokens = sum(len(d.new_token_ids) for d in deltas)
        stats.duration_s = time.perf_counter() - t0
        self._time_step(sched, stats)
        if self.speculator is not None:
            self.speculator.observe_step(sched, stats.duration_s)
        self.last_step = stats
        self._retire_adapters()  # an unloaded adapter's last request may have just finished
        return deltas

    # ---- overlapped scheduling (overlap.py) ------------------------------------------------
    def _step_overlapped(self) -> list[Delta]:
        """Plan and launch step N+1, then read step N's tokens: the host's work for N+1
        (scheduling, input tensors) runs while the device (or the worker thread) runs N."""
        deltas = self._grammar_failures() if self.grammars else []
        prev, self._in_flight = self._in_flight, None
        sched = self.scheduler.schedule()
        self.scheduler.launched(sched)
        stats = StepStats(num_preempted=len(sched.preempted_request_ids))
        reason = overlap.sync_reason(sched, self.grammars)
        if reason is not None and prev is not None:
            self.overlap_syncs[reason] = self.overlap_syncs.get(reason, 0) + 1
            deltas += self._resolve(prev)
            prev = None
        self._do_swaps(sched)
        self._prepare_adapters()
        if self.grammars:
            self._fill_bitmasks(sched)
        launched_at = time.perf_counter()
        pending = self.launcher.submit(self.runner.submit, sched)
        if sched.is_empty:
            pending.result()  # tells the runner which requests finished; nothing to read
            self.last_step = stats
            if prev is None and not deltas:
                self._wait_while_idle()
        else:
            self._in_flight = _InFlight(sched, pending, launched_at, stats)
        if prev is not None:
            deltas += self._resolve(prev)
        return deltas

    def _resolve(self, step: _InFlight) -> list[Delta]:
        """Wait for a launched step's tokens and apply them (exact stop rules; a request
        that finished since it was planned gets nothing)."""
        result = step.pending.result()
        start = max(step.launched_at, self._last_resolved_at)
        deltas = self._finish_step(step.sched, result, step.stats, start, launched=True)
        self._last_resolved_at = time.perf_counter()
        return deltas

    # ---- structured outputs (grammar.py) --------------------------------------------------
    def _fill_bitmasks(self, sched: SchedulerOutput) -> None:
        """Each constrained row that samples this step gets its grammar's token bitmask."""
        for s in sched.scheduled:
            if s.sample and s.request_id in self.grammars:
                req = self.scheduler.requests[s.request_id]
                s.grammar_bitmask = self.grammars.bitmask(s.request_id, req.output_token_ids)

    def _advance_grammars(self, touched: list[tuple[Request, list[int]]]) -> None:
        """Feed the kept tokens to the matchers; a complete grammar finishes its request."""
        for req, tokens in touched:
            rid = req.request_id
            if rid in self.grammars and self.grammars.accept(rid, tokens) and not req.is_finished:
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)

    def _grammar_failures(self) -> list[Delta]:
        """Requests whose grammar failed to compile end (aborted) instead of running free."""
        deltas = []
        for rid, error in self.grammars.failed():
            log.warning("request %s: its grammar failed to compile (%s); aborting it", rid, error)
            req = self.scheduler.abort(rid)
            self.grammars.release(rid)
            self.detokenizers.pop(rid, None)
            if req is not None:
                deltas.append(Delta(rid, [], "", finished=True, finish_reason="abort"))
        return deltas

    def _time_step(self, sched: SchedulerOutput, stats: StepStats) -> None:
        """Feed the step's measured time to the cost model; label the step for metrics."""
        shape = StepShape.of((s.num_tokens, s.start_position) for s in sched.scheduled)
        if sched.num_prompt_tokens == 0:
            stats.kind = "decode"
        else:  # tokens past the prompts are decodes (and draft tokens)
            stats.kind = (
                "mixed" if sched.num_batched_tokens > sched.num_prompt_tokens else "prefill"
            )
        budget = self.scheduler.budget_stats
        stats.target_s, stats.predicted_s = budget.target_s, budget.predicted_s
        self.cost_model.observe(shape, stats.duration_s)

    def _make_delta(
        self, req: Request, new_tokens: list[int], logprobs: list[TokenLogprob]
    ) -> Delta:
        detok = self.detokenizers.get(req.request_id)
        t0 = time.perf_counter()
        if detok is not None:
            used = detok.update(new_tokens)
            if used < len(new_tokens):
                req.truncate_output(req.num_output_tokens - (len(new_tokens) - used))
                new_tokens, logprobs = new_tokens[:used], logprobs[:used]
            if detok.hit_stop is not None and not req.is_finished:
                req.stop_reason = detok.hit_stop
                self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        finished = req.is_finished
        new_text = detok.take_new_text(finished) if detok else ""
        self.detokenize_seconds += time.perf_counter() - t0
        if finished:
            self.detokenizers.pop(req.request_id, None)
            self.grammars.release(req.request_id)
        return Delta(
            request_id=req.request_id,
            new_token_ids=new_tokens,
            new_text=new_text,
            new_logprobs=logprobs,
            finished=finished,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_preemptions=req.num_preemptions,
            first_scheduled_time=req.first_scheduled_time,
        )

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Offline: run all prompts to completion; results in input order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        results: dict[str, RequestOutput] = {}
        for prompt, sp in zip(prompts, params, strict=True):
            req = self.add_request(prompt, sp)
            results[req.request_id] = RequestOutput(req.request_id, list(req.prompt_token_ids))
        while self.has_unfinished_requests():
            for delta in self.step():
                results[delta.request_id].add(delta)
        return list(results.values())
