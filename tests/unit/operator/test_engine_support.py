"""A spec the server cannot run: no rollout, Ready=False UnsupportedByEngine, an Event,
and a message naming the field to change; a Deployment of an earlier spec keeps serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator import reconcile as rc
from llmservice.operator.admission import admit
from llmservice.operator.engine_support import check_engine
from llmservice.operator.render import Owner
from llmservice.operator.spec import LLMServiceSpec

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
OWNER = Owner("m", "ns", "u1")


class FakeKube:
    """Just enough of Kube for reconcile(): a dict of objects by path."""

    def __init__(self, objects: dict[str, dict[str, Any]] | None = None) -> None:
        self.objects = dict(objects or {})
        self.applied: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def apply(self, path: str, manifest: dict[str, Any], manager: str) -> dict[str, Any]:
        self.applied.append(path)
        stored = {**manifest, "metadata": {**manifest["metadata"], "generation": 1}}
        self.objects[path] = stored
        return stored

    def delete(self, path: str) -> dict[str, Any] | None:
        return self.objects.pop(path, None)

    def has_resource(self, api_version: str, plural: str) -> bool:
        return False


def body(**spec: Any) -> dict[str, Any]:
    obj = {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"model": {"source": "builtin:smollm2-135m"}, **spec},
    }
    stored, errors = admit(SCHEMA, obj, None)
    assert errors == []
    return stored


def spec_of(**spec: Any) -> LLMServiceSpec:
    return LLMServiceSpec.from_dict(body(**spec)["spec"])


HF = {"model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}}
# what the server refuses at start: more ranks than it shards over (extraArgs win over the
# rendered flags, as argparse keeps the last value)
TP16 = {
    "model": {"source": "pvc://weights/llama-70b", "catalogName": "llama-3-70b"},
    "engine": {"tensorParallelSize": 4, "extraArgs": ["--tensor-parallel-size", "16"]},
}
CPU = {"resources": {"gpu": {"count": 0}}, "engine": {"kvCacheMemoryGiB": 0.5}}


@pytest.mark.parametrize(
    ("spec", "starts"),
    [
        (TP16, "spec.engine.tensorParallelSize 16: this engine shards a model over at most 8 ranks"),
        ({"model": {"source": "builtin:gpt-5"}}, "spec.model.source builtin:gpt-5: no builtin model"),
    ],
)
def test_what_the_server_refuses_names_the_field_and_the_fix(spec, starts):
    support = check_engine(OWNER, spec_of(**spec), 0.95)
    assert support.refuses_rollout
    assert support.message.startswith(starts)
    assert "builtin:smollm2-135m" in support.message or "tensorParallelSize to 1 to 8" in support.message


def test_supported_sources_pass():
    sources = ("builtin:smollm2-135m", "pvc://weights/a/b", "pvc://weights", HF["model"]["source"])
    for source in sources:
        assert not check_engine(OWNER, spec_of(model={"source": source}, **CPU), 0.95).refuses_rollout


def test_extra_args_the_server_does_not_define_are_refused():
    support = check_engine(OWNER, spec_of(engine={"extraArgs": ["--no-such-flag"]}), 0.95)
    assert support.refuses_rollout
    assert "unrecognized arguments: --no-such-flag" in support.message
    assert "spec.engine.extraArgs" in support.message
    ok = check_engine(OWNER, spec_of(engine={"extraArgs": ["--tokenizer-workers", "4"]}), 0.95)
    assert not ok.refuses_rollout


def test_extra_args_the_server_would_reject_name_the_field_behind_the_flag():
    support = check_engine(OWNER, spec_of(engine={"extraArgs": ["--max-num-seqs", "0"]}), 0.95)
    assert support.refuses_rollout
    assert "--max-num-seqs 0 must be >= 1" in support.message
    assert "spec.engine.maxNumSeqs" in support.message


def test_unsupported_spec_is_not_rolled_out_and_says_why():
    kube, events = FakeKube(), []
    outcome = rc.reconcile(body(**TP16), kube, rc.Options(), lambda *e: events.append(e))
    assert not outcome.applied and kube.applied == []
    ((kind, reason, message),) = events
    assert (kind, reason) == ("Warning", "UnsupportedByEngine")
    assert message.startswith("Not rolling out: spec.engine.tensorParallelSize 16")
    update = rc.status_for(body(**TP16), rc.Options(), None, [])
    conditions = {c["type"]: c for c in update.status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "UnsupportedByEngine"
    assert "tensorParallelSize to 1 to 8" in conditions["Ready"]["message"]
    assert conditions["Progressing"]["reason"] == "RolloutBlocked"
    assert not rc.needs_repair(body(**TP16), rc.Options(), None)  # no "repair" either


def test_a_deployment_of_an_earlier_spec_keeps_serving():
    kube = FakeKube()
    rc.reconcile(body(**CPU), kube, rc.Options(), lambda *e: None)
    assert kube.applied  # the supported spec rolled out
    before = dict(kube.objects)
    events: list[tuple[str, str, str]] = []
    outcome = rc.reconcile(body(**TP16), kube, rc.Options(), lambda *e: events.append(e))
    assert not outcome.applied and kube.objects == before
    assert outcome.deployment is not None
    assert ("Warning", "UnsupportedByEngine") in {(k, r) for k, r, _ in events}
    update = rc.status_for(body(**TP16), rc.Options(), outcome.deployment, [])
    progressing = {c["type"]: c for c in update.status["conditions"]}["Progressing"]
    assert progressing["reason"] == "RolloutBlocked"
    assert "still serving the previous one" in progressing["message"]
