"""spec.adapters: the CRD's checks, the parsed spec, what the pods get (flags, env, mounts,
never an adapter list), the engine refusal with tensor parallelism, and the pure diff and
status of the adapter sync."""

from __future__ import annotations

import copy

import pytest
from llmservice.operator.adapter_diff import (
    ADAPTERS_READY,
    ALL_LOADED,
    LOAD_FAILED,
    LOADING,
    AdapterPlan,
    PodAdapters,
    adapters_condition,
    adapters_status,
    loaded_adapters,
    plan_adapters,
)
from llmservice.operator.adapter_spec import AdapterSpec, adapter_claims, served_path
from llmservice.operator.admission import admit
from llmservice.operator.engine_support import check_engine
from llmservice.operator.render import Owner, render
from llmservice.operator.spec import LLMServiceSpec

from tests.support.golden import crd_schema

OWNER = Owner("svc", "default", "uid")


def obj(spec: dict) -> dict:
    return {"apiVersion": "llmservice.dev/v1alpha1", "kind": "LLMService", "metadata": {"name": "svc"}, "spec": spec}


BASE = {"model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}, "resources": {"gpu": {"memoryGiB": 80}}}
ADAPTERS = [
    {"name": "sql", "source": "hf://org/sql-lora@v2"},
    {"name": "chat", "source": "pvc://loras/chat/v1"},
    {"name": "local", "source": "/opt/adapters/local"},
]


def errors_of(spec: dict) -> list[str]:
    return [f"{e.path}: {e.detail}" for e in admit(crd_schema(), obj(spec), None)[1]]


def stored_spec(spec: dict) -> LLMServiceSpec:
    stored, errors = admit(crd_schema(), obj(spec), None)
    assert errors == []
    return LLMServiceSpec.from_dict(stored["spec"])


def pod(spec: LLMServiceSpec) -> dict:
    return render(OWNER, spec).deployment["spec"]["template"]["spec"]


# ---- CRD and spec ----------------------------------------------------------------------------
def test_adapters_and_limits_are_parsed_with_the_servers_defaults():
    spec = stored_spec({**BASE, "adapters": ADAPTERS})
    assert spec.adapters == tuple(AdapterSpec(a["name"], a["source"]) for a in ADAPTERS)
    assert (spec.engine.max_loras, spec.engine.max_lora_rank, spec.engine.max_cpu_loras) == (1, 16, None)
    assert stored_spec(BASE).adapters == ()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"adapters": [{"name": "SQL_Lora", "source": "/a"}]}, "adapter name SQL_Lora must be a DNS-1123 label"),
        ({"adapters": [{"name": "sql", "source": "s3://bucket/sql"}]}, "adapter source s3://bucket/sql must be"),
        ({"adapters": [{"name": "sql", "source": "hf://just-a-name"}]}, "adapter source hf://just-a-name must be"),
        ({"adapters": [{"name": "a", "source": "/x"}, {"name": "a", "source": "/y"}]}, "adapter names must be unique"),
        ({"engine": {"maxLoras": 4, "maxCpuLoras": 2}}, "engine.maxCpuLoras must be >= engine.maxLoras"),
        ({"engine": {"maxLoraRank": 1024}}, "spec.engine.maxLoraRank"),
        ({"model": {"source": BASE["model"]["source"], "servedName": "base"}, "adapters": [{"name": "base", "source": "/a"}]},
         "adapter name base is the base model's model.servedName"),
        ({"engine": {"kind": "vllm"}, "adapters": [{"name": "sql", "source": "hf://org/sql@v2"}]},
         "engine.kind vllm loads a Hub adapter by its id alone"),
    ],
)  # fmt: skip
def test_the_crd_refuses_bad_adapters_naming_the_value(change, expected):
    spec = copy.deepcopy(BASE)
    spec.update(change)
    assert any(expected in e for e in errors_of(spec)), errors_of(spec)


# ---- rendering -------------------------------------------------------------------------------
def test_adapters_turn_on_lora_with_the_limits_and_the_runtime_switch():
    spec = stored_spec({**BASE, "adapters": ADAPTERS, "engine": {"maxLoras": 4, "maxLoraRank": 32, "maxCpuLoras": 8}})
    container = pod(spec)["containers"][0]
    args = container["args"]
    assert "--enable-lora" in args
    assert [args[args.index(f) + 1] for f in ("--max-loras", "--max-lora-rank", "--max-cpu-loras")] == ["4", "32", "8"]
    assert "--lora-modules" not in args and not any("sql" in a for a in args)  # loaded live, not at start
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in container["env"]


def test_without_adapters_nothing_about_lora_is_rendered():
    container = pod(stored_spec({**BASE, "engine": {"maxLoras": 4}}))["containers"][0]
    assert not any("lora" in a for a in container["args"])
    assert all(e["name"] != "VLLM_ALLOW_RUNTIME_LORA_UPDATING" for e in container["env"])


def test_pvc_adapters_mount_their_claims_read_only_and_hf_ones_get_the_hub_cache():
    spec = stored_spec({"model": {"source": "builtin:smollm2-135m"}, "resources": {"gpu": {"count": 0}},
                        "adapters": ADAPTERS + [{"name": "more", "source": "pvc://loras/more"}]})  # fmt: skip
    template = pod(spec)
    mounts = {m["mountPath"]: m for m in template["containers"][0]["volumeMounts"]}
    assert mounts["/adapters/loras"]["readOnly"] is True and "/models-cache" in mounts  # one mount per claim
    claims = [v["persistentVolumeClaim"] for v in template["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": "loras", "readOnly": True}]
    assert {"name": "HF_HOME", "value": "/models-cache/huggingface"} in template["containers"][0]["env"]


def test_editing_adapters_keeps_the_pod_template_but_a_new_claim_changes_it():
    first = stored_spec({**BASE, "adapters": ADAPTERS})
    edited = stored_spec({**BASE, "adapters": [{"name": "other", "source": "hf://org/other"}, ADAPTERS[1]]})
    assert pod(edited) == pod(first)
    new_claim = stored_spec({**BASE, "adapters": [*ADAPTERS, {"name": "x", "source": "pvc://other-claim/x"}]})
    assert pod(new_claim) != pod(first)


def test_served_paths_per_source_and_engine():
    model = "pvc://models/llama"
    assert served_path(AdapterSpec("a", "hf://org/a@v1"), model) == "hf://org/a@v1"
    assert served_path(AdapterSpec("a", "hf://org/a"), model, "vllm") == "org/a"
    assert served_path(AdapterSpec("a", "pvc://loras/x/y"), model) == "/adapters/loras/x/y"
    assert served_path(AdapterSpec("a", "pvc://models/loras/a"), model) == "/models/loras/a"  # the model's claim
    assert served_path(AdapterSpec("a", "/opt/a"), model) == "/opt/a"
    adapters = (AdapterSpec("a", "pvc://models/x"), AdapterSpec("b", "pvc://zz/x"), AdapterSpec("c", "pvc://aa"))
    assert adapter_claims(adapters, model) == ["aa", "zz"]


def test_vllm_pods_get_the_same_lora_flags_and_env():
    spec = stored_spec({**BASE, "engine": {"kind": "vllm", "maxLoras": 2}, "adapters": ADAPTERS[1:]})
    container = pod(spec)["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    assert "--enable-lora" in args and args[args.index("--max-loras") + 1] == "2"
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in container["env"]


# ---- engine support --------------------------------------------------------------------------
def test_adapters_with_tensor_parallelism_are_refused_up_front():
    spec = stored_spec({**BASE, "engine": {"tensorParallelSize": 2}, "adapters": ADAPTERS[:1]})
    support = check_engine(OWNER, spec, 0.95)
    assert support.refuses_rollout and support.reason == "UnsupportedByEngine"
    assert "spec.adapters (sql) with spec.engine.tensorParallelSize 2" in support.message
    assert "engine.kind: vllm" in support.message


def test_vllm_serves_adapters_with_tensor_parallelism():
    spec = stored_spec({**BASE, "engine": {"kind": "vllm", "tensorParallelSize": 2}, "adapters": ADAPTERS[1:]})
    assert not check_engine(OWNER, spec, 0.95).refuses_rollout


def test_adapters_on_one_rank_are_supported():
    assert not check_engine(OWNER, stored_spec({**BASE, "adapters": ADAPTERS}), 0.95).refuses_rollout


# ---- the diff and the status -----------------------------------------------------------------
MODELS = {"object": "list", "data": [
    {"id": "base", "root": "/models/x", "parent": None},
    {"id": "sql", "root": "hf://org/sql", "parent": "base"},
    {"id": "old", "root": "/a/old", "parent": "base"},
]}  # fmt: skip


def test_the_pods_adapters_are_the_models_with_a_parent():
    assert loaded_adapters(MODELS) == {"sql": "hf://org/sql", "old": "/a/old"}
    assert loaded_adapters({"data": []}) == {}


@pytest.mark.parametrize(
    ("desired", "loaded", "plan"),
    [
        ({"a": "/a"}, {}, AdapterPlan((), (("a", "/a"),))),
        ({}, {"a": "/a"}, AdapterPlan(("a",), ())),
        ({"a": "/a"}, {"a": "/a"}, AdapterPlan()),
        ({"a": "/new"}, {"a": "/old"}, AdapterPlan(("a",), (("a", "/new"),))),  # source changed: reload
        ({"b": "/b", "a": "/a"}, {"c": "/c", "a": "/a"}, AdapterPlan(("c",), (("b", "/b"),))),
    ],
)
def test_plan_adapters(desired, loaded, plan):
    assert plan_adapters(desired, loaded) == plan
    assert plan_adapters(desired, loaded).empty == (plan == AdapterPlan())


SPECS = (AdapterSpec("sql", "hf://org/sql"), AdapterSpec("bad", "/a/bad"))
DESIRED = {"sql": "hf://org/sql", "bad": "/a/bad"}


def test_status_counts_the_pods_serving_each_adapter_and_keeps_the_servers_message():
    pods = [
        PodAdapters("p0", {"sql": "hf://org/sql"}, {"bad": "HTTP 400: adapter 'bad': rank 64 is above --max-lora-rank 16"}),
        PodAdapters("p1", {"sql": "hf://org/sql", "bad": "/a/old-bad"}),
    ]
    assert adapters_status(SPECS, DESIRED, pods) == [
        {"name": "sql", "source": "hf://org/sql", "loadedReplicas": 2},
        {"name": "bad", "source": "/a/bad", "loadedReplicas": 0,
         "error": "HTTP 400: adapter 'bad': rank 64 is above --max-lora-rank 16"},
    ]  # fmt: skip
    condition = adapters_condition(SPECS, DESIRED, pods)
    assert (condition["type"], condition["status"], condition["reason"]) == (ADAPTERS_READY, "False", LOAD_FAILED)
    assert condition["message"] == "adapter bad on pod p0: HTTP 400: adapter 'bad': rank 64 is above --max-lora-rank 16"


def test_the_condition_says_ready_loading_or_unreachable():
    everywhere = [PodAdapters("p0", dict(DESIRED)), PodAdapters("p1", dict(DESIRED))]
    ready = adapters_condition(SPECS, DESIRED, everywhere)
    assert (ready["status"], ready["reason"]) == ("True", ALL_LOADED) and "2 ready pods" in ready["message"]
    assert adapters_condition(SPECS, DESIRED, [])["reason"] == LOADING
    down = adapters_condition(SPECS, DESIRED, [PodAdapters("p0", unreachable="GET /v1/models: HTTP 401: bad key")])
    assert down["reason"] == LOADING and "p0: GET /v1/models: HTTP 401" in down["message"]


# ---- status written with the autoscaler's, each owner's fields kept ----------------------------
class FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict] = []

    def merge_patch(self, path: str, patch: dict) -> dict:
        self.patches.append(patch["status"])
        return {}


def test_the_adapter_fields_and_the_autoscalers_go_out_together():
    from llmservice.operator.publish import StatusPublisher
    from llmservice.operator.reconcile import Options
    from llmservice.operator.status import DeploymentView, PodView

    body = {"metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 2},
            "spec": {"model": {"source": "builtin:smollm2-135m"}, "adapters": [{"name": "sql", "source": "/a"}]}}  # fmt: skip
    kube = FakeKube()
    publisher = StatusPublisher(lambda: kube, Options())  # type: ignore[arg-type,return-value]
    key = ("ns", "m")
    observe = lambda: (body, DeploymentView(2, 2, 1, 1, 1, 1, 1), [PodView("p", "Running", True)])  # noqa: E731
    publisher.set_extra(key, {"desiredReplicas": 3}, [{"type": "ScalingActive", "status": "True", "reason": "R", "message": ""}])
    status = [{"name": "sql", "source": "/a", "loadedReplicas": 1}]
    loaded = adapters_condition((AdapterSpec("sql", "/a"),), {"sql": "/a"}, [PodAdapters("p", {"sql": "/a"})])
    publisher.set_extra(key, {"adapters": status}, [loaded], owner="adapters")
    publisher.publish(key, observe, lambda *e: None, 2)
    patch = kube.patches[-1]
    assert patch["adapters"] == status and patch["desiredReplicas"] == 3
    assert {"ScalingActive", ADAPTERS_READY} <= {c["type"] for c in patch["conditions"]}
    publisher.set_extra(key, {"desiredReplicas": 4}, [])  # the autoscaler's own update keeps ours
    publisher.publish(key, observe, lambda *e: None)
    assert "adapters" not in kube.patches[-1] and kube.patches[-1]["desiredReplicas"] == 4  # not removed


def test_a_new_adapter_claim_is_announced_as_a_rollout():
    from llmservice.operator.adapter_spec import claims_rollout_message

    def template(adapters):
        return render(OWNER, stored_spec({**BASE, "adapters": adapters})).deployment["spec"]["template"]

    before = template(ADAPTERS)
    after = template([*ADAPTERS, {"name": "x", "source": "pvc://other-claim/x"}])
    message = claims_rollout_message(before, after)
    assert message is not None and message.startswith("mounting the adapter claim other-claim at /adapters/other-claim")
    assert "roll out once" in message
    assert claims_rollout_message(before, template([ADAPTERS[1]])) is None  # same claim: no rollout
