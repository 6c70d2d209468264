"""spec.adapters: LoRA adapters served on the base model, and where a pod reads each. Pure.

An adapter's `name` is the `model` clients ask for; its `source` is `hf://ORG/NAME[@REV]`
(the server downloads it into the pod's Hub cache), `pvc://CLAIM/PATH` (the claim is
mounted read-only under /adapters/CLAIM, or the model's own claim under /models), or an
absolute path inside the image or a volume. The pod template lists no adapter: the
operator loads them into running pods (adapter_sync.py), so editing the list never rolls
the pods; only a claim not mounted yet does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ADAPTERS_MOUNT = "/adapters"
MODELS_MOUNT = "/models"  # render.py's mount of a pvc:// model (same value)


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    source: str

    @property
    def claim(self) -> str | None:
        """The PersistentVolumeClaim of a pvc:// source."""
        if not self.source.startswith("pvc://"):
            return None
        return self.source.removeprefix("pvc://").partition("/")[0]


def adapters_from_list(data: list[dict[str, Any]] | None) -> tuple[AdapterSpec, ...]:
    return tuple(AdapterSpec(a["name"], a["source"]) for a in data or ())


def model_claim(model_source: str) -> str | None:
    if not model_source.startswith("pvc://"):
        return None
    return model_source.removeprefix("pvc://").partition("/")[0]


def adapter_claims(adapters: tuple[AdapterSpec, ...], model_source: str) -> list[str]:
    """The claims to mount for adapters (sorted: a stable pod template), the model's own
    claim left out (it is mounted at /models already)."""
    claims = {a.claim for a in adapters if a.claim}
    claims.discard(model_claim(model_source))
    return sorted(c for c in claims if c)


def claim_volume(index: int) -> str:
    """The pod volume name of the index-th adapter claim (claim names may be too long)."""
    return f"adapters-{index}"


def served_path(adapter: AdapterSpec, model_source: str, engine_kind: str = "llmservice") -> str:
    """The `lora_path` the operator sends to /v1/load_lora_adapter for this adapter.

    The llmservice server takes `hf://ORG/NAME[@REV]` itself; vLLM takes a Hub id
    (`ORG/NAME`) and downloads it; a pvc:// source is the path where its claim is mounted.
    """
    source = adapter.source
    if source.startswith("hf://"):
        return source.removeprefix("hf://") if engine_kind == "vllm" else source
    claim = adapter.claim
    if claim is None:
        return source
    path = source.removeprefix(f"pvc://{claim}").strip("/")
    root = MODELS_MOUNT if claim == model_claim(model_source) else f"{ADAPTERS_MOUNT}/{claim}"
    return f"{root}/{path}".rstrip("/")


def mounted_adapter_claims(template: dict[str, Any] | None) -> set[str]:
    """The adapter claims a Deployment's pod template mounts (its adapters-N volumes)."""
    volumes = ((template or {}).get("spec") or {}).get("volumes") or []
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes
        if v.get("name", "").startswith("adapters-") and "persistentVolumeClaim" in v
    }


def claims_rollout_message(old_template: dict[str, Any] | None, new_template: dict[str, Any] | None) -> str | None:
    """The Event text when a pvc:// adapter brings a claim the pods do not mount yet, else None."""
    new = sorted(mounted_adapter_claims(new_template) - mounted_adapter_claims(old_template))
    if not new:
        return None
    where = ", ".join(f"{c} at {ADAPTERS_MOUNT}/{c}" for c in new)
    return (
        f"mounting the adapter claim {where}: a new volume needs a new pod template, so the pods roll out "
        "once; adapters on claims already mounted, hf:// and image paths load into running pods"
    )
