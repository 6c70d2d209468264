"""engine.kind: vllm: golden manifests, the `vllm serve` command against vLLM's documented
arguments, the CEL refusals of our-only flags, the LeaderWorkerSet past one node.

Regenerate the golden files after an intended change with
`UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/test_render_vllm.py` and review the diff.
The LeaderWorkerSet is checked against the LWS CRD's own schema, taken from the pinned
sigs.k8s.io/lws Go module by hack/fetch-lws-crd.sh (kubernetes-validate knows no CRDs).
"""

from __future__ import annotations

import copy
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from llmservice.operator import lws_support
from llmservice.operator.admission import admit, apply_defaults, prune, validate
from llmservice.operator.reconcile import Options, checks
from llmservice.operator.render import Owner
from llmservice.operator.render_lws import LWS_VERSION, WORKER_INDEX
from llmservice.operator.render_vllm import (
    LLMSERVICE_ONLY,
    SHARED_OPTIONS,
    VLLM_IMAGE,
    VLLM_VERSION,
)
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.vram import check_fit
from llmservice.server.cli_args import BY_NAME

from tests.support.golden import ROOT, UID, admitted, assert_golden, crd_schema, example, rendered
from tests.support.lws_crd import lws_schema

GOLDEN = Path(__file__).parent / "golden_vllm"
FIXTURE = Path(__file__).parent / "fixtures/vllm-serve-args.txt"
K8S_VERSION = "1.34.0"
EXAMPLES = ["vllm-llama-3-8b", "vllm-llama-3-405b-multinode"]
CRD_SCHEMA = crd_schema()


@cache
def vllm_flags() -> dict[str, str]:
    """Every flag and alias of the fixture -> its value spec ({a,b}, VALUE or (switch))."""
    assert f"vLLM {VLLM_VERSION}" in FIXTURE.read_text()  # fixture and image agree
    flags = {}
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("-"):
            names, kind = line.split(" ", 1)
            for name in names.split(","):
                flags[name] = kind
    return flags


def vllm_obj(**engine: Any) -> dict[str, Any]:
    return {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "v"},
        "spec": {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "vllm", **engine},
        },
    }


def serve_argv(manifests) -> list[str]:
    """The `vllm serve` argv of the replica's serving container (leader if multi-node)."""
    workload = manifests.deployment
    if workload["kind"] == "LeaderWorkerSet":
        pod = workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        script = pod["containers"][0]["args"][0]
        serve = script.split("exec vllm serve ", 1)[1]
        import shlex

        return shlex.split(serve)
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["vllm", "serve"]
    return container["args"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden(name):
    assert_golden(name, GOLDEN)


def check_lws_object(lws: dict[str, Any]) -> None:
    """Strict: no field the LWS schema would prune, and valid as the API server checks it;
    the pod templates are valid Kubernetes pod templates."""
    schema = lws_schema()
    assert prune(schema, copy.deepcopy(lws), root=True) == lws, "fields the LWS CRD does not know"
    assert validate(schema, apply_defaults(schema, copy.deepcopy(lws)), None) == []
    template = lws["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": template[key],
        }
        kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden_manifests_pass_the_kubernetes_and_lws_schemas(name):
    docs = list(yaml.safe_load_all((GOLDEN / f"{name}.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            check_lws_object(doc)
        elif doc["kind"] != "ServiceMonitor":  # a CRD of prometheus-operator
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    expected = "LeaderWorkerSet" if "multinode" in name else "Deployment"
    assert kinds[0] == expected


def test_lws_schema_check_is_not_vacuous():
    lws = rendered(example("vllm-llama-3-405b-multinode")).deployment
    unknown = copy.deepcopy(lws)
    unknown["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(AssertionError, match="does not know"):
        check_lws_object(unknown)
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(AssertionError):
        check_lws_object(bad)


def test_lws_pin_matches_the_hack_script():
    out = subprocess.run(
        [str(ROOT / "hack/fetch-lws-crd.sh"), "--version"], check=True, capture_output=True, text=True
    )
    assert out.stdout.strip() == LWS_VERSION


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_serve_command_uses_only_vllms_documented_arguments(name):
    flags = vllm_flags()
    argv = serve_argv(rendered(example(name)))
    assert not argv[0].startswith("-")  # MODEL, the positional
    i = 1
    while i < len(argv):
        arg = argv[i]
        assert arg in flags, f"{arg} is not a documented `vllm serve` {VLLM_VERSION} argument"
        kind = flags[arg]
        if kind == "(switch)":
            i += 1
            continue
        value = argv[i + 1]
        if kind.startswith("{"):
            assert value in kind.strip("{}").split(","), f"{arg} {value} not in {kind}"
        i += 2


def test_shared_and_llmservice_only_options_match_vllms_list():
    flags = vllm_flags()
    for option in SHARED_OPTIONS:
        assert BY_NAME[option].arg.flag in flags, option
    for option in LLMSERVICE_ONLY:
        assert BY_NAME[option].arg.flag not in flags, option
    # Every other option with an LLMService field is one or the other.
    with_field = {n for n, o in BY_NAME.items() if o.arg.crd and o.arg.crd.startswith("engine.")}
    assert with_field - {"tensor_parallel_size"} <= set(SHARED_OPTIONS) | set(LLMSERVICE_ONLY)


REFUSALS = {  # our-only engine field -> a value the object sets
    "preemptionMode": "swap",
    "kvCacheMemoryGiB": 2,
    "maxWaitingRequests": 64,
    "maxQueueDelayMs": 500,
    "maxStepMs": 50,
    "maxTokensDefault": 256,
    "requestTimeoutSeconds": 60,
}


@pytest.mark.parametrize("field", sorted(REFUSALS))
def test_llmservice_only_flags_are_refused_with_a_cel_message(field):
    _, errors = admit(CRD_SCHEMA, vllm_obj(**{field: REFUSALS[field]}), None)
    assert [e.path for e in errors] == [f"spec.engine.{field}"]
    assert "llmservice-only flag" in errors[0].detail and "engine.kind: vllm" in errors[0].detail
    flag = next(o.arg.flag for o in BY_NAME.values() if o.arg.crd == f"engine.{field}")
    assert flag in errors[0].detail
    # The same value is fine for our own engine.
    llms = vllm_obj(**{field: REFUSALS[field]})
    llms["spec"]["engine"]["kind"] = "llmservice"
    if field == "preemptionMode":
        llms["spec"]["engine"]["swapSpaceGiB"] = 4
    assert admit(CRD_SCHEMA, llms, None)[1] == []


def test_the_refused_fields_are_the_llmservice_only_options():
    crd_fields = {
        BY_NAME[o].arg.crd.removeprefix("engine.")
        for o in LLMSERVICE_ONLY
        if o != "shutdown_grace_seconds"  # also the pod's grace period: kept, not passed
    }
    assert crd_fields == set(REFUSALS)


def test_model_sources_image_and_extra_args():
    m = rendered(admitted(vllm_obj(extraArgs=["--enforce-eager"])))
    (c,) = m.deployment["spec"]["template"]["spec"]["containers"]
    assert c["image"] == VLLM_IMAGE
    assert c["args"][0] == "meta-llama/Llama-3.1-8B-Instruct" and c["args"][-1] == "--enforce-eager"
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HOME"]["value"].startswith("/models-cache")
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    obj = vllm_obj(image="registry.local/vllm:mine")
    obj["spec"]["model"] = {"source": "pvc://weights/llama-3-8b", "hfTokenSecretRef": {"name": "s"}}
    m = rendered(admitted(obj))
    (c,) = m.deployment["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.local/vllm:mine"
    assert c["args"][0] == "/models/llama-3-8b"
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_builtin_models_and_llmservice_multi_node_are_refused():
    obj = vllm_obj()
    obj["spec"]["engine"] = {"tensorParallelSize": 8, "pipelineParallelSize": 2}
    errors = admit(CRD_SCHEMA, obj, None)[1]
    assert any("needs engine.kind: vllm" in e.detail for e in errors)
    obj = vllm_obj()
    obj["spec"]["model"]["source"] = "builtin:smollm2-135m"
    (error,) = admit(CRD_SCHEMA, obj, None)[1]
    assert error.path == "spec.model.source" and "builtin: models" in error.detail
    obj["spec"]["model"]["source"] = "hf://org/name-GGUF/model-Q8_0.gguf"
    (error,) = admit(CRD_SCHEMA, obj, None)[1]
    assert error.path == "spec.model.source" and "use hf://org/name" in error.detail


def test_multi_node_leader_worker_set():
    m = rendered(example("vllm-llama-3-405b-multinode"))
    lws = m.deployment
    t = lws["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["replicas"] == 1
    leader = t["leaderTemplate"]["spec"]["containers"][0]
    worker = t["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8
    script = leader["args"][0]
    assert script.startswith("ray start --head") and "$LWS_GROUP_SIZE" in script
    argv = serve_argv(m)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert re.fullmatch(r'exec ray start --address="\$LWS_LEADER_ADDRESS:6379" --block', worker["args"][0])
    assert "ports" not in worker and "readinessProbe" not in worker
    assert m.service["spec"]["selector"][WORKER_INDEX] == "0"
    # Replicas follow spec.replicas (what the autoscaler writes through /scale).
    obj = example("vllm-llama-3-405b-multinode")
    obj["spec"]["replicas"] = 3
    assert rendered(obj).deployment["spec"]["replicas"] == 3


def test_single_node_parallelism_stays_a_deployment():
    m = rendered(admitted(vllm_obj(tensorParallelSize=4, pipelineParallelSize=2)))
    assert m.deployment["kind"] == "Deployment"
    (c,) = m.deployment["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "--distributed-executor-backend" not in c["args"]


def test_missing_lws_crd_is_a_ready_false_condition():
    obj = example("vllm-llama-3-405b-multinode")
    owner, spec = Owner("vllm-llama-3-405b", "default", UID), LLMServiceSpec.from_dict(obj["spec"])
    try:
        lws_support.record(False)
        verdict = checks(owner, spec, Options())
        assert verdict.refuse_rollout
        assert verdict.support.reason == "LeaderWorkerSetMissing"
        assert f"lws/releases/download/{LWS_VERSION}/manifests.yaml" in verdict.support.message
        single = LLMServiceSpec.from_dict(example("vllm-llama-3-8b")["spec"])
        assert not checks(owner, single, Options()).refuse_rollout  # only multi-node needs it
        lws_support.record(True)
        assert not checks(owner, spec, Options()).refuse_rollout
    finally:
        lws_support.record(None)  # type: ignore[arg-type]


def test_vram_weights_and_kv_per_gpu_divide_by_pipeline_stages():
    base = example("vllm-llama-3-405b-multinode")
    pp2 = check_fit(LLMServiceSpec.from_dict(base["spec"]))
    one = copy.deepcopy(base)
    one["spec"]["engine"]["pipelineParallelSize"] = 1
    pp1 = check_fit(LLMServiceSpec.from_dict(one["spec"]))
    assert pp2.status == "True" and pp1.status == "False"  # 405B bf16 does not fit 8 GPUs
    assert pp2.plan.weights_gib_per_gpu == pytest.approx(pp1.plan.weights_gib_per_gpu / 2)
    assert pp2.plan.kv_bytes_per_token_per_gpu == pp1.plan.kv_bytes_per_token_per_gpu // 2


def test_lws_status_reads_as_a_deployment_of_groups():
    view = lws_support.lws_view(
        {
            "metadata": {"generation": 3},
            "spec": {"replicas": 2},
            "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2},
        }
    )
    # LWS has no observedGeneration: the rollout is judged by the replica counts alone.
    assert (view.generation, view.observed_generation) == (3, 3)
    assert (view.spec_replicas, view.ready_replicas, view.updated_replicas) == (2, 1, 2)


class _Objects:
    """Just enough of Kube for reconcile(): objects by path, every API discoverable."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def apply(self, path: str, manifest: dict[str, Any], manager: str) -> dict[str, Any]:
        stored = {**manifest, "metadata": {**manifest["metadata"], "generation": 1}}
        self.objects[path] = stored
        return stored

    def delete(self, path: str) -> dict[str, Any] | None:
        return self.objects.pop(path, None)

    def has_resource(self, api_version: str, plural: str) -> bool:
        return True

    def kinds(self, name: str) -> set[str]:
        return {o["kind"] for o in self.objects.values() if o["metadata"]["name"] == name}


NAME_405B = "vllm-llama-3-405b"


def test_past_one_node_and_back_swaps_the_workload_both_ways():
    from llmservice.operator import reconcile as rc

    obj = example("vllm-llama-3-405b-multinode")
    obj["metadata"].update(namespace="default", uid=UID, generation=1)
    kube, events = _Objects(), []
    try:
        rc.reconcile(obj, kube, Options(), lambda *e: events.append(e))
        assert {"LeaderWorkerSet", "Service"} <= kube.kinds(NAME_405B)
        assert "Deployment" not in kube.kinds(NAME_405B)
        # 16-GPU nodes: the same 16 GPUs fit one node, so one pod per replica again.
        obj["spec"]["resources"]["gpu"]["perNode"] = 16
        rc.reconcile(obj, kube, Options(), lambda *e: events.append(e))
    finally:
        lws_support.record(None)  # type: ignore[arg-type]
    assert "Deployment" in kube.kinds(NAME_405B) and "LeaderWorkerSet" not in kube.kinds(NAME_405B)
    assert ("Normal", "Deleted", f"Deleted LeaderWorkerSet {NAME_405B} (back within one node)") in events
