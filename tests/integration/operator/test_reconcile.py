"""The real operator process (`kopf run`) against the API emulator, over HTTP."""

from __future__ import annotations

import time

import kubernetes
import pytest
import yaml

from tests.integration.operator.conftest import ROOT
from tests.support.clients import llmservice, wait_until
from tests.support.kubelet import Node

# Weights on a PVC: the server cannot download hf:// sources yet (UnsupportedByEngine).
GPU_8B = {
    "model": {"source": "pvc://weights/Meta-Llama-3-8B-Instruct", "catalogName": "llama-3-8b"},
    "resources": {"gpu": {"count": 1, "memoryGiB": 80}},
}


def owned_by(child: dict, owner: dict) -> bool:
    refs = child["metadata"].get("ownerReferences") or []
    return any(r["uid"] == owner["metadata"]["uid"] and r.get("controller") for r in refs)


def test_apply_creates_owned_deployment_and_service(env):
    """The create handler applies the children (how fast is a benchmark's question: a
    loaded machine may take seconds, so the wait is generous)."""
    k = env.kubectl
    created = k.apply(llmservice("quick", **GPU_8B))
    wait_until(lambda: k.deployment("quick") and k.service("quick"), timeout=60, interval=0.05)
    assert owned_by(k.deployment("quick"), created)
    assert owned_by(k.service("quick"), created)
    assert k.pdb("quick") is None  # one replica: no disruption budget


def test_status_progresses_to_ready(env):
    k = env.kubectl
    k.apply(llmservice("ready", replicas=2, **GPU_8B))
    status = wait_until(
        lambda: (s := k.llms("ready").get("status"))
        and s.get("readyReplicas") == 2
        and s.get("observedGeneration") == 1  # pods can be ready before the reconcile ends
        and s
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Ready"]["reason"] == "AllReplicasReady"
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["VRAMFit"]["status"] == "True"
    assert conditions["CapacityPending"]["status"] == "False"
    assert status["replicas"] == 2
    assert (
        status["selector"] == "app.kubernetes.io/instance=ready,app.kubernetes.io/name=llmservice"
    )
    assert status["endpoint"] == "http://ready.default.svc:8000/v1"
    assert status["memoryPlan"]["estimatedKVBlocks"] > 0
    assert k.pdb("ready") is not None
    pods = k.pods("ready")
    assert len(pods) == 2 and all(p["status"]["podIP"].startswith("127.0.0.") for p in pods)
    assert all(p["spec"]["nodeName"] == "gpu-node-1" for p in pods)
    reasons = [r for _, r, _ in k.events("ready")]
    assert reasons.count("Created") >= 3  # Deployment, Service, PodDisruptionBudget
    assert "Ready" in reasons


def test_spec_change_rolls_the_deployment(env):
    k = env.kubectl
    k.apply(llmservice("rolling", **GPU_8B))
    wait_until(lambda: k.condition("rolling", "Ready").get("status") == "True")
    before = k.deployment("rolling")
    old_pods = {p["metadata"]["name"] for p in k.pods("rolling")}
    k.patch_llms("rolling", {"spec": {"engine": {"maxNumSeqs": 32}}})
    after = wait_until(
        lambda: (
            (d := k.deployment("rolling"))["metadata"]["generation"]
            > before["metadata"]["generation"]
            and d
        )
    )
    args = after["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "32"

    def rolled() -> bool:
        pods = k.pods("rolling")
        names = {p["metadata"]["name"] for p in pods}
        return (
            bool(names)
            and not names & old_pods
            and k.condition("rolling", "Ready")["status"] == "True"
            # the new pods can be Ready before the reconcile that rolled them publishes
            and k.llms("rolling")["status"].get("observedGeneration") == 2
        )

    wait_until(rolled)
    llms = k.llms("rolling")
    assert llms["metadata"]["generation"] == 2 and llms["status"]["observedGeneration"] == 2
    assert k.condition("rolling", "Progressing")["reason"] == "RolloutComplete"
    assert any(
        r == "Updated" and "rolling out generation 2" in m for _, r, m in k.events("rolling")
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"resources": {"gpuMemoryUtilization": 1.0}},
            "gpuMemoryUtilization must lie in [0.5, 0.95]",
        ),
        (
            {"autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
            "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
        ),
    ],
)
def test_api_rejects_invalid_specs_with_the_cel_message(env, spec, message):
    with pytest.raises(kubernetes.client.ApiException) as caught:
        env.kubectl.apply(llmservice("invalid", **spec))
    assert caught.value.status == 422
    assert message in caught.value.body
    assert env.kubectl.deployment("invalid") is None


def test_70b_on_one_24gb_gpu_is_refused(env):
    k = env.kubectl
    k.apply(
        llmservice(
            "too-big",
            model={"source": "pvc://weights/Meta-Llama-3-70B", "catalogName": "llama-3-70b"},
            resources={"gpu": {"count": 1, "memoryGiB": 24}},
        )
    )
    vram = wait_until(lambda: k.condition("too-big", "VRAMFit"))
    assert vram["status"] == "False" and vram["reason"] == "InsufficientVRAM"
    assert "largest maxModelLen that fits: 0" in vram["message"]
    assert "smallest GPU count that fits: 8" in vram["message"]
    assert k.condition("too-big", "Ready")["reason"] == "VRAMDoesNotFit"
    assert k.llms("too-big")["status"]["observedGeneration"] == 1
    assert any(t == "Warning" and r == "VRAMRefused" for t, r, _ in k.events("too-big"))
    time.sleep(0.5)  # nothing is coming later either
    assert k.deployment("too-big") is None and k.service("too-big") is None


def test_a_spec_the_server_cannot_run_is_not_rolled_out(env):
    k = env.kubectl
    name, field = "llama-3-70b", "spec.engine.tensorParallelSize 16"
    example = yaml.safe_load((ROOT / "examples" / "llama-3-70b-tp4.yaml").read_text())
    example["spec"]["engine"]["extraArgs"] = ["--tensor-parallel-size", "16"]  # past 8 ranks
    k.apply(example)
    ready = wait_until(lambda: (c := k.condition(name, "Ready")).get("reason") and c)
    assert ready["status"] == "False" and ready["reason"] == "UnsupportedByEngine"
    assert ready["message"].startswith(field)
    assert k.condition(name, "Progressing")["reason"] == "RolloutBlocked"
    warnings = [m for t, r, m in k.events(name) if t == "Warning" and r == "UnsupportedByEngine"]
    assert warnings and field in warnings[0]
    time.sleep(0.5)  # nothing is coming later either
    assert k.deployment(name) is None and k.pods(name) == []
    k.delete_llms(name)


def test_unschedulable_pods_raise_capacity_pending_until_a_node_appears(env):
    k = env.kubectl
    spec = {**GPU_8B, "scheduling": {"nodeSelector": {"pool": "small"}}}
    k.apply(llmservice("no-room", replicas=2, **spec))  # 2 GPUs wanted; the pool has 1
    pending = wait_until(
        lambda: (c := k.condition("no-room", "CapacityPending")).get("status") == "True" and c
    )
    assert pending["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in pending["message"]
    wait_until(lambda: k.condition("no-room", "Ready")["reason"] == "PartiallyReady")
    assert any(r == "CapacityPending" for _, r, _ in k.events("no-room"))
    # A cluster autoscaler adds a node: the pending pod schedules and the condition clears.
    node = Node("small-pool-2", gpus=1, labels={"pool": "small"})
    env.cluster.call(lambda: env.cluster.kubelet.add_node(node))
    wait_until(lambda: k.condition("no-room", "CapacityPending").get("status") == "False")
    wait_until(lambda: k.condition("no-room", "Ready").get("status") == "True")
    assert any(r == "CapacityPendingResolved" for _, r, _ in k.events("no-room"))


def test_failing_pods_degrade(env):
    k = env.kubectl
    k.apply(llmservice("broken", engine={"image": "registry.invalid/missing:1"}, **GPU_8B))
    degraded = wait_until(
        lambda: (c := k.condition("broken", "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "ImagePullBackOff"
    assert any(t == "Warning" and r == "Degraded" for t, r, _ in k.events("broken"))
    k.delete_llms("broken")


def test_scale_subresource_drives_the_deployment_and_pdb(env):
    k = env.kubectl
    k.apply(llmservice("scaled", **GPU_8B))
    wait_until(lambda: k.condition("scaled", "Ready").get("status") == "True")
    scale = k.scale("scaled", 3)
    assert scale["spec"]["replicas"] == 3
    wait_until(lambda: k.deployment("scaled")["spec"]["replicas"] == 3)
    wait_until(lambda: k.llms("scaled")["status"].get("readyReplicas") == 3)
    assert k.pdb("scaled") is not None
    scale = k.custom.get_namespaced_custom_object_scale(
        "llmservice.dev", "v1alpha1", "default", "llmservices", "scaled"
    )
    assert (
        scale["status"]["selector"]
        == "app.kubernetes.io/instance=scaled,app.kubernetes.io/name=llmservice"
    )
    assert scale["status"]["replicas"] == 3
    k.scale("scaled", 1)
    wait_until(lambda: k.pdb("scaled") is None and k.deployment("scaled")["spec"]["replicas"] == 1)
    messages = [m for _, r, m in k.events("scaled") if r == "Scaled"]
    assert "Scaled Deployment scaled from 1 to 3 replicas" in messages
    assert "Scaled Deployment scaled from 3 to 1 replicas" in messages


def test_deployment_drift_is_repaired(env):
    k = env.kubectl
    k.apply(llmservice("drift", **GPU_8B))
    first = wait_until(lambda: k.deployment("drift"))
    wait_until(lambda: k.llms("drift").get("status", {}).get("observedGeneration") == 1)
    k.apps.patch_namespaced_deployment_scale("drift", "default", {"spec": {"replicas": 4}})
    wait_until(lambda: k.deployment("drift")["spec"]["replicas"] == 1)  # spec.replicas rules
    k.apps.delete_namespaced_deployment("drift", "default")
    again = wait_until(lambda: k.deployment("drift"))
    assert again["metadata"]["uid"] != first["metadata"]["uid"]


def test_delete_cascades_to_children(env):
    k = env.kubectl
    k.apply(llmservice("doomed", replicas=2, **GPU_8B))
    wait_until(lambda: k.condition("doomed", "Ready").get("status") == "True")
    assert k.pdb("doomed") and k.service("doomed")
    k.delete_llms("doomed")
    wait_until(
        lambda: not k.deployment("doomed") and not k.service("doomed") and not k.pdb("doomed")
    )
    wait_until(lambda: not k.pods("doomed"))
