"""The router's children: when they exist, what they select, their RBAC, their flags."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from llmservice.operator.render import LABEL_SERVICE, selector_labels
from llmservice.operator.render_router import router_children
from llmservice.operator.router_spec import RouterSpec
from llmservice.router.cli import add_router_args, validate

from tests.support.golden import admitted, rendered

K8S_VERSION = "1.34.0"

GOLDEN = Path(__file__).parent / "golden_router"


def obj(**spec):
    return admitted({
        "apiVersion": "llmservice.dev/v1alpha1", "kind": "LLMService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": {"source": "builtin:smollm2-135m"},
                 "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "4Gi"}, **spec},
    })  # fmt: skip


SCALE_TO_ZERO = {"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 3,
                                 "scaleToZeroAfterSeconds": 120}}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "enabled", "wakes"),
    [
        ({}, False, False),  # one replica, no autoscaling: the Service goes to the pod
        ({"replicas": 3}, True, False),
        ({"autoscaling": {"enabled": True, "maxReplicas": 1}}, False, False),
        ({"autoscaling": {"enabled": True, "maxReplicas": 4}}, True, False),
        (SCALE_TO_ZERO, True, True),
        ({"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1}}, True, True),
        ({"replicas": 3, "router": {"enabled": False}}, False, False),
        ({"router": {"enabled": True}}, True, False),
    ],
)
def test_on_by_default_when_zero_or_several_replicas(spec, enabled, wakes):
    r = RouterSpec.from_dict(obj(**spec)["spec"])
    assert (r.enabled, r.scale_from_zero) == (enabled, wakes)
    assert bool(rendered(obj(**spec)).router) == enabled


def test_crd_defaults_match_router_spec():
    stored = obj(router={"enabled": True})["spec"]["router"]
    d = RouterSpec()
    assert stored == {
        "enabled": True, "replicas": d.replicas, "policy": d.policy, "loadFactor": d.load_factor,
        "prefixTokens": d.prefix_tokens, "maxHeldRequests": d.max_held_requests,
        "holdTimeoutSeconds": d.hold_timeout_seconds, "cpu": d.cpu, "memory": d.memory,
    }  # fmt: skip


def test_golden_scale_to_zero():
    m = rendered(obj(**SCALE_TO_ZERO))
    text = yaml.safe_dump_all(m.all(), sort_keys=False)
    path = GOLDEN / "scale-to-zero.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    for manifest in m.all():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def by_kind(m, kind, name=None):
    found = [
        c for c in m.all() if c["kind"] == kind and (name is None or c["metadata"]["name"] == name)
    ]
    return found


def test_services_select_router_and_pods_and_router_pods_are_not_model_pods():
    m = rendered(obj(**SCALE_TO_ZERO))
    (router,) = by_kind(m, "Deployment", "chat-router")
    router_pod_labels = router["spec"]["template"]["metadata"]["labels"]
    assert m.service["spec"]["selector"].items() <= router_pod_labels.items()
    (pods,) = by_kind(m, "Service", "chat-pods")
    assert pods["spec"]["clusterIP"] == "None" and pods["spec"]["selector"] == selector_labels(
        "chat"
    )
    # The operator's indexes and the PDB select on these: router pods must match none.
    assert (
        LABEL_SERVICE not in router_pod_labels and LABEL_SERVICE not in router["metadata"]["labels"]
    )
    assert not selector_labels("chat").items() <= router_pod_labels.items()


def test_role_is_least_privilege():
    (role,) = by_kind(rendered(obj(**SCALE_TO_ZERO)), "Role")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        {"apiGroups": ["llmservice.dev"], "resources": ["llmservices/scale"],
         "resourceNames": ["chat"], "verbs": ["get", "patch"]},
    ]  # fmt: skip
    (no_wake,) = by_kind(rendered(obj(replicas=2)), "Role")
    assert [r["resources"] for r in no_wake["rules"]] == [["endpointslices"]]


def test_router_args_parse_with_the_routers_own_parser():
    (router,) = by_kind(rendered(obj(**SCALE_TO_ZERO)), "Deployment", "chat-router")
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["llmservice"] and container["args"][0] == "router"
    parser = argparse.ArgumentParser()
    add_router_args(parser)
    args = parser.parse_args(container["args"][1:])
    assert validate(args) is None
    assert (args.namespace, args.service, args.pods_service) == ("default", "chat", "chat-pods")
    assert (
        args.scale_from_zero and args.max_held_requests == 100 and args.hold_timeout_seconds == 300
    )


def test_with_an_inference_pool_the_router_pods_also_serve_ext_proc():
    def container(spec):
        (router,) = by_kind(rendered(obj(**spec)), "Deployment", "chat-router")
        return router["spec"]["template"]["spec"]["containers"][0]

    pooled = container({"replicas": 2, "gateway": {"inferencePool": True}})
    parser = argparse.ArgumentParser()
    add_router_args(parser)
    args = parser.parse_args(pooled["args"][1:])
    assert validate(args) is None and args.ext_proc and args.ext_proc_port == 9002
    assert {"name": "ext-proc", "containerPort": 9002, "protocol": "TCP"} in pooled["ports"]
    plain = container({"replicas": 2})
    assert "--ext-proc" not in plain["args"]
    assert [p["name"] for p in plain["ports"]] == ["http"]


def test_every_router_child_is_listed_for_deletion():
    m = rendered(obj(**SCALE_TO_ZERO))
    rendered_names = {(c["kind"], c["metadata"]["name"]) for c in m.router}
    kinds = {"deployments": "Deployment", "services": "Service", "rolebindings": "RoleBinding",
             "roles": "Role", "serviceaccounts": "ServiceAccount"}  # fmt: skip
    listed = {(kinds[plural], name) for _, plural, name in router_children(rendered_owner())}
    assert listed == rendered_names


def rendered_owner():
    from llmservice.operator.render import Owner

    return Owner("chat", "default", "11111111-2222-3333-4444-555555555555")
