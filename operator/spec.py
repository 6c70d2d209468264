"""The LLMService spec as typed data, with the same defaults as the CRD schema.

The API server fills defaults from `crds/llmservice.yaml` before the operator ever sees
an object; the defaults here only matter for objects stored before a default existed.
The engine fields that are `llmservice serve` options take their CRD name and default
from the server's own definition (server/config.py); tests keep the CRD equal to both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmservice.operator.adapter_spec import AdapterSpec, adapters_from_list
from llmservice.operator.catalog import Architecture
from llmservice.operator.gateway_spec import GatewaySpec
from llmservice.operator.network_policy import NetworkPolicySpec
from llmservice.operator.router_spec import RouterSpec
from llmservice.server.cli_args import BY_NAME

GROUP = "llmservice.dev"
VERSION = "v1alpha1"
PLURAL = "llmservices"
KIND = "LLMService"
API_VERSION = f"{GROUP}/{VERSION}"


def _get(data: dict[str, Any] | None, key: str, default: Any) -> Any:
    if not data:
        return default
    value = data.get(key)
    return default if value is None else value


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "token"


@dataclass(frozen=True)
class ModelSpec:
    source: str
    served_name: str | None = None
    catalog_name: str | None = None
    architecture: Architecture | None = None
    parameter_count: int | None = None
    hf_token_secret: SecretKeyRef | None = None
    cache_claim_name: str | None = None
    cache_size: str = "50Gi"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        arch = data.get("architecture")
        secret = data.get("hfTokenSecretRef")
        return cls(
            source=data["source"],
            served_name=data.get("servedName"),
            catalog_name=data.get("catalogName"),
            architecture=_architecture(arch, data.get("parameterCount")) if arch else None,
            parameter_count=data.get("parameterCount"),
            hf_token_secret=SecretKeyRef(secret["name"], _get(secret, "key", "token"))
            if secret
            else None,
            cache_claim_name=data.get("cacheClaimName"),
            cache_size=_get(data, "cacheSize", "50Gi"),
        )


def _architecture(data: dict[str, Any], parameter_count: int | None) -> Architecture:
    heads = data["numAttentionHeads"]
    return Architecture(
        num_layers=data["numLayers"],
        hidden_size=data["hiddenSize"],
        num_attention_heads=heads,
        num_key_value_heads=_get(data, "numKeyValueHeads", heads),
        head_dim=_get(data, "headDim", data["hiddenSize"] // heads),
        intermediate_size=data["intermediateSize"],
        vocab_size=data["vocabSize"],
        tie_word_embeddings=_get(data, "tieWordEmbeddings", False),
        num_experts=_get(data, "numExperts", 1),
        num_experts_per_token=_get(data, "numExpertsPerToken", 1),
        attention_bias=_get(data, "attentionBias", False),
        parameter_count=parameter_count,
        num_dense_layers=_get(data, "numDenseLayers", 0),
        dense_intermediate_size=data.get("denseIntermediateSize"),
        shared_expert_intermediate_size=_get(data, "sharedExpertIntermediateSize", 0),
        qk_norm=_get(data, "qkNorm", False),
    )


# EngineSpec field -> the `llmservice serve` option it sets (server/config.py names the
# option's CRD field and default). The CRD's other engine fields are the operator's own.
SERVER_OPTIONS = {
    "block_size": "block_size",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "preemption_mode": "preemption_mode",
    "swap_space_gib": "swap_space",
    "scheduling_policy": "scheduling_policy",
    "dtype": "dtype",
    "tensor_parallel_size": "tensor_parallel_size",
    "kv_cache_memory_gib": "kv_cache_memory_gib",
    "max_waiting_requests": "max_waiting_requests",
    "max_queue_delay_ms": "max_queue_delay_ms",
    "max_step_ms": "max_step_ms",
    "shutdown_grace_seconds": "shutdown_grace_seconds",
    "max_tokens_default": "max_tokens_default",
    "request_timeout_s": "request_timeout_s",
    "max_loras": "max_loras",  # rendered only with spec.adapters (render.py)
    "max_lora_rank": "max_lora_rank",
    "max_cpu_loras": "max_cpu_loras",
}
OPERATOR_ENGINE_FIELDS = (
    "image", "imagePullPolicy", "startupTimeoutSeconds", "extraArgs", "env", "apiKeySecretRef",
    "kind", "pipelineParallelSize",  # engine.kind: vllm (render_vllm.py, render_lws.py)
    "speculative",  # rendered to --speculative-config (SpeculativeSpec)
)


def crd_key(option: str) -> str:
    """`block_size` -> `blockSize`, the option's field under spec.engine."""
    crd = BY_NAME[option].arg.crd
    assert crd and crd.startswith("engine."), option
    return crd.removeprefix("engine.")


def _default(option: str) -> Any:
    return BY_NAME[option].crd_default


@dataclass(frozen=True)
class SpeculativeSpec:
    """spec.engine.speculative: the CRD's camelCase fields, rendered as vLLM's JSON keys."""

    method: str
    tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    num_layers: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SpeculativeSpec | None:
        if not data:
            return None
        return cls(
            method=data["method"],
            tokens=int(data["tokens"]),
            prompt_lookup_max=data.get("promptLookupMax"),
            prompt_lookup_min=data.get("promptLookupMin"),
            model=data.get("model"),
            num_layers=data.get("numLayers"),
        )

    def to_json(self) -> str:
        """The --speculative-config value (keys left unset are left out: the server's defaults)."""
        keys = {
            "method": self.method,
            "num_speculative_tokens": self.tokens,
            "prompt_lookup_max": self.prompt_lookup_max,
            "prompt_lookup_min": self.prompt_lookup_min,
            "model": self.model,
            "num_layers": self.num_layers,
        }
        return json.dumps({k: v for k, v in keys.items() if v is not None}, separators=(",", ":"))


@dataclass(frozen=True)
class EngineSpec:
    # None: the operator's --server-image (the CRD has no default, so a cluster-wide
    # image set by the Helm chart applies to every object that does not pin its own).
    image: str | None = None
    image_pull_policy: str = "IfNotPresent"
    block_size: int = _default("block_size")
    max_model_len: int = _default("max_model_len")
    max_num_batched_tokens: int = _default("max_num_batched_tokens")
    max_num_seqs: int = _default("max_num_seqs")
    enable_prefix_caching: bool = _default("enable_prefix_caching")
    enable_chunked_prefill: bool = _default("enable_chunked_prefill")
    preemption_mode: str = _default("preemption_mode")
    swap_space_gib: float = _default("swap_space")
    scheduling_policy: str = _default("scheduling_policy")
    dtype: str = _default("dtype")
    tensor_parallel_size: int = _default("tensor_parallel_size")
    kv_cache_memory_gib: float | None = _default("kv_cache_memory_gib")
    max_waiting_requests: int = _default("max_waiting_requests")
    max_queue_delay_ms: float | None = _default("max_queue_delay_ms")
    max_step_ms: float | None = _default("max_step_ms")
    shutdown_grace_seconds: float = _default("shutdown_grace_seconds")
    max_tokens_default: int | None = _default("max_tokens_default")
    request_timeout_s: float | None = _default("request_timeout_s")
    max_loras: int = _default("max_loras")
    max_lora_rank: int = _default("max_lora_rank")
    max_cpu_loras: int | None = _default("max_cpu_loras")
    # The pods get the key as LLMSERVICE_API_KEY from this Secret (never on the command line).
    api_key_secret: SecretKeyRef | None = None
    startup_timeout_seconds: int = 900
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    kind: str = "llmservice"  # or "vllm": stock `vllm serve` (render_vllm.py)
    pipeline_parallel_size: int = 1  # vllm only; TP x PP past one node -> LeaderWorkerSet
    speculative: SpeculativeSpec | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EngineSpec:
        d = cls()
        options = {
            name: _get(data, crd_key(option), getattr(d, name))
            for name, option in SERVER_OPTIONS.items()
        }
        secret = _get(data, "apiKeySecretRef", None)
        return cls(
            image=_get(data, "image", None) or None,
            api_key_secret=SecretKeyRef(secret["name"], _get(secret, "key", "api-key")) if secret else None,
            image_pull_policy=_get(data, "imagePullPolicy", d.image_pull_policy),
            **options,
            startup_timeout_seconds=_get(data, "startupTimeoutSeconds", d.startup_timeout_seconds),
            extra_args=tuple(_get(data, "extraArgs", ())),
            env=tuple((e["name"], str(e.get("value", ""))) for e in _get(data, "env", ())),
            kind=_get(data, "kind", d.kind),
            pipeline_parallel_size=_get(data, "pipelineParallelSize", d.pipeline_parallel_size),
            speculative=SpeculativeSpec.from_dict(_get(data, "speculative", None)),
        )

    def server_options(self) -> dict[str, Any]:
        """The `llmservice serve` options this spec sets, by their server/config.py names."""
        return {option: getattr(self, name) for name, option in SERVER_OPTIONS.items()}


@dataclass(frozen=True)
class GPUSpec:
    count: int | None = None  # None: one GPU per tensor-parallel rank
    resource_name: str = "nvidia.com/gpu"
    memory_gib: float = 80.0
    per_node: int = 8  # GPUs one node offers; more than that per replica -> LeaderWorkerSet


@dataclass(frozen=True)
class ResourcesSpec:
    gpu: GPUSpec = field(default_factory=GPUSpec)
    gpu_memory_utilization: float = 0.90
    cpu: str = "4"
    memory: str = "16Gi"
    shm_size: str = "2Gi"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ResourcesSpec:
        d = cls()
        gpu = _get(data, "gpu", {})
        return cls(
            gpu=GPUSpec(
                count=gpu.get("count"),
                resource_name=_get(gpu, "resourceName", d.gpu.resource_name),
                memory_gib=float(_get(gpu, "memoryGiB", d.gpu.memory_gib)),
                per_node=int(_get(gpu, "perNode", d.gpu.per_node)),
            ),
            gpu_memory_utilization=float(
                _get(data, "gpuMemoryUtilization", d.gpu_memory_utilization)
            ),
            cpu=str(_get(data, "cpu", d.cpu)),
            memory=str(_get(data, "memory", d.memory)),
            shm_size=str(_get(data, "shmSize", d.shm_size)),
        )


@dataclass(frozen=True)
class SchedulingSpec:
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SchedulingSpec:
        return cls(
            node_selector=dict(_get(data, "nodeSelector", {})),
            tolerations=tuple(_get(data, "tolerations", ())),
            affinity=_get(data, "affinity", None),
            priority_class_name=_get(data, "priorityClassName", None),
        )


def sleeps_when_idle(autoscaling: dict[str, Any]) -> bool:
    """Autoscaling to zero with `scaleToZero: sleep`: the pods need --enable-sleep-mode."""
    return (
        bool(autoscaling.get("enabled", False))
        and autoscaling.get("minReplicas") == 0
        and autoscaling.get("scaleToZero") == "sleep"
    )


@dataclass(frozen=True)
class LLMServiceSpec:
    model: ModelSpec
    engine: EngineSpec = field(default_factory=EngineSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    replicas: int = 1
    network_policy: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    router: RouterSpec = field(default_factory=RouterSpec)  # router_spec.py, render_router.py
    gateway: GatewaySpec = field(default_factory=GatewaySpec)  # render_gateway.py
    adapters: tuple[AdapterSpec, ...] = ()  # LoRA adapters, loaded live (adapter_sync.py)
    sleep_when_idle: bool = False  # autoscaling to zero by sleeping (--enable-sleep-mode)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMServiceSpec:
        return cls(
            network_policy=NetworkPolicySpec.from_dict(data.get("networkPolicy")),
            model=ModelSpec.from_dict(data["model"]),
            engine=EngineSpec.from_dict(data.get("engine")),
            resources=ResourcesSpec.from_dict(data.get("resources")),
            scheduling=SchedulingSpec.from_dict(data.get("scheduling")),
            replicas=_get(data, "replicas", 1),
            router=RouterSpec.from_dict(data),
            gateway=GatewaySpec.from_dict(data.get("gateway")),
            adapters=adapters_from_list(data.get("adapters")),
            sleep_when_idle=sleeps_when_idle(data.get("autoscaling") or {}),
        )

    @property
    def gpus_per_replica(self) -> int:
        """GPUs each pod asks for: one per model-parallel rank unless set (0 = CPU); a
        replica past one node (multi_node) asks for a whole node's `perNode` per pod."""
        count = self.resources.gpu.count
        if count is not None:
            return count
        return min(self.model_parallel_gpus, self.resources.gpu.per_node)

    @property
    def model_parallel_gpus(self) -> int:
        """GPUs one replica shards the model over: tensor x pipeline parallel size."""
        return self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size

    @property
    def multi_node(self) -> bool:
        """vLLM on Ray across a LeaderWorkerSet group: one replica needs more than a node."""
        return self.engine.kind == "vllm" and self.model_parallel_gpus > self.resources.gpu.per_node

    @property
    def group_size(self) -> int:
        """Pods per replica (LWS `size`): the GPU count over the GPUs of one node."""
        if not self.multi_node:
            return 1
        return -(-self.model_parallel_gpus // self.resources.gpu.per_node)
