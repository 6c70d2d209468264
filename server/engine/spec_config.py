"""`--speculative-config JSON`, vLLM's keys, parsed and checked with clear messages.

No third-party imports: server/config.py validates the flag with it, and the operator
(no torch) imports that.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

METHODS = ("ngram", "draft_model", "layer_skip")
_KEYS = {
    "method",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "model",
    "num_layers",
    "disable_by_batch_size",
}
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 5  # ngram
    prompt_lookup_min: int = 5
    model: str | None = None  # draft_model: same tokenizer as the target
    num_layers: int | None = None  # layer_skip: the target's first L layers draft
    # batch size from which speculation is off; None: from the measured step costs
    disable_by_batch_size: int | None = None


def _int(data: dict, key: str, low: int, high: int | None = None) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"--speculative-config: {key} must be an integer {bound}, got {value!r}")
    return value


@functools.lru_cache(maxsize=8)
def parse_speculative_config(text: str | None) -> SpeculativeConfig | None:
    """The config a JSON object describes; None for no flag. ValueError names the mistake.
    Cached (the result is frozen): validation, the memory plan and the speculator each ask."""
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"--speculative-config is not valid JSON ({e.msg} at column {e.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            "--speculative-config must be a JSON object, e.g. "
            '{"method": "ngram", "num_speculative_tokens": 4}'
        )
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"--speculative-config: unknown keys {unknown}; known: {sorted(_KEYS)}")
    method = data.get("method")
    if method not in METHODS:
        raise ValueError(
            f"--speculative-config: method must be one of {list(METHODS)}, got {method!r}"
        )
    k = _int(data, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    if k is None:
        raise ValueError("--speculative-config: num_speculative_tokens is required")
    lookup_max = _int(data, "prompt_lookup_max", 1)
    lookup_min = _int(data, "prompt_lookup_min", 1)
    if lookup_max is None and lookup_min is None:
        lookup_max = lookup_min = 5  # vLLM's default
    lookup_max = lookup_max if lookup_max is not None else lookup_min
    lookup_min = lookup_min if lookup_min is not None else lookup_max
    if lookup_min > lookup_max:
        raise ValueError(
            f"--speculative-config: prompt_lookup_min {lookup_min} exceeds prompt_lookup_max {lookup_max}"
        )
    model = data.get("model")
    if method == "draft_model" and (not isinstance(model, str) or not model):
        raise ValueError(
            '--speculative-config: method "draft_model" needs "model" (the draft, same tokenizer)'
        )
    num_layers = _int(data, "num_layers", 1)
    if method == "layer_skip" and num_layers is None:
        raise ValueError(
            '--speculative-config: method "layer_skip" needs "num_layers" (the target\'s first L layers draft)'
        )
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        prompt_lookup_max=lookup_max,
        prompt_lookup_min=lookup_min,
        model=model if method == "draft_model" else None,
        num_layers=num_layers if method == "layer_skip" else None,
        disable_by_batch_size=_int(data, "disable_by_batch_size", 1),
    )
