"""spec.networkPolicy -> an optional NetworkPolicy in front of the server pods. Pure.

With `enabled: true` only these reach the pods' port: pods of the LLMService's own
namespace, pods of the namespaces `allowedNamespaces` selects (a label selector; `{}`
means every namespace), and the operator's pods wherever it runs (it scrapes /metrics
for the autoscaler; matched by the chart's component labels, so a custom release name
or namespace still works). Nothing else is allowed in; egress is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Labels every operator pod of the chart carries (charts/.../_helpers.tpl "labels").
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "llmservice"}


@dataclass(frozen=True)
class NetworkPolicySpec:
    enabled: bool = False
    allowed_namespaces: dict[str, Any] | None = field(default=None)  # a LabelSelector

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> NetworkPolicySpec:
        if not data:
            return cls()
        return cls(enabled=bool(data.get("enabled", False)), allowed_namespaces=data.get("allowedNamespaces"))


def render_network_policy(
    metadata: dict[str, Any], pod_selector: dict[str, str], port: int, spec: NetworkPolicySpec
) -> dict[str, Any] | None:
    """The NetworkPolicy for `metadata` (name, namespace, owner), or None when disabled."""
    if not spec.enabled:
        return None
    sources: list[dict[str, Any]] = [
        {"podSelector": {}},  # the LLMService's own namespace
        {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}},
    ]
    if spec.allowed_namespaces is not None:
        sources.append({"namespaceSelector": spec.allowed_namespaces})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": dict(pod_selector)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": sources, "ports": [{"port": port, "protocol": "TCP"}]}],
        },
    }
