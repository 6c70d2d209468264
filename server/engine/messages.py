"""The small data structures that cross the boundary between the API process and the
engine-core process.

Everything here is a plain dataclass so it pickles cheaply. A report's outputs are the
engine's own per-step `Delta`s (outputs.py): only what is new, never the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmservice.server.engine.outputs import Delta
from llmservice.server.engine.sampling_params import SamplingParams

# ---- API process -> engine core ---------------------------------------------------------


@dataclass
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_time: float = 0.0  # time.monotonic() in the API process (CLOCK_MONOTONIC is system-wide)
    lora_name: str | None = None  # --enable-lora: the adapter it runs with; None: the base model


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class Shutdown:
    pass


@dataclass
class Sleep:
    """--enable-sleep-mode: free the device's memory once no request is in flight (sleep.py)."""

    level: int = 1


@dataclass
class WakeUp:
    pass


@dataclass
class LoadLoRA:
    """POST /v1/load_lora_adapter: read, check and register an adapter."""

    lora_name: str
    lora_path: str


@dataclass
class UnloadLoRA:
    """POST /v1/unload_lora_adapter: unregister; requests already in the engine finish."""

    lora_name: str


@dataclass
class Listening:
    """The API serves requests from now on: the engine core's deferred start-up
    measurements may begin once it has been idle a moment (core.py)."""


# ---- engine core -> API process ---------------------------------------------------------


@dataclass
class EngineReady:
    """Sent once the weights are loaded and the KV cache is allocated."""

    model_name: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    gpu_memory_utilization: float
    memory_plan: str
    load_seconds: float
    scheduling_policy: str
    # measured at start-up (swap_space.PreemptionCosts); None where not measured
    recompute_s_per_token: float | None = None
    swap_s_per_token: float | None = None
    swap_fixed_s: float | None = None
    lora_adapters: dict[str, str] = field(default_factory=dict)  # --enable-lora: name -> path
    max_loras: int = 0  # 0: LoRA serving is off


@dataclass
class CostsMeasured:
    """The start-up measurements finished after ready (warm_up.py): the preemption prices
    for the advisor, None where not measured."""

    recompute_s_per_token: float | None = None
    swap_s_per_token: float | None = None
    swap_fixed_s: float | None = None


@dataclass
class EngineFailed:
    """The engine could not start, or a step raised: the process is going away."""

    message: str


@dataclass
class Rejected:
    """The engine refused a request (e.g. prompt + max_tokens > max_model_len)."""

    request_id: str
    message: str
    status: int = 400


@dataclass
class EngineStats:
    """Engine-wide state after a step (gauges) and cumulative counts (counters)."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_cache_usage: float = 0.0
    cpu_cache_usage: float = 0.0
    num_preemptions: int = 0  # cumulative
    prefix_queries: int = 0  # cumulative, tokens
    prefix_hits: int = 0  # cumulative, tokens, device tier
    prefix_host_hits: int = 0  # cumulative, tokens, host tier (--kv-offloading-size)
    prefix_potential_hits: int = 0  # cumulative, tokens a prefix cache would have served
    detokenize_seconds: float = 0.0  # cumulative, in the engine's incremental detokenizer
    # cumulative computed tokens of preempted requests, by the mode that handled them
    preempted_tokens_recompute: int = 0
    preempted_tokens_swap: int = 0
    step_tokens: int | None = None  # tokens computed in this step; None when no step ran
    # the step-time budget (step_budget.py; metrics in server/step_metrics.py)
    step_seconds: float | None = None  # this step's wall time; None when no step ran
    step_kind: str = ""  # decode, prefill or mixed
    step_target_seconds: float | None = None  # None: no time limit
    step_forced: bool = False  # its least was already predicted over the target
    step_cost: tuple[float, float, float, float] | None = None  # cost model coefficients
    step_decode_overruns: int = 0  # cumulative
    # speculative decoding, cumulative: (drafts, draft tokens, accepted, accepted per position)
    spec_decode: tuple[int, int, int, tuple[int, ...]] | None = None
    # --enable-lora: adapters of the running and of the waiting requests (vllm:lora_requests_info)
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()


@dataclass
class Report:
    """One message per engine-loop iteration: admissions, per-request deltas, stats."""

    stats: EngineStats
    accepted: list[str] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    deltas: list[Delta] = field(default_factory=list)


@dataclass
class LoRAChanged:
    """The answer to LoadLoRA or UnloadLoRA: the adapters now (name -> path), or why not."""

    adapters: dict[str, str]
    error: str | None = None
    status: int = 200  # 400: refused adapter, 404: no such adapter


@dataclass
class SleepChanged:
    """The answer to Sleep or WakeUp: the engine's sleep level now (0: awake)."""

    level: int
    seconds: float
    error: str | None = None
