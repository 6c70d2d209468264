"""A vLLM replica larger than one node: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1). Pure.

When tensorParallelSize x pipelineParallelSize is more than resources.gpu.perNode, one
replica is a group of `size` pods (GPUs / perNode, a whole node each), vLLM on Ray, the
existing distributed path; we render it, we do not build our own:
- the leader starts the Ray head, waits until the group's `LWS_GROUP_SIZE` nodes have
  joined, then runs `vllm serve` with both parallel sizes and the Ray executor;
- each worker joins with `ray start --address=$LWS_LEADER_ADDRESS:6379 --block` and
  serves no HTTP, so it has no port and no probes;
- `replicas` is the LLMService's spec.replicas (the autoscaler writes that through the
  /scale subresource and the reconciler applies it here, as for a Deployment);
- a pod failure recreates the whole group (`RecreateGroupOnPodRestart`): a Ray group
  with a missing rank cannot serve;
- the Service selects leaders only (LWS labels the leader `worker-index: "0"`).
The object takes the `deployment` slot of Manifests: it is the replicas' workload.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from llmservice.operator import render as r
from llmservice.operator.render_vllm import render_vllm_pod_spec, vllm_args
from llmservice.operator.spec import LLMServiceSpec

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
LWS_VERSION = "v0.7.0"  # hack/fetch-lws-crd.sh pins the same CRD for the tests
LWS_INSTALL = (
    "kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/"
    f"download/{LWS_VERSION}/manifests.yaml"
)
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on the leader
RAY_PORT = 6379


def leader_script(owner: r.Owner, spec: LLMServiceSpec, max_utilization: float) -> str:
    """Ray head, wait for every node of the group, then `vllm serve` in the foreground."""
    serve = shlex.join(["vllm", "serve", *vllm_args(owner, spec, max_utilization)])
    alive = (
        'import ray; ray.init(address="auto", logging_level="ERROR"); '
        'print(sum(1 for n in ray.nodes() if n["Alive"]))'
    )
    return (
        f"ray start --head --port={RAY_PORT} --include-dashboard=false && "
        f'until [ "$(python3 -c {shlex.quote(alive)} 2>/dev/null || echo 0)" -ge '
        '"$LWS_GROUP_SIZE" ]; do echo "waiting for the group\'s Ray nodes"; sleep 5; done && '
        f"exec {serve}"
    )


def worker_script() -> str:
    return f'exec ray start --address="$LWS_LEADER_ADDRESS:{RAY_PORT}" --block'


def _template(owner: r.Owner, pod: dict[str, Any], scrape: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": r.labels(owner.name)}
    if scrape:
        metadata["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(r.PORT),
            "prometheus.io/path": "/metrics",
        }
    return {"metadata": metadata, "spec": pod}


def leader_and_worker_pods(
    owner: r.Owner, spec: LLMServiceSpec, max_utilization: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    leader = render_vllm_pod_spec(owner, spec, max_utilization)
    (container,) = leader["containers"]
    container["command"] = ["/bin/bash", "-c"]
    container["args"] = [leader_script(owner, spec, max_utilization)]
    worker = copy.deepcopy(leader)
    (w,) = worker["containers"]
    w["args"] = [worker_script()]
    for key in ("ports", "startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
        w.pop(key, None)
    return leader, worker


def render_leader_worker_set(
    owner: r.Owner, spec: LLMServiceSpec, max_utilization: float
) -> dict[str, Any]:
    leader, worker = leader_and_worker_pods(owner, spec, max_utilization)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": r._metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            # As the Deployment: never take a serving group down before its replacement.
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "leaderWorkerTemplate": {
                "size": spec.group_size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(owner, leader, scrape=True),
                "workerTemplate": _template(owner, worker, scrape=False),
            },
        },
    }


def render_leader_service(owner: r.Owner) -> dict[str, Any]:
    service = r.render_service(owner)
    service["spec"]["selector"] = {**service["spec"]["selector"], WORKER_INDEX: "0"}
    return service


def render_multi_node(
    owner: r.Owner, spec: LLMServiceSpec, max_utilization: float, with_service_monitor: bool
) -> r.Manifests:
    base = r.render(
        owner,
        spec,
        max_gpu_memory_utilization=max_utilization,
        with_service_monitor=with_service_monitor,
        _engine_dispatch=False,
    )
    return r.Manifests(
        **{
            **base.__dict__,
            "deployment": render_leader_worker_set(owner, spec, max_utilization),
            "service": render_leader_service(owner),
        }
    )
