"""Rendered children: golden files for the examples, schema validity, and the pod details.

Regenerate the golden files after an intended change with
`UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/test_render.py` and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from llmservice.operator.render import DEFAULT_SERVER_IMAGE, selector_string

from tests.support.golden import ROOT, assert_golden, example, rendered

GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.34.0"  # the Kubernetes release whose OpenAPI schemas the manifests must pass
EXAMPLES = ["smollm2-cpu", "llama-3-8b", "llama-3-70b-tp4", "qwen2.5-7b", "llama-3-8b-lora", "qwen3-moe"]


def args_of(manifests) -> list[str]:
    return manifests.deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden(name):
    assert_golden(name, GOLDEN)


@pytest.mark.parametrize("name", EXAMPLES)
def test_rendered_manifests_pass_the_kubernetes_schemas(name):
    manifests = rendered(example(name))
    for manifest in manifests.all():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_schema_validation_is_not_vacuous():
    manifests = rendered(example("llama-3-8b"))
    broken = yaml.safe_load(yaml.safe_dump(manifests.deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_crd_passes_the_kubernetes_schema():
    crd = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def test_server_flags_come_from_the_spec():
    obj = example("llama-3-8b")
    args = args_of(rendered(obj))
    assert args[:2] == ["serve", "hf://meta-llama/Meta-Llama-3-8B-Instruct"]
    expected = {
        "--served-model-name": "llama-3-8b-instruct",
        "--host": "0.0.0.0",
        "--port": "8000",
        "--block-size": "16",
        "--max-model-len": "8192",
        "--max-num-batched-tokens": "8192",
        "--max-num-seqs": "64",
        "--preemption-mode": "recompute",
        "--swap-space": "4",
        "--gpu-memory-utilization": "0.9",
        "--scheduling-policy": "fcfs",
        "--dtype": "bfloat16",
        "--max-waiting-requests": "1024",
        "--shutdown-grace-seconds": "30",
        "--tensor-parallel-size": "1",
        "--download-dir": "/models-cache",
    }
    assert {k: flag(args, k) for k in expected} == expected
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert "--kv-cache-memory-gib" not in args


def test_switches_and_optional_flags():
    obj = example("smollm2-cpu")
    obj["spec"]["engine"].update(
        enablePrefixCaching=False, enableChunkedPrefill=False, maxQueueDelayMs=250,
        extraArgs=["--seed", "7"],
    )  # fmt: skip
    args = args_of(rendered(obj))
    assert "--no-enable-prefix-caching" in args and "--no-enable-chunked-prefill" in args
    assert flag(args, "--max-queue-delay-ms") == "250"
    assert flag(args, "--kv-cache-memory-gib") == "0.5"
    assert args[-2:] == ["--seed", "7"]


def test_scale_to_zero_by_sleeping_turns_on_sleep_mode_in_the_pods():
    obj = example("smollm2-cpu")
    obj["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 0, "scaleToZero": "delete"}
    assert "--enable-sleep-mode" not in args_of(rendered(obj))
    obj["spec"]["autoscaling"]["scaleToZero"] = "sleep"
    assert "--enable-sleep-mode" in args_of(rendered(obj))
    obj["spec"]["autoscaling"]["minReplicas"] = 1  # never idles to zero: nothing sleeps
    assert "--enable-sleep-mode" not in args_of(rendered(obj))


def test_operator_ceiling_caps_the_utilization_flag():
    obj = example("llama-3-8b")
    obj["spec"]["resources"]["gpuMemoryUtilization"] = 0.95
    assert flag(args_of(rendered(obj)), "--gpu-memory-utilization") == "0.95"
    capped = rendered(obj, max_gpu_memory_utilization=0.85)
    assert flag(args_of(capped), "--gpu-memory-utilization") == "0.85"


def image_of(manifests) -> str:
    return manifests.deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def test_operator_server_image_applies_when_the_spec_sets_none():
    obj = example("smollm2-cpu")
    assert "image" not in obj["spec"]["engine"]  # the CRD no longer defaults it
    assert image_of(rendered(obj)) == DEFAULT_SERVER_IMAGE
    site = rendered(obj, server_image="registry.example/llmservice:0.1.0-cu128")
    assert image_of(site) == "registry.example/llmservice:0.1.0-cu128"


def test_spec_engine_image_wins_over_the_operators_server_image():
    obj = example("smollm2-cpu")
    obj["spec"]["engine"]["image"] = "registry.example/pinned:7"
    assert image_of(rendered(obj, server_image="registry.example/llmservice:2")) == (
        "registry.example/pinned:7"
    )


def test_gpu_pod_details():
    m = rendered(example("llama-3-70b-tp4"))
    pod = m.deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert flag(container["args"], "--tensor-parallel-size") == "4"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # The PVC is mounted read-only and the server is pointed at the path inside it.
    model = next(v for v in pod["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "llama-3-70b-weights", "readOnly": True}
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert container["args"][1] == "/models/Meta-Llama-3-70B-Instruct"


def test_probes_grace_security_and_rollout():
    m = rendered(example("llama-3-70b-tp4"))
    spec = m.deployment["spec"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # startupTimeoutSeconds
    assert pod["terminationGracePeriodSeconds"] > int(flag(c["args"], "--shutdown-grace-seconds"))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_cpu_pod_asks_for_no_gpu_and_no_gpu_toleration():
    m = rendered(example("smollm2-cpu"))
    pod = m.deployment["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert "tolerations" not in pod
    assert args_of(m)[1] == "builtin:smollm2-135m"


def test_hf_token_comes_from_the_secret():
    env = rendered(example("llama-3-8b")).deployment["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    token = next(e for e in env if e["name"] == "HF_TOKEN")
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}


def test_children_share_labels_selector_and_owner():
    m = rendered(example("llama-3-8b"), with_service_monitor=True)
    assert m.pdb is not None and m.service_monitor is not None
    for manifest in m.all():
        (ref,) = manifest["metadata"]["ownerReferences"]
        assert ref["kind"] == "LLMService" and ref["controller"] is True
        assert ref["uid"] == "11111111-2222-3333-4444-555555555555"
    selector = m.deployment["spec"]["selector"]["matchLabels"]
    # With the router (on: maxReplicas 4), the pods' headless Service selects the pods
    # and the LLMService's own Service the router (tests/unit/operator/test_render_router.py).
    (pods,) = [c for c in m.router if c["metadata"]["name"] == "llama-3-8b-pods"]
    assert pods["spec"]["selector"] == selector
    assert m.pdb["spec"]["selector"]["matchLabels"] == selector
    template_labels = m.deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert selector_string("llama-3-8b") == ",".join(
        f"{k}={v}" for k, v in sorted(selector.items())
    )


def test_pdb_only_with_more_than_one_replica():
    obj = example("llama-3-8b")
    assert rendered(obj).pdb is not None
    obj["spec"]["replicas"] = 1
    assert rendered(obj).pdb is None


def test_engine_env_overrides_the_operators_env_once_per_name():
    obj = example("llama-3-8b")
    obj["spec"]["engine"]["env"] = [
        {"name": "HF_HOME", "value": "/data/hf"},
        {"name": "HF_ENDPOINT", "value": "http://mirror"},
        {"name": "HF_ENDPOINT", "value": "http://mirror-2"},
    ]
    env = rendered(obj).deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))  # server-side apply refuses a repeated name
    values = {e["name"]: e.get("value") for e in env}
    assert values["HF_HOME"] == "/data/hf" and values["HF_ENDPOINT"] == "http://mirror-2"
    assert "HF_TOKEN" in values and values["HOME"] == "/tmp"
