"""Value sets the chart is rendered with in tests, and RBAC checks shared by the tests.

`allows()` is the RBAC authorizer's rule match (apiGroups x resources x verbs, with the
subresource written `resource/sub`), enough to ask "may this ServiceAccount do X?" of the
rendered (Cluster)Roles without an API server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "leader-election": {"leaderElection.enabled": True},
    "service-monitor": {"metrics.enabled": True, "metrics.serviceMonitor.enabled": True},
    "dashboard": {"dashboard.enabled": True},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced-leader-election": {
        "watchNamespaces": ["team-a", "team-b"],
        "leaderElection.enabled": True,
    },
    "everything": {
        "watchNamespaces": ["team-a"],
        "leaderElection.enabled": True,
        "metrics.enabled": True,
        "metrics.serviceMonitor.enabled": True,
        "metrics.serviceMonitor.labels": {"release": "kube-prometheus-stack"},
        "dashboard.enabled": True,
        "dashboard.namespace": "monitoring",
        "logLevel": "debug",
        "maxGpuMemoryUtilization": 0.9,
        "serverImage": "registry.example/llmservice:0.1.0-cu128",
        "hfEndpoint": "https://hf-mirror.example",
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "ml-platform"},
        "imagePullSecrets": [{"name": "regcred"}],
    },
}


@dataclass(frozen=True)
class Access:
    """One authorization question: verb on group/resource[/subresource] in a namespace."""

    verb: str
    group: str
    resource: str  # "llmservices" or "llmservices/status"
    namespace: str | None  # None: cluster-scoped or all namespaces


def rule_allows(rule: dict[str, Any], access: Access) -> bool:
    return (
        access.group in rule.get("apiGroups", [])
        and access.resource in rule.get("resources", [])
        and access.verb in rule.get("verbs", [])
        and not rule.get("resourceNames")
    )


def bound_roles(
    docs: list[dict[str, Any]], sa_name: str, sa_namespace: str
) -> list[tuple[str | None, dict[str, Any]]]:
    """(namespace or None for cluster-wide, role) for every role bound to the ServiceAccount."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    found: list[tuple[str | None, dict[str, Any]]] = []
    for binding in docs:
        if binding.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding.get("subjects", [])
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == sa_name
            and s.get("namespace") == sa_namespace
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_ns = scope if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, (
            f"{binding['kind']} {binding['metadata']['name']} refers to a missing {ref}"
        )
        found.append((scope, role))
    return found


def allows(docs: list[dict[str, Any]], sa_name: str, sa_namespace: str, access: Access) -> bool:
    """Would the rendered RBAC let the ServiceAccount do this?"""
    for scope, role in bound_roles(docs, sa_name, sa_namespace):
        if scope is not None and access.namespace != scope:
            continue  # a RoleBinding grants only inside its own namespace
        if any(rule_allows(rule, access) for rule in role.get("rules", [])):
            return True
    return False
