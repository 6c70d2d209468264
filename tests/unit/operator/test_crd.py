"""The CRD's defaults, bounds and CEL rules, applied as the API server applies them.

`llmservice.operator.admission` prunes, defaults and validates (OpenAPI + CEL through cel-python)
exactly like the emulator's write path; the integration tests cover the HTTP side.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.spec import EngineSpec, LLMServiceSpec, ResourcesSpec

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]["properties"]


def obj(**spec: Any) -> dict[str, Any]:
    base = {"model": {"source": "builtin:smollm2-135m"}}
    for key, value in spec.items():
        base[key] = value
    return {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "x"},
        "spec": base,
    }


def errors_of(o: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [str(e) for e in admit(SCHEMA, o, old)[1]]


def test_identity_subresources_and_columns():
    assert CRD["spec"]["group"] == "llmservice.dev"
    assert CRD["spec"]["names"]["shortNames"] == ["llms"]
    assert CRD["spec"]["scope"] == "Namespaced"
    assert VERSION["name"] == "v1alpha1"
    assert VERSION["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in VERSION["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.source"
    assert columns["Ready"] == ".status.readyReplicas" and columns["Desired"] == ".spec.replicas"
    assert {"KV%", "Preempt/min", "Status", "Age"} <= columns.keys()


def test_defaults_fill_a_minimal_object():
    stored, errors = admit(SCHEMA, obj(), None)
    assert errors == []
    spec = stored["spec"]
    assert spec["replicas"] == 1
    assert spec["resources"]["gpuMemoryUtilization"] == 0.9
    assert spec["engine"]["blockSize"] == 16
    assert spec["autoscaling"] == {
        "enabled": False, "minReplicas": 1, "maxReplicas": 4,
        "preemptionsPerMinutePerReplica": 5, "kvCacheUsageTarget": 0.8,
        "waitingRequestsPerReplica": 5, "scaleUpStabilizationSeconds": 0,
        "scaleDownStabilizationSeconds": 300, "intervalSeconds": 15,
        "scaleToZeroAfterSeconds": 600, "scaleToZero": "delete",
    }  # fmt: skip


def test_crd_defaults_match_the_operators_own_defaults():
    """spec.py repeats the defaults for objects stored before a default existed."""
    engine, resources = EngineSpec(), ResourcesSpec()
    crd_engine = {k: v.get("default") for k, v in SPEC["engine"]["properties"].items()}
    ours = {
        "image": engine.image, "imagePullPolicy": engine.image_pull_policy,
        "blockSize": engine.block_size, "maxModelLen": engine.max_model_len,
        "maxNumBatchedTokens": engine.max_num_batched_tokens, "maxNumSeqs": engine.max_num_seqs,
        "enablePrefixCaching": engine.enable_prefix_caching,
        "enableChunkedPrefill": engine.enable_chunked_prefill,
        "preemptionMode": engine.preemption_mode, "swapSpaceGiB": engine.swap_space_gib,
        "schedulingPolicy": engine.scheduling_policy, "dtype": engine.dtype,
        "tensorParallelSize": engine.tensor_parallel_size,
        "maxWaitingRequests": engine.max_waiting_requests,
        "shutdownGraceSeconds": engine.shutdown_grace_seconds,
        "startupTimeoutSeconds": engine.startup_timeout_seconds, "extraArgs": [],
    }  # fmt: skip
    assert {k: crd_engine[k] for k in ours} == ours
    res = SPEC["resources"]["properties"]
    assert res["gpuMemoryUtilization"]["default"] == resources.gpu_memory_utilization
    assert res["cpu"]["default"] == resources.cpu and res["memory"]["default"] == resources.memory
    assert res["shmSize"]["default"] == resources.shm_size
    gpu = res["gpu"]["properties"]
    assert gpu["memoryGiB"]["default"] == resources.gpu.memory_gib
    assert gpu["resourceName"]["default"] == resources.gpu.resource_name
    assert SPEC["replicas"]["default"] == LLMServiceSpec(model=None).replicas  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1.0, 1, 0.96, 0.4])
def test_gpu_memory_utilization_outside_the_margin_is_rejected(value):
    errors = errors_of(obj(resources={"gpuMemoryUtilization": value}))
    assert any("gpuMemoryUtilization must lie in [0.5, 0.95]" in e for e in errors)
    assert all(e.startswith("spec.resources.gpuMemoryUtilization:") for e in errors)


@pytest.mark.parametrize("value", [0.5, 0.9, 0.95])
def test_gpu_memory_utilization_inside_the_margin_is_accepted(value):
    assert errors_of(obj(resources={"gpuMemoryUtilization": value})) == []


def test_min_replicas_above_max_replicas_is_rejected_with_the_rule_message():
    errors = errors_of(obj(autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    assert errors == [
        'spec.autoscaling: Invalid value: "object": autoscaling.minReplicas must be <= autoscaling.maxReplicas'
    ]


def test_batched_tokens_must_hold_a_whole_prompt_unless_chunked_prefill():
    short = {"maxModelLen": 8192, "maxNumBatchedTokens": 2048}
    assert errors_of(obj(engine=short)) == []  # chunked prefill is on by default
    errors = errors_of(obj(engine={**short, "enableChunkedPrefill": False}))
    assert len(errors) == 1
    assert errors[0].startswith("spec.engine.maxNumBatchedTokens: Invalid value")
    assert "unless engine.enableChunkedPrefill is true" in errors[0]


def test_enums_and_bounds():
    errors = errors_of(
        obj(engine={"blockSize": 24, "preemptionMode": "kill", "dtype": "int8", "maxNumSeqs": 0})
    )
    text = "\n".join(errors)
    assert (
        'spec.engine.blockSize: Unsupported value: 24: supported values: "8", "16", "32", "64", "128"'
        in text
    )
    assert 'spec.engine.preemptionMode: Unsupported value: "kill"' in text
    assert 'spec.engine.dtype: Unsupported value: "int8"' in text
    assert (
        "spec.engine.maxNumSeqs: Invalid value: 0: spec.engine.maxNumSeqs in body should be greater than or equal to 1"
        in text
    )
    assert errors_of(obj(engine={"schedulingPolicy": "lifo"}))


def test_gpu_count_must_match_tensor_parallelism():
    assert errors_of(obj(engine={"tensorParallelSize": 4}, resources={"gpu": {"count": 4}})) == []
    assert errors_of(obj(engine={"tensorParallelSize": 4})) == []  # count defaults to TP
    errors = errors_of(obj(engine={"tensorParallelSize": 4}, resources={"gpu": {"count": 2}}))
    assert any("resources.gpu.count must equal engine.tensorParallelSize" in e for e in errors)
    # CPU ranks (resources.gpu.count 0): tensor parallelism on CPU pods and the test tier
    assert errors_of(obj(engine={"tensorParallelSize": 3}, resources={"gpu": {"count": 0}})) == []
    assert errors_of(obj(engine={"tensorParallelSize": 9}))


def test_model_source_forms():
    for good in (
        "builtin:smollm2-135m",
        "hf://meta-llama/Meta-Llama-3-8B",
        "hf://bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q8_0.gguf",
        "pvc://weights/a/b",
        "pvc://weights",
    ):
        assert errors_of(obj(model={"source": good})) == [], good
    for bad in ("s3://bucket/x", "hf://no-org", "hf://org/name/weights.bin", "builtin:", "/abs/path"):
        errors = errors_of(obj(model={"source": bad}))
        assert any(
            "model.source must be builtin:NAME, hf://org/name, hf://org/name/file.gguf or pvc://claim/path" in e
            for e in errors
        ), bad


def test_swap_preemption_needs_swap_space():
    errors = errors_of(obj(engine={"preemptionMode": "swap", "swapSpaceGiB": 0}))
    assert any("needs engine.swapSpaceGiB > 0" in e for e in errors)


def test_required_fields_and_pruning():
    o = obj()
    del o["spec"]["model"]
    assert "spec.model: Required value" in errors_of(o)
    o = obj(engine={"notAField": 1})
    stored, errors = admit(SCHEMA, o, None)
    assert errors == [] and "notAField" not in stored["spec"]["engine"]


@pytest.mark.parametrize("name", ["smollm2-cpu", "llama-3-8b", "llama-3-70b-tp4", "qwen2.5-7b"])
def test_examples_are_accepted(name):
    example = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    before = copy.deepcopy(example)
    assert errors_of(example) == []
    assert example == before  # admission does not mutate its input
