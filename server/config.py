"""Every `llmservice serve` option, defined once: vLLM's flag names, defaults, help text
and the LLMService field each one is set from (see argspec.py for the metadata).

Two dataclasses, one module: `EngineConfig` is what the engine core process receives and
validates; `ServerArgs` holds what only the API process uses (where to listen, the queue
bound, the drain, the tokenizer pool) and what the engine never sees. argparse, the operator's
rendered command and the CRD contract test all read both from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmservice.server.argspec import CRDDefault, arg, first
from llmservice.server.engine.spec_config import parse_speculative_config
from llmservice.server.lora.flags import check_lora_flags
from llmservice.server.model.registry import DEFAULT_MODEL

BLOCK_SIZES = (8, 16, 32, 64, 128)
PREEMPTION_MODES = ("recompute", "swap", "auto")
SCHEDULING_POLICIES = ("fcfs", "priority")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # vLLM's names; fp8 is e4m3 (docs/kv-cache.md)
LOAD_FORMATS = ("auto", "dummy")  # dummy: random weights of the model's shape (benchmarks)
CPU_WEIGHTS = ("quantized", "fp32")  # GGUF blocks kept packed on CPU, or dequantized (reference)
LOG_LEVELS = ("debug", "info", "warning", "error")
CPU_KV_CACHE_GIB = 1.0  # the KV budget on CPU when --kv-cache-memory-gib is unset

_FROM_MODEL = (
    "the server's default is the model's context length, unknown to the API server; "
    "a concrete default keeps the operator's VRAM check able to plan"
)


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message names the offending value."""


@dataclass
class EngineConfig:
    model: str = arg(
        DEFAULT_MODEL, "model",
        "builtin:NAME, a .gguf file, an HF model directory, or a Hugging Face Hub model: "
        "hf://ORG/NAME, ORG/NAME, hf://ORG/NAME/FILE.gguf (default %(default)s)",
        nargs="?", crd="model.source",
        crd_default=CRDDefault(None, "required: every LLMService names its model"),
    )
    served_model_name: str | None = arg(
        None, "--served-model-name",
        "name(s) clients use in `model`; the first is reported (default: the model reference)",
        nargs="+", from_cli=first, crd="model.servedName",
    )
    dtype: str = arg("auto", "--dtype", "weights and activations; auto: bfloat16 on GPU, float32 on CPU",
                     choices=DTYPES, crd="engine.dtype")
    device: str = arg("auto", "--device", "auto, cpu, cuda or cuda:N")
    load_format: str = arg(
        "auto", "--load-format",
        "dummy: random weights of the model's shape, for benchmarks (needs only config + tokenizer)",
        choices=LOAD_FORMATS,
    )
    cpu_weights: str = arg(
        "quantized", "--cpu-weights",
        "quantized: a GGUF's Q4_0/Q4_1/Q8_0 matrices stay packed on CPU (fp32 math, docs/cpu.md); "
        "fp32: dequantize them at load (the reference path)",
        choices=CPU_WEIGHTS,
    )
    block_size: int = arg(16, "--block-size", "tokens per KV cache block",
                          type=int, choices=BLOCK_SIZES, crd="engine.blockSize")
    max_model_len: int | None = arg(
        None, "--max-model-len", "prompt + output tokens of one request (default: the model's)",
        type=int, crd="engine.maxModelLen", crd_default=CRDDefault(4096, _FROM_MODEL),
    )
    max_num_batched_tokens: int | None = arg(
        None, "--max-num-batched-tokens",
        "token budget of one engine step (default: 2048, or max-model-len without chunked prefill)",
        type=int, crd="engine.maxNumBatchedTokens", crd_default=CRDDefault(8192, _FROM_MODEL),
    )
    max_num_seqs: int = arg(128, "--max-num-seqs", "sequences running at once",
                            type=int, crd="engine.maxNumSeqs")
    enable_prefix_caching: bool = arg(True, "--enable-prefix-caching",
                                      "share the KV cache of common prompt prefixes",
                                      type=bool, crd="engine.enablePrefixCaching")
    enable_chunked_prefill: bool = arg(True, "--enable-chunked-prefill",
                                       "split long prompts across steps, interleaved with decodes",
                                       type=bool, crd="engine.enableChunkedPrefill")
    preemption_mode: str = arg("recompute", "--preemption-mode",
                               "what happens to a request evicted when KV blocks run out",
                               choices=PREEMPTION_MODES, crd="engine.preemptionMode")
    swap_space: float = arg(4.0, "--swap-space", "GiB of CPU memory for swapped KV blocks",
                            type=float, crd="engine.swapSpaceGiB")
    kv_offloading_size: float = arg(0.0, "--kv-offloading-size",
                                    "GiB of host memory for the prefix cache's host tier (evicted "
                                    "cached KV blocks, pulled back on a prefix match); 0: off",
                                    type=float)
    kv_cache_dtype: str = arg("auto", "--kv-cache-dtype",
                              "KV cache storage: auto (the model's dtype), fp8 / fp8_e4m3 (8-bit e4m3 "
                              "with a calibrated scale per layer; CPU and CUDA)",
                              choices=KV_CACHE_DTYPES)
    gpu_memory_utilization: float = arg(0.90, "--gpu-memory-utilization",
                                        "share of the GPU's memory the engine may use",
                                        type=float, crd="resources.gpuMemoryUtilization")
    kv_cache_memory_gib: float | None = arg(
        None, "--kv-cache-memory-gib",
        f"explicit KV cache budget (CPU default {CPU_KV_CACHE_GIB:g} GiB; on CUDA overrides the profiled plan)",
        type=float, crd="engine.kvCacheMemoryGiB",
    )
    num_gpu_blocks_override: int | None = arg(None, "--num-gpu-blocks-override",
                                              "exact KV pool size", type=int, hidden=True)
    scheduling_policy: str = arg("fcfs", "--scheduling-policy",
                                 "admission order: fcfs, or priority (lower first, with aging)",
                                 choices=SCHEDULING_POLICIES, crd="engine.schedulingPolicy")
    max_queue_delay_ms: float | None = arg(None, "--max-queue-delay-ms",
                                           "a request waiting longer is admitted ahead of policy order",
                                           type=float, crd="engine.maxQueueDelayMs")
    max_step_ms: float | None = arg(
        None, "--max-step-ms",
        "step-time target: each step's prefill is sized so the predicted step time stays within it "
        "(decodes first); default: 2x the predicted decode-only step; 0: the token budget alone",
        type=float, crd="engine.maxStepMs",
    )
    priority_aging_per_s: float = arg(1.0, "--priority-aging-per-s",
                                      "with --scheduling-policy priority: how much a request's "
                                      "priority improves per second it waits", type=float)
    seed: int = arg(0, "--seed", "sampling seed", type=int)
    num_threads: int | None = arg(None, "--num-threads", "torch CPU threads of the engine", type=int)
    tensor_parallel_size: int = arg(
        1, "--tensor-parallel-size",
        "ranks (GPUs, or CPU processes) one replica shards the model over: N worker processes "
        "in this pod, the scheduler in one", type=int, aliases=("-tp",), crd="engine.tensorParallelSize",
    )
    speculative_config: str | None = arg(
        None, "--speculative-config",
        'speculative decoding, vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4, "prompt_lookup_min": 2}, {"method": "draft_model", "model": ..., '
        '"num_speculative_tokens": 4} or {"method": "layer_skip", "num_layers": L, ...}',
    )
    enforce_eager: bool = arg(
        False, "--enforce-eager",
        "no CUDA graphs: every step runs eagerly (default: pure-decode steps replay graphs on CUDA)",
        type=bool,
    )
    max_cudagraph_capture_size: int | None = arg(
        None, "--max-cudagraph-capture-size",
        "largest decode batch captured in a CUDA graph (sizes 1, 2, 4, every 8 to 256, every 16 "
        "beyond); default: 2x max-num-seqs, at most 512 (vLLM's)",
        type=int,
    )
    enable_sleep_mode: bool = arg(
        False, "--enable-sleep-mode",
        "POST /sleep?level=1|2 frees the KV pool (and moves or drops the weights), POST /wake_up restores them",
        type=bool,
    )
    async_scheduling: bool | None = arg(
        None, "--async-scheduling",
        "overlap scheduling: plan step N+1 while step N runs (default: on on CUDA, off on CPU)",
        type=bool,
    )
    enable_lora: bool = arg(
        False, "--enable-lora",
        "serve LoRA adapters (PEFT format) on the base model, batched with it (docs/lora.md)", type=bool,
    )
    lora_modules: list[str] | None = arg(
        None, "--lora-modules",
        'adapters served at start: name=path, or vLLM\'s JSON {"name": ..., "path": ..., "base_model_name": ...}',
        nargs="+",
    )
    max_loras: int = arg(1, "--max-loras", "adapters in device slots at once (a step's distinct adapters)",
                         type=int, crd="engine.maxLoras")
    max_lora_rank: int = arg(16, "--max-lora-rank", "largest adapter rank served (the slots' padded rank)",
                             type=int, crd="engine.maxLoraRank")
    max_cpu_loras: int | None = arg(
        None, "--max-cpu-loras", "parsed adapters kept in host memory, LRU (default: --max-loras)", type=int,
        crd="engine.maxCpuLoras",
    )
    static_decode_inputs: bool | None = arg(
        None, "--static-decode-inputs",
        "pure-decode steps on fixed-address inputs padded to the graph sizes, without capture "
        "(tests the CUDA-graph input path on CPU); default: with CUDA graphs",
        type=bool, hidden=True,
    )

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ConfigError(f"--block-size {self.block_size} is not one of {list(BLOCK_SIZES)}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(
                f"--preemption-mode {self.preemption_mode!r} is not one of {list(PREEMPTION_MODES)}"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(
                f"--scheduling-policy {self.scheduling_policy!r} is not one of {list(SCHEDULING_POLICIES)}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not one of {list(DTYPES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not one of {list(KV_CACHE_DTYPES)}")
        if self.cpu_weights not in CPU_WEIGHTS:
            raise ConfigError(f"--cpu-weights {self.cpu_weights!r} is not one of {list(CPU_WEIGHTS)}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"--load-format {self.load_format!r} is not one of {list(LOAD_FORMATS)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"--gpu-memory-utilization {self.gpu_memory_utilization} must be in (0, 1]"
            )
        if self.max_num_seqs < 1:
            raise ConfigError(f"--max-num-seqs {self.max_num_seqs} must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"--max-model-len {self.max_model_len} must be >= 2")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens {self.max_num_batched_tokens} must be >= 1")
        if self.swap_space < 0:
            raise ConfigError(f"--swap-space {self.swap_space} must be >= 0")
        if not self.kv_offloading_size >= 0:
            raise ConfigError(f"--kv-offloading-size {self.kv_offloading_size} must be >= 0")
        if self.kv_offloading_size > 0 and not self.enable_prefix_caching:
            raise ConfigError("--kv-offloading-size needs --enable-prefix-caching (it is the prefix cache's host tier)")
        if self.kv_offloading_size > 0 and self.tensor_parallel_size > 1:
            raise ConfigError("--kv-offloading-size is not supported with --tensor-parallel-size > 1")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ConfigError(f"--kv-cache-memory-gib {self.kv_cache_memory_gib} must be > 0")
        if self.max_step_ms is not None and (self.max_step_ms < 0 or self.max_step_ms != self.max_step_ms):
            raise ConfigError(f"--max-step-ms {self.max_step_ms} must be >= 0 (0: no step-time budget)")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"--num-threads {self.num_threads} must be >= 1")
        if self.max_cudagraph_capture_size is not None and self.max_cudagraph_capture_size < 1:
            raise ConfigError(f"--max-cudagraph-capture-size {self.max_cudagraph_capture_size} must be >= 1")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"--tensor-parallel-size {self.tensor_parallel_size} must be >= 1")
        try:
            parse_speculative_config(self.speculative_config)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_lora_flags(self)

    def resolve_lengths(self, model_max_len: int) -> EngineConfig:
        """A copy with max_model_len / max_num_batched_tokens filled from the model, both
        checked together; the caller's config is left as it was."""
        max_model_len = self.max_model_len
        if max_model_len is None:
            max_model_len = model_max_len
        elif max_model_len > model_max_len:
            raise ConfigError(
                f"--max-model-len {max_model_len} exceeds the model's context length {model_max_len}"
            )
        batched = self.max_num_batched_tokens
        if batched is None:
            batched = 2048 if self.enable_chunked_prefill else max(2048, max_model_len)
        if not self.enable_chunked_prefill and batched < max_model_len:
            raise ConfigError(
                f"--max-num-batched-tokens {batched} is smaller than "
                f"--max-model-len {max_model_len}; without chunked prefill a prompt of "
                "max-model-len tokens could never be scheduled. Raise it, lower max-model-len, "
                "or enable chunked prefill."
            )
        return replace(self, max_model_len=max_model_len, max_num_batched_tokens=batched)


@dataclass(frozen=True)
class ServerArgs:
    host: str = arg("0.0.0.0", "--host", "address to listen on")
    port: int = arg(8000, "--port", "port to listen on", type=int)
    max_waiting_requests: int = arg(
        1024, "--max-waiting-requests",
        "past this many waiting requests new ones get 503 + Retry-After (0: unbounded)",
        type=int, crd="engine.maxWaitingRequests",
    )
    shutdown_grace_seconds: float = arg(
        30.0, "--shutdown-grace-seconds",
        "on SIGTERM, how long in-flight requests may run before they are aborted",
        type=float, crd="engine.shutdownGraceSeconds",
    )
    download_dir: str | None = arg(
        None, "--download-dir",
        "Hub download cache (default: HF_HUB_CACHE, i.e. $HF_HOME/hub); relative model paths are "
        "looked up here too",
    )
    revision: str | None = arg(None, "--revision",
                               "Hub branch, tag or commit of an hf:// model (default: main)")
    tokenizer_workers: int = arg(2, "--tokenizer-workers",
                                 "threads for tokenization off the event loop", type=int)
    log_level: str = arg("info", "--log-level", "log level", choices=LOG_LEVELS)
    max_tokens_default: int | None = arg(
        None, "--max-tokens-default",
        "max_tokens of a request that leaves it out, capped to the rest of the context "
        "(default: chat the rest of the context, as vLLM; completions 16, as OpenAI)",
        type=int, crd="engine.maxTokensDefault",
    )
    request_timeout_s: float | None = arg(
        None, "--request-timeout-s",
        "wall-clock limit of one request: past it generation stops with finish_reason "
        "length and a llmservice-truncated header (default: none)",
        type=float, crd="engine.requestTimeoutSeconds",
    )
    api_key: str | None = arg(
        None, "--api-key",
        "clients must send `Authorization: Bearer KEY` (also from VLLM_API_KEY or "
        "LLMSERVICE_API_KEY); /health, /ready and /metrics stay open",
    )
    max_request_body_bytes: int = arg(
        16 * 1024 * 1024, "--max-request-body-bytes", "larger request bodies get 413", type=int,
    )
    tool_call_parser: str | None = arg(
        None, "--tool-call-parser",
        "how tool calls are read from a free answer (tool_choice auto): hermes (<tool_call> tags) "
        "or json (the answer is a call object); default: json if the answer starts with { or [, else hermes",
        choices=("hermes", "json"),
    )

    def __post_init__(self) -> None:
        if self.max_tokens_default is not None and self.max_tokens_default < 1:
            raise ConfigError(f"--max-tokens-default {self.max_tokens_default} must be >= 1")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ConfigError(f"--request-timeout-s {self.request_timeout_s} must be > 0")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if self.max_request_body_bytes < 1024:
            raise ConfigError(f"--max-request-body-bytes {self.max_request_body_bytes} must be >= 1024")
        if self.max_waiting_requests < 0:
            raise ConfigError(f"--max-waiting-requests {self.max_waiting_requests} must be >= 0")
        if self.shutdown_grace_seconds < 0:
            raise ConfigError(f"--shutdown-grace-seconds {self.shutdown_grace_seconds} must be >= 0")
        if self.tokenizer_workers < 1:
            raise ConfigError(f"--tokenizer-workers {self.tokenizer_workers} must be >= 1")
