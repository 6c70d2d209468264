"""LLMService spec -> the child manifests (Deployment, Service, PDB, ServiceMonitor). Pure.

Everything the pods do is decided here, from the spec alone, so golden files can pin it:
the server's exact CLI flags, GPU limits and tolerations, probes patient enough for a
model load, a grace period longer than the server's drain, a non-root security context,
and a rollout that never takes a serving pod down before its replacement is ready.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from llmservice.operator.adapter_spec import (
    ADAPTERS_MOUNT,
    MODELS_MOUNT,
    adapter_claims,
    claim_volume,
)
from llmservice.operator.network_policy import render_network_policy
from llmservice.operator.spec import API_VERSION, KIND, LLMServiceSpec
from llmservice.server.cli_args import API_KEY_ENV as _KEY_VARS
from llmservice.server.cli_args import BY_NAME, to_argv

PORT = BY_NAME["port"].default  # the server's default; rendered explicitly all the same
CONTAINER = "server"
TP_MASTER_PORT = 29500  # tensor-parallel ranks rendezvous inside the pod (torch.distributed)
CACHE_MOUNT = "/models-cache"
FIELD_MANAGER = "llmservice-operator"
# Server image for objects without spec.engine.image (operator flag --server-image).
DEFAULT_SERVER_IMAGE = "ghcr.io/llmservice/llmservice:0.1.0"
LABEL_SERVICE = "llmservice.dev/service"  # value: the LLMService name, on every child
API_KEY_ENV = _KEY_VARS[0]  # the server reads --api-key from it (LLMSERVICE_API_KEY)
# vLLM's switch for /v1/load_lora_adapter and /v1/unload_lora_adapter (both engines read it)
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# preStop: the pod is already out of the EndpointSlices (terminating) but keeps serving
# while kube-proxy, ingresses and client-side balancers catch up; only then SIGTERM
# starts the server's drain. A sleep action needs no binary in the image.
PRE_STOP_SLEEP_S = 5
SELECTOR_KEYS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")


@dataclass(frozen=True)
class Owner:
    """The LLMService a set of children belongs to."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Manifests:
    deployment: dict[str, Any]
    service: dict[str, Any]
    pdb: dict[str, Any] | None
    service_monitor: dict[str, Any] | None
    network_policy: dict[str, Any] | None = None  # spec.networkPolicy.enabled
    router: tuple[dict[str, Any], ...] = ()  # spec.router.enabled (render_router.py)
    gateway: tuple[dict[str, Any], ...] = ()  # spec.gateway.inferencePool (render_gateway.py)

    def all(self) -> list[dict[str, Any]]:
        children = (self.deployment, self.service, self.pdb, self.service_monitor, self.network_policy)
        return [m for m in children if m] + list(self.router) + list(self.gateway)


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "llmservice", "app.kubernetes.io/instance": name}


def selector_string(name: str) -> str:
    """The pod selector as `kubectl get -l` and the scale subresource want it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        LABEL_SERVICE: name,
    }


def endpoint(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{PORT}/v1"


def render(
    owner: Owner,
    spec: LLMServiceSpec,
    *,
    max_gpu_memory_utilization: float = 0.95,
    server_image: str = DEFAULT_SERVER_IMAGE,
    with_service_monitor: bool = False,
    _engine_dispatch: bool = True,
) -> Manifests:
    if _engine_dispatch and spec.engine.kind == "vllm":  # stock vLLM: render_vllm.py
        from llmservice.operator.render_gateway import render_gateway
        from llmservice.operator.render_vllm import render_vllm

        rendered = render_vllm(
            owner,
            spec,
            max_gpu_memory_utilization=max_gpu_memory_utilization,
            with_service_monitor=with_service_monitor,
        )
        return dataclasses.replace(rendered, gateway=render_gateway(owner, spec.gateway, spec.multi_node))
    service, router = render_service(owner), ()
    if spec.router.enabled and not spec.multi_node:  # the Service fronts the router, it the pods
        from llmservice.operator.render_router import render_router

        service, router = render_router(owner, spec, spec.router, service, server_image)
    return Manifests(
        deployment=render_deployment(owner, spec, max_gpu_memory_utilization, server_image),
        service=service,
        router=router,
        pdb=render_pdb(owner) if spec.replicas > 1 else None,
        service_monitor=render_service_monitor(owner) if with_service_monitor else None,
        network_policy=render_network_policy(_metadata(owner), selector_labels(owner.name), PORT, spec.network_policy),
        gateway=_gateway(owner, spec),
    )


def _gateway(owner: Owner, spec: LLMServiceSpec) -> tuple[dict[str, Any], ...]:
    from llmservice.operator.render_gateway import render_gateway

    return render_gateway(owner, spec.gateway, spec.multi_node)


def _metadata(owner: Owner) -> dict[str, Any]:
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": labels(owner.name),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def model_argument(spec: LLMServiceSpec) -> tuple[str, dict[str, Any]]:
    """The MODEL positional of `llmservice serve` and any options the source needs."""
    source = spec.model.source
    if source.startswith("pvc://"):
        _, _, path = source.removeprefix("pvc://").partition("/")
        return f"{MODELS_MOUNT}/{path}".rstrip("/"), {}
    if source.startswith("hf://"):
        return source, {"download_dir": CACHE_MOUNT}
    return source, {}


def server_options(owner: Owner, spec: LLMServiceSpec, max_utilization: float) -> dict[str, Any]:
    """The `llmservice serve` options of the pods, by their server/config.py names, in
    the order the golden files pin; the server's `to_argv` spells the flags."""
    e = spec.engine
    model, source_options = model_argument(spec)
    return {
        "model": model,
        "served_model_name": spec.model.served_name or owner.name,
        "host": "0.0.0.0",
        "port": PORT,
        "block_size": e.block_size,
        "max_model_len": e.max_model_len,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "max_num_seqs": e.max_num_seqs,
        "enable_prefix_caching": e.enable_prefix_caching,
        "enable_chunked_prefill": e.enable_chunked_prefill,
        "preemption_mode": e.preemption_mode,
        "swap_space": e.swap_space_gib,
        "gpu_memory_utilization": min(spec.resources.gpu_memory_utilization, max_utilization),
        "scheduling_policy": e.scheduling_policy,
        "dtype": e.dtype,
        "max_waiting_requests": e.max_waiting_requests,
        "shutdown_grace_seconds": e.shutdown_grace_seconds,
        "tensor_parallel_size": e.tensor_parallel_size,
        "kv_cache_memory_gib": e.kv_cache_memory_gib,  # None: left out
        "max_queue_delay_ms": e.max_queue_delay_ms,
        "max_step_ms": e.max_step_ms,  # None: left out
        "speculative_config": e.speculative.to_json() if e.speculative else None,
        "max_tokens_default": e.max_tokens_default,  # None: left out
        "request_timeout_s": e.request_timeout_s,
        "enable_sleep_mode": True if spec.sleep_when_idle else None,  # scaleToZero: sleep
        **lora_options(spec),
        **source_options,
    }


def lora_options(spec: LLMServiceSpec) -> dict[str, Any]:
    """With spec.adapters: --enable-lora and the slot limits (None: left out). No adapter
    is named on the command line: the operator loads them into running pods."""
    e, on = spec.engine, bool(spec.adapters)
    return {
        "enable_lora": True if on else None,
        "max_loras": e.max_loras if on else None,
        "max_lora_rank": e.max_lora_rank if on else None,
        "max_cpu_loras": e.max_cpu_loras if on else None,
    }


def uses_hub_cache(spec: LLMServiceSpec) -> bool:
    """The pod has the Hub cache volume and HF_HOME: an hf:// model, or any adapters (so
    an hf:// adapter added later downloads without a new pod template)."""
    return spec.model.source.startswith("hf://") or bool(spec.adapters)


def server_args(owner: Owner, spec: LLMServiceSpec, max_utilization: float) -> list[str]:
    """`llmservice serve` arguments: the options above, then spec.engine.extraArgs as given."""
    argv = to_argv(server_options(owner, spec, max_utilization))
    return ["serve", *argv, *spec.engine.extra_args]


def _volumes(spec: LLMServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    source = spec.model.source
    if source.startswith("pvc://"):
        claim = source.removeprefix("pvc://").partition("/")[0]
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": MODELS_MOUNT, "readOnly": True})
    if uses_hub_cache(spec):
        if spec.model.cache_claim_name:
            cache: dict[str, Any] = {
                "persistentVolumeClaim": {"claimName": spec.model.cache_claim_name}
            }
        else:
            cache = {"emptyDir": {"sizeLimit": spec.model.cache_size}}
        volumes.append({"name": "models-cache", **cache})
        mounts.append({"name": "models-cache", "mountPath": CACHE_MOUNT})
    for i, claim in enumerate(adapter_claims(spec.adapters, source)):
        volumes.append({"name": claim_volume(i), "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": claim_volume(i), "mountPath": f"{ADAPTERS_MOUNT}/{claim}", "readOnly": True})
    return volumes, mounts


def _env(spec: LLMServiceSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    if uses_hub_cache(spec):
        env.append({"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"})
        secret = spec.model.hf_token_secret
        if secret is not None:
            env.append(
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}},
                }
            )
    if spec.engine.kind != "vllm" and spec.engine.tensor_parallel_size > 1:
        # the bundled engine's ranks rendezvous on the pod's loopback (torch.distributed)
        env.append({"name": "MASTER_ADDR", "value": "127.0.0.1"})
        env.append({"name": "MASTER_PORT", "value": str(TP_MASTER_PORT)})
    if spec.adapters:
        env.append({"name": RUNTIME_LORA_ENV, "value": "true"})
    if spec.engine.api_key_secret is not None:
        ref = spec.engine.api_key_secret
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    # spec.engine.env wins over what the operator sets (HF_HOME, HOME, ...): one entry per
    # name, since server-side apply refuses a container whose env repeats a name.
    user = dict(spec.engine.env)  # a name given twice: the last value, as the kubelet does
    env = [e for e in env if e["name"] not in user]
    env += [{"name": name, "value": value} for name, value in user.items()]
    return env


def _resources(spec: LLMServiceSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    limits: dict[str, Any] = {"memory": spec.resources.memory}
    gpus = spec.gpus_per_replica
    if gpus > 0:
        requests[spec.resources.gpu.resource_name] = gpus
        limits[spec.resources.gpu.resource_name] = gpus
    return {"requests": requests, "limits": limits}


def _probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def render_pod_spec(
    owner: Owner,
    spec: LLMServiceSpec,
    max_utilization: float,
    server_image: str = DEFAULT_SERVER_IMAGE,
) -> dict[str, Any]:
    e, sched = spec.engine, spec.scheduling
    volumes, mounts = _volumes(spec)
    container = {
        "name": CONTAINER,
        "image": e.image or server_image,  # the object's own image wins over the operator's
        "imagePullPolicy": e.image_pull_policy,
        "command": ["llmservice"],
        "args": server_args(owner, spec, max_utilization),
        "env": _env(spec),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": _resources(spec),
        # The HTTP server starts only once the weights are loaded: give it startupTimeout.
        "startupProbe": _probe("/health", 10, math.ceil(e.startup_timeout_seconds / 10), 5),
        "livenessProbe": _probe("/health", 10, 3, 5),
        "readinessProbe": _probe("/ready", 5, 2, 3),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    tolerations: list[dict[str, Any]] = []
    if spec.gpus_per_replica > 0:
        tolerations.append(
            {"key": spec.resources.gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
        )
    tolerations += list(sched.tolerations)
    pod: dict[str, Any] = {
        # preStop, then the server's drain, then a margin: in-flight requests finish
        # before SIGKILL.
        "terminationGracePeriodSeconds": PRE_STOP_SLEEP_S + math.ceil(e.shutdown_grace_seconds) + 15,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
    }
    if tolerations:
        pod["tolerations"] = tolerations
    if sched.node_selector:
        pod["nodeSelector"] = dict(sched.node_selector)
    if sched.affinity:
        pod["affinity"] = sched.affinity
    if sched.priority_class_name:
        pod["priorityClassName"] = sched.priority_class_name
    return pod


def render_deployment(
    owner: Owner,
    spec: LLMServiceSpec,
    max_utilization: float = 0.95,
    server_image: str = DEFAULT_SERVER_IMAGE,
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": spec.engine.startup_timeout_seconds + 120,
            # Never drop a serving pod before its replacement passes /ready.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": labels(owner.name),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": render_pod_spec(owner, spec, max_utilization, server_image),
            },
        },
    }


def render_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_pdb(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}},
    }


def render_service_monitor(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner.name)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }
