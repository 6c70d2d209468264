"""The engine settings the rules compare the metrics with, and where they come from.

Three sources, in this order of trust: the LLMService spec (what a recommendation
patches), the server's own info metrics (`vllm:cache_config_info`, as vLLM exports it,
and our `llmservice:engine_config_info` for the scheduler's limits), and a spec file given
to `llmservice advise --spec`. A value none of them has stays None, and a rule that needs
it stays silent rather than guess. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from llmservice.operator.advisor.snapshot import Scrape
from llmservice.operator.spec import SERVER_OPTIONS, EngineSpec, ResourcesSpec, crd_key

CACHE_INFO = "vllm:cache_config_info"
ENGINE_INFO = "llmservice:engine_config_info"


@dataclass(frozen=True)
class EngineSettings:
    block_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    preemption_mode: str | None = None
    swap_space_gib: float | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None  # from the server only: the memory plan's outcome

    def overlaid(self, other: EngineSettings) -> EngineSettings:
        """These settings, with every value `other` knows taking precedence."""
        known = {f.name: getattr(other, f.name) for f in fields(other)}
        return replace(self, **{k: v for k, v in known.items() if v is not None})


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value and value != "None" else None


def from_metrics(scrape: Scrape) -> EngineSettings:
    """From the info gauges of a page (ours or stock vLLM's)."""
    cache = scrape.info.get(CACHE_INFO, {})
    engine = scrape.info.get(ENGINE_INFO, {})
    both = {**cache, **engine}
    return EngineSettings(
        block_size=_int(both.get("block_size")),
        max_model_len=_int(engine.get("max_model_len")),
        max_num_seqs=_int(engine.get("max_num_seqs")),
        max_num_batched_tokens=_int(engine.get("max_num_batched_tokens")),
        enable_prefix_caching=_bool(both.get("enable_prefix_caching")),
        enable_chunked_prefill=_bool(engine.get("enable_chunked_prefill")),
        preemption_mode=_str(engine.get("preemption_mode")),
        swap_space_gib=_float(both.get("swap_space_gib", cache.get("swap_space"))),
        gpu_memory_utilization=_float(both.get("gpu_memory_utilization")),
        num_gpu_blocks=_int(cache.get("num_gpu_blocks")),
    )


# EngineSettings fields that are `spec.engine` fields: their names are EngineSpec's, and
# their CRD names and defaults come from the server's option table (operator/spec.py).
SPEC_ENGINE_FIELDS = tuple(f.name for f in fields(EngineSettings) if f.name in SERVER_OPTIONS)
_BY_TYPE: dict[type, Callable[[Any], Any]] = {bool: _bool, int: _int, float: _float, str: _str}
# How a value from a spec (possibly a hand-written --spec file) becomes a setting: by the
# type of EngineSpec's default; a value of another type is unknown (None), not an error.
_CONVERT = {name: _BY_TYPE[type(getattr(EngineSpec(), name))] for name in SPEC_ENGINE_FIELDS}


def from_spec(spec: dict[str, Any] | None) -> EngineSettings:
    """From an LLMService spec (`spec.engine`, `spec.resources.gpuMemoryUtilization`).

    Parsed as the operator parses it (EngineSpec, ResourcesSpec), keeping only the fields
    the spec names: a default would hide the value the server reports it runs with.
    """
    spec = spec or {}
    engine_data = spec.get("engine") or {}
    resources_data = spec.get("resources") or {}
    engine = EngineSpec.from_dict(engine_data)
    values: dict[str, Any] = {
        name: _CONVERT[name](getattr(engine, name))
        for name in SPEC_ENGINE_FIELDS
        if engine_data.get(crd_key(SERVER_OPTIONS[name])) is not None
    }
    if resources_data.get("gpuMemoryUtilization") is not None:
        values["gpu_memory_utilization"] = _float(
            ResourcesSpec.from_dict(resources_data).gpu_memory_utilization
        )
    return EngineSettings(**values)
