"""Rendered pods are pods the server can start: the container command of every example
and every golden manifest goes through the server's own parser and start-up check, and
the model source must resolve the way the server resolves it. What the server would
refuse, the operator refuses too (UnsupportedByEngine), so it is never rolled out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.engine_support import check_engine
from llmservice.operator.render import MODELS_MOUNT, Owner, render
from llmservice.operator.spec import LLMServiceSpec
from llmservice.server.cli_args import UnsupportedError, configs_from_args, parse_serve_argv
from llmservice.server.model.registry import resolve_model_path
from llmservice.server.model.sources import parse_hub_ref

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests/unit/operator/golden"
SCHEMA = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]
OWNER_UID = "11111111-2222-3333-4444-555555555555"  # the golden files' owner

# What this server build refuses in each example (None: it starts). Flip an entry when
# capabilities.py learns the feature ("Real models": hf://; tensor parallelism).
REFUSED = {
    "smollm2-cpu": None,
    "llama-3-8b": None,  # hf://: the server downloads it at start
    "llama-3-70b-tp4": None,  # the bundled engine shards it over 4 ranks (server/engine/tp_*.py)
    "qwen2.5-7b": None,  # hf://, no token: the server downloads it at start
    "llama-3-8b-inference-pool": None,  # hf://; spec.gateway adds an InferencePool (render_gateway.py)
    "llama-3-8b-lora": None,  # hf://; spec.adapters: --enable-lora, loaded live (adapter_sync.py)
    "qwen3-moe": None,  # hf://, Qwen3-MoE, no token: the server downloads it at start
}


def example(name: str) -> tuple[Owner, LLMServiceSpec]:
    stored, errors = admit(
        SCHEMA, yaml.safe_load((ROOT / f"examples/{name}.yaml").read_text()), None
    )
    assert errors == []
    return Owner(stored["metadata"]["name"], "default", OWNER_UID), LLMServiceSpec.from_dict(
        stored["spec"]
    )


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def rendered_deployment(name: str) -> dict[str, Any]:
    owner, spec = example(name)
    return render(owner, spec).deployment


def golden_deployment(name: str) -> dict[str, Any]:
    docs = list(yaml.safe_load_all((GOLDEN / f"{name}.yaml").read_text()))
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and "llmservice.dev/router" not in d["metadata"]["labels"]
    ]
    return deployment


def test_every_example_and_golden_file_is_covered():
    # vllm-*: stock vLLM pods (engine.kind: vllm), checked against vLLM's argument list
    # in tests/unit/operator/test_render_vllm.py instead.
    examples = {
        p.stem for p in (ROOT / "examples").glob("*.yaml") if not p.stem.startswith("vllm-")
    }
    assert examples == set(REFUSED)
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(REFUSED)


def check_source_resolves(model: str, deployment: dict[str, Any]) -> None:
    """As the server resolves it: a builtin is a file in an installed package; a path is
    a PVC mounted where the pod reads it (its files are the cluster's, not ours)."""
    if model.startswith("builtin:"):
        assert resolve_model_path(model).is_file()
        return
    if model.startswith("hf://"):  # fetched into the cache volume before the port is bound
        assert parse_hub_ref(model) is not None
        args = container_of(deployment)["args"]
        cache = args[args.index("--download-dir") + 1]
        assert cache in {m["mountPath"] for m in container_of(deployment)["volumeMounts"]}
        return
    mounts = {m["mountPath"] for m in container_of(deployment)["volumeMounts"]}
    assert model.startswith(f"{MODELS_MOUNT}/") or model == MODELS_MOUNT, model
    assert MODELS_MOUNT in mounts


@pytest.mark.parametrize("source", ["rendered", "golden"])
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_pod_command_is_one_the_server_starts_or_the_operator_refuses(name, source):
    deployment = rendered_deployment(name) if source == "rendered" else golden_deployment(name)
    container = container_of(deployment)
    assert container["command"] == ["llmservice"] and container["args"][0] == "serve"
    args = parse_serve_argv(container["args"][1:])  # the server's own parser
    owner, spec = example(name)
    support = check_engine(owner, spec, 0.95)
    if REFUSED[name] is None:
        engine, server = configs_from_args(args)
        assert server.port == container["ports"][0]["containerPort"]
        check_source_resolves(engine.model, deployment)
        assert not support.refuses_rollout
    else:
        with pytest.raises(UnsupportedError):
            configs_from_args(args)  # what `llmservice serve` would exit with at start
        assert support.refuses_rollout
        assert support.message.startswith(REFUSED[name])
