"""What this server build can run, decided in one place for `serve` and the operator.

`llmservice serve` refuses at start what `unsupported` names, and the operator refuses to
roll it out (Ready=False, reason UnsupportedByEngine), so the two cannot disagree and the
operator never creates a pod that exits at start for a reason it could have known.
Downloads from the Hugging Face Hub and tensor parallelism are switched on here. Pure: no
I/O, no torch (the operator image imports it).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmservice.server.model.registry import BUILTIN_PREFIX, builtin_names
from llmservice.server.model.sources import BadHubRefError, parse_hub_ref

HF_PREFIX = "hf://"
DOWNLOADS_FROM_HUB = True  # hf://org/name: server/model/hub.py fetches it before start
# the bundled engine shards a model over N ranks in one pod (server/engine/tp_*.py); whether
# a model splits N ways (heads, KV heads, intermediate size) is checked when it loads
MAX_TENSOR_PARALLEL_SIZE = 8
TENSOR_PARALLEL_SIZES = tuple(range(1, MAX_TENSOR_PARALLEL_SIZE + 1))


@dataclass(frozen=True)
class Unsupported:
    """Why a value cannot run, in the server's own terms; callers word the fix for their
    audience (a flag for `serve`, an LLMService field for the operator)."""

    arg: str  # the option in config.py: "model", "tensor_parallel_size"
    value: object
    reason: str
    supported: str  # what this build runs instead


LOCAL_FORMS = "a .gguf file or an HF model directory"


def model_unsupported(model: str) -> Unsupported | None:
    """Sources this build cannot resolve; a local path is checked when it is loaded."""
    known = ", ".join(builtin_names())
    if model.startswith(HF_PREFIX):
        if DOWNLOADS_FROM_HUB:
            try:
                parse_hub_ref(model)
            except BadHubRefError:
                return Unsupported("model", model, "not a Hub model reference",
                                   "hf://ORG/NAME or hf://ORG/NAME/FILE.gguf")
            return None
        return Unsupported(
            "model", model, "this server cannot download from the Hugging Face Hub yet",
            f"{known}, or {LOCAL_FORMS}",
        )
    if model.startswith(BUILTIN_PREFIX) and model not in builtin_names():
        return Unsupported("model", model, "no builtin model of that name", known)
    scheme, sep, _ = model.partition("://")
    if sep:
        return Unsupported(
            "model", model, f"unknown model source scheme {scheme}://", f"{known}, or {LOCAL_FORMS}"
        )
    return None


def tensor_parallel_unsupported(size: int) -> Unsupported | None:
    if size in TENSOR_PARALLEL_SIZES:
        return None
    sizes = f"1 to {MAX_TENSOR_PARALLEL_SIZE}"
    return Unsupported(
        "tensor_parallel_size", size,
        f"this engine shards a model over at most {MAX_TENSOR_PARALLEL_SIZE} ranks in one pod", sizes,
    )


def unsupported(model: str, tensor_parallel_size: int) -> Unsupported | None:
    """The first thing this build cannot run, or None when it can start."""
    return model_unsupported(model) or tensor_parallel_unsupported(tensor_parallel_size)
