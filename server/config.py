"""Engine arguments: one dataclass, vLLM's names, validated up front with clear messages."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

BLOCK_SIZES = (8, 16, 32, 64, 128)
PREEMPTION_MODES = ("recompute", "swap", "auto")
SCHEDULING_POLICIES = ("fcfs", "priority")
DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")  # dummy: random weights of the model's shape (benchmarks)


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message names the offending value."""


@dataclass
class EngineConfig:
    model: str = "builtin:smollm2-135m"
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    block_size: int = 16
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 128
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    swap_space: float = 4.0  # GiB of CPU memory for swapped-out KV blocks
    gpu_memory_utilization: float = 0.90
    kv_cache_memory_gib: float | None = None  # CPU: explicit KV budget (default 1 GiB)
    num_gpu_blocks_override: int | None = None  # tests and benchmarks: exact pool size
    scheduling_policy: str = "fcfs"
    max_queue_delay_ms: float | None = None
    priority_aging_per_s: float = 1.0  # effective priority improves by this much per waiting second
    seed: int = 0
    num_threads: int | None = None
    extra: dict = field(default_factory=dict)

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
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ConfigError(f"--kv-cache-memory-gib {self.kv_cache_memory_gib} must be > 0")

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
