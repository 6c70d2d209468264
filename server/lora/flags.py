"""The LoRA flags' rules (EngineConfig calls this; torch-free like the config)."""

from __future__ import annotations

from typing import Any

from llmservice.server.lora.modules import parse_lora_modules


def check_lora_flags(config: Any) -> None:
    """Raise ConfigError naming the flag; the adapters' files are checked at start."""
    from llmservice.server.config import ConfigError

    try:
        modules = parse_lora_modules(config.lora_modules)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if not config.enable_lora:
        if modules:
            raise ConfigError("--lora-modules needs --enable-lora")
        return
    if config.max_loras < 1:
        raise ConfigError(f"--max-loras {config.max_loras} must be >= 1")
    if config.max_lora_rank < 1:
        raise ConfigError(f"--max-lora-rank {config.max_lora_rank} must be >= 1")
    if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
        raise ConfigError(f"--max-cpu-loras {config.max_cpu_loras} must be >= --max-loras {config.max_loras}")
    if config.tensor_parallel_size > 1:
        raise ConfigError("--enable-lora is not supported with --tensor-parallel-size > 1")
    if config.speculative_config:
        raise ConfigError("--enable-lora is not supported with --speculative-config")
