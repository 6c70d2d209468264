"""Load a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)
into per-(layer, module) A/B matrices, refusing what the server cannot serve."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

SUPPORTED_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoRAAdapterError(ValueError):
    """An adapter the server refuses; the message names the offending value."""


@dataclass
class LoRAAdapter:
    name: str
    rank: int
    scaling: float  # lora_alpha / r (or / sqrt(r) with use_rslora)
    base_model: str | None
    # (layer index, module name) -> (A: [rank, in], B: [out, rank])
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def load_peft_adapter(name: str, path: str | Path, max_rank: int) -> LoRAAdapter:
    """Parse and validate an adapter; raises LoRAAdapterError on bad input."""
    root = Path(path)
    try:
        config = json.loads((root / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LoRAAdapterError(f"adapter {name!r}: cannot read {root / 'adapter_config.json'}: {err}") from err
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAAdapterError(f"adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = int(config.get("r", 0))
    if not 0 < rank <= max_rank:
        raise LoRAAdapterError(f"adapter {name!r}: rank {rank} is above --max-lora-rank {max_rank}")
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unknown = sorted(set(targets) - SUPPORTED_MODULES)
    if unknown:
        raise LoRAAdapterError(f"adapter {name!r}: target modules {unknown} are not LoRA-servable projections")
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    try:
        tensors = load_file(str(root / "adapter_model.safetensors"))
    except (OSError, SafetensorError) as err:
        raise LoRAAdapterError(f"adapter {name!r}: cannot read adapter_model.safetensors: {err}") from err
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise LoRAAdapterError(f"adapter {name!r}: unexpected tensor {key!r}")
        layer, module, which = int(match[1]), match[2], match[3]
        parts.setdefault((layer, module), {})[which] = tensor.float()
    weights = {}
    for where, ab in parts.items():
        if set(ab) != {"A", "B"} or ab["A"].shape[0] != rank or ab["B"].shape[1] != rank:
            raise LoRAAdapterError(f"adapter {name!r}: layer {where[0]} {where[1]} has malformed lora_A/lora_B")
        weights[where] = (ab["A"], ab["B"])
    return LoRAAdapter(name, rank, scaling, config.get("base_model_name_or_path"), weights)
