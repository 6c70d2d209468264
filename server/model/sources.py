"""Which model references name a Hugging Face Hub repo (pure: no I/O beyond one exists()).

`hf://ORG/NAME`, `hf://ORG/NAME/file.gguf` (one GGUF file of the repo) and, as vLLM
takes it, a plain `ORG/NAME` that is not a local path. No torch, no huggingface_hub:
capabilities.py and the operator import this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HF_PREFIX = "hf://"
# config.json `architectures` the model code runs -> its family name (model/llama.py)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    # mixture of experts (server/model/moe.py)
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"^{_PART}/{_PART}$")


@dataclass(frozen=True)
class HubRef:
    """A Hub model: the repo, and the one file to fetch when it is a GGUF reference."""

    repo_id: str
    filename: str | None = None  # "model-q4.gguf": fetch only that file
    given: str = ""  # the reference as the user wrote it (error messages, served name)


class BadHubRefError(ValueError):
    pass


def dense_mlp_layers(cfg: dict, num_layers: int) -> list[int]:
    """The layers of a Qwen-MoE config.json that keep a dense MLP instead of experts, as
    transformers builds them: those in `mlp_only_layers`, and layer i when (i + 1) is not
    a multiple of `decoder_sparse_step`. The server's loader and the operator's VRAM plan
    both count layers with this."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = {int(n) for n in cfg.get("mlp_only_layers") or () if isinstance(n, int)}
    return [n for n in range(num_layers) if n in only or (n + 1) % step]


def architecture_problem(archs: list[str]) -> str | None:
    """Why config.json's `architectures` cannot run here, or None."""
    if any(a in ARCHITECTURES for a in archs):
        return None
    return f"architecture {archs} is not supported (supported: {', '.join(ARCHITECTURES)})"


def parse_hub_ref(model: str, exists=lambda p: Path(p).expanduser().exists()) -> HubRef | None:
    """The Hub repo a reference names, or None for a builtin or a local path.

    A plain ORG/NAME is a Hub repo only when no such local path exists (`exists` is
    injectable for tests). A malformed `hf://` reference raises BadHubRefError."""
    if model.startswith(HF_PREFIX):
        parts = model[len(HF_PREFIX):].strip("/").split("/")
        if len(parts) >= 2 and _REPO.match("/".join(parts[:2])):
            rest = "/".join(parts[2:])
            if not rest:
                return HubRef("/".join(parts[:2]), None, model)
            if rest.endswith(".gguf"):
                return HubRef("/".join(parts[:2]), rest, model)
        raise BadHubRefError(
            f"model {model!r} is not a Hub reference: expected hf://ORG/NAME or hf://ORG/NAME/FILE.gguf"
        )
    if _REPO.match(model) and not exists(model):
        return HubRef(model, None, model)
    return None
