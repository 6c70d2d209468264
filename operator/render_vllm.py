"""`spec.engine.kind: vllm`: the same children, but the pods run stock `vllm serve`. Pure.

The operator's value (VRAM margin, preemption-aware autoscaler, advisor, the status that
explains itself) does not depend on the engine: vLLM's metric names are ours, so the
pods are vLLM's official OpenAI server as it ships. What changes from render.py:
- the image (VLLM_IMAGE unless spec.engine.image) and the command `vllm serve MODEL`;
- the flags: only those both engines share, under the same names (our server took
  vLLM's, so `to_argv` spells them), plus `--pipeline-parallel-size`. The flags only
  ours has are refused by the CRD's CEL rules before an object is stored
  (LLMSERVICE_ONLY; docs/vllm.md), and `extraArgs` pass through as given;
- the model: `hf://org/name` becomes `org/name`, downloaded by vLLM itself into the
  cache volume (HF_HOME) with HF_TOKEN from the Secret; `pvc://claim/path` the path
  where the claim is mounted;
- the probes: vLLM has `/health` only (200 once the engine is up), so readiness reads it
  too, and the startup probe waits `startupTimeoutSeconds` for the download and load.
Past one node (spec.multi_node) the pod spec goes into a LeaderWorkerSet (render_lws.py).
"""

from __future__ import annotations

import copy
from typing import Any

from llmservice.operator import render as r
from llmservice.operator.spec import LLMServiceSpec
from llmservice.server.cli_args import to_argv

# vLLM's official OpenAI-compatible server image; its `vllm serve` arguments are the
# fixture tests/unit/operator/fixtures/vllm-serve-args.txt (same version).
VLLM_VERSION = "v0.11.0"
VLLM_IMAGE = f"vllm/vllm-openai:{VLLM_VERSION}"
VLLM_API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads --api-key from it

# server/config.py options both engines have, under the same flag: rendered for vLLM.
SHARED_OPTIONS = (
    "served_model_name",
    "host",
    "port",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "swap_space",
    "gpu_memory_utilization",
    "scheduling_policy",
    "dtype",
    "tensor_parallel_size",
    "enable_lora",  # with spec.adapters only (render.lora_options)
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
)
# server/config.py options with an LLMService field that `vllm serve` does not have.
# The CRD refuses them with engine.kind vllm (x-kubernetes-validations on engine), except
# shutdown_grace_seconds: it also sets the pod's grace period, which still applies.
LLMSERVICE_ONLY = (
    "preemption_mode",
    "kv_cache_memory_gib",
    "max_waiting_requests",
    "max_queue_delay_ms",
    "max_step_ms",
    "max_tokens_default",
    "request_timeout_s",
    "shutdown_grace_seconds",
)


def model_argument(spec: LLMServiceSpec) -> str:
    """The MODEL positional of `vllm serve`: a Hub id vLLM downloads, or a mounted path."""
    source = spec.model.source
    if source.startswith("hf://"):
        return source.removeprefix("hf://")
    if source.startswith("pvc://"):
        _, _, path = source.removeprefix("pvc://").partition("/")
        return f"{r.MODELS_MOUNT}/{path}".rstrip("/")
    raise ValueError(f"{source!r}: engine.kind vllm serves hf:// or pvc:// models")


def vllm_args(owner: r.Owner, spec: LLMServiceSpec, max_utilization: float) -> list[str]:
    """`vllm serve` arguments (after `serve`): MODEL, the shared flags, the pipeline
    size, Ray across nodes, then spec.engine.extraArgs as given."""
    options = r.server_options(owner, spec, max_utilization)
    shared = {name: options[name] for name in SHARED_OPTIONS}
    argv = [model_argument(spec), *to_argv(shared)]
    argv += ["--pipeline-parallel-size", str(spec.engine.pipeline_parallel_size)]
    if spec.multi_node:
        argv += ["--distributed-executor-backend", "ray"]
    return [*argv, *spec.engine.extra_args]


def _env(spec: LLMServiceSpec, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our env, with the API key under vLLM's variable name."""
    return [{**e, "name": VLLM_API_KEY_ENV} if e["name"] == r.API_KEY_ENV else e for e in base]


def vllm_container(
    owner: r.Owner, spec: LLMServiceSpec, max_utilization: float, base: dict[str, Any]
) -> dict[str, Any]:
    """The server container of render.py turned into vLLM's."""
    c = copy.deepcopy(base)
    c["image"] = spec.engine.image or VLLM_IMAGE
    c["command"] = ["vllm", "serve"]
    c["args"] = vllm_args(owner, spec, max_utilization)
    c["env"] = _env(spec, c["env"])
    c["readinessProbe"] = r._probe("/health", 5, 2, 3)  # vLLM has no /ready
    return c


def render_vllm_pod_spec(
    owner: r.Owner, spec: LLMServiceSpec, max_utilization: float
) -> dict[str, Any]:
    pod = r.render_pod_spec(owner, spec, max_utilization)
    pod["containers"] = [vllm_container(owner, spec, max_utilization, pod["containers"][0])]
    return pod


def render_vllm(
    owner: r.Owner,
    spec: LLMServiceSpec,
    *,
    max_gpu_memory_utilization: float = 0.95,
    with_service_monitor: bool = False,
    **_: Any,
) -> r.Manifests:
    """The children of a kind: vllm LLMService; `server_image` (ours) does not apply."""
    if spec.multi_node:
        from llmservice.operator.render_lws import render_multi_node

        return render_multi_node(owner, spec, max_gpu_memory_utilization, with_service_monitor)
    base = r.render(
        owner,
        spec,
        max_gpu_memory_utilization=max_gpu_memory_utilization,
        with_service_monitor=with_service_monitor,
        _engine_dispatch=False,
    )
    template = base.deployment["spec"]["template"]
    template["spec"] = render_vllm_pod_spec(owner, spec, max_gpu_memory_utilization)
    return base
