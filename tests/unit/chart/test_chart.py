"""The Helm chart, rendered by the real helm: lint, schemas, RBAC, probes, one CRD source.

Every scenario in scenarios.py is rendered; every manifest must pass the Kubernetes
OpenAPI schemas of the pinned release with unknown fields rejected (kubernetes-validate
--strict); custom resources are checked against their own CRDs.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from llmservice.operator.admission import admit

from tests.unit.chart.helm import (
    CHART,
    K8S_VERSION,
    NAMESPACE,
    ROOT,
    Helm,
    HelmError,
    by_kind,
    one,
    operator_container,
)
from tests.unit.chart.scenarios import SCENARIOS, Access, allows

OPERATOR_RULES = {
    # (apiGroup, resource): verbs — exactly what the operator (and the autoscaler) use.
    ("llmservice.dev", "llmservices"): {"get", "list", "watch", "patch"},
    ("llmservice.dev", "llmservices/status"): {"patch"},
    ("llmservice.dev", "llmservices/scale"): {"get", "patch"},
    # delete: a vllm object that grows past one node swaps its Deployment for an LWS
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    # multi-node vllm replicas (docs/vllm.md): applied, watched for status, deleted when
    # the object is back within one node
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {
        "get", "list", "watch", "create", "patch", "delete",
    },
    # delete: spec.router off removes the pods' headless Service
    ("", "services"): {"get", "create", "patch", "delete"},
    # the router's ServiceAccount, Role, RoleBinding (docs/router.md)
    ("", "serviceaccounts"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch", "delete"},
    # held only to grant it to the router's Role (RBAC's escalation check)
    ("discovery.k8s.io", "endpointslices"): {"list", "watch"},
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    # spec.networkPolicy: applied when enabled, deleted when disabled
    ("networking.k8s.io", "networkpolicies"): {"get", "create", "patch", "delete"},
    # spec.gateway.inferencePool (docs/gateway.md): applied when on, deleted when off
    ("inference.networking.k8s.io", "inferencepools"): {"get", "create", "patch", "delete"},
    ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "events"): {"create"},
    # the VRAM check of an hf:// model reads its token Secret (by name)
    ("", "secrets"): {"get"},
    ("monitoring.coreos.com", "servicemonitors"): {"get", "create", "patch"},
}
PEERING_VERBS = {"list", "watch", "patch"}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def rendered(request: pytest.FixtureRequest, helm: Helm) -> tuple[str, list[dict[str, Any]]]:
    return request.param, helm.template(SCENARIOS[request.param])


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema for the CRDs the chart ships."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


# ------------------------------------------------------------------ lint and schemas


@pytest.mark.parametrize("scenario", ["default", "everything"])
def test_helm_lint_is_clean(helm: Helm, scenario: str):
    out = helm.lint(SCENARIOS[scenario])
    assert "0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_every_manifest_passes_the_kubernetes_schemas(rendered):
    name, docs = rendered
    custom = crd_schemas()
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in custom:  # kopf's peering objects: our CRD's schema, as the API server would
            _, errors = admit(custom[key], doc, None)
            assert errors == [], (name, doc["kind"], errors)
        elif doc["kind"] == "ServiceMonitor":
            continue  # no offline schema for the Prometheus Operator's CRD: see the test below
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_is_not_vacuous(helm: Helm):
    deployment = one(helm.template(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_service_monitor_scrapes_the_metrics_service(helm: Helm):
    docs = helm.template(SCENARIOS["service-monitor"])
    monitor = one(docs, "ServiceMonitor")
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    port_names = [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # series keep the LLMService's namespace label
    # ... and the Service reaches the operator pod's metrics port.
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in operator_container(docs)["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in container_ports


def test_optional_objects_appear_only_when_switched_on(helm: Helm):
    default = {d["kind"] for d in helm.template()}
    assert default == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}
    assert {d["kind"] for d in helm.template(SCENARIOS["service-monitor"])} - default == {
        "Service",
        "ServiceMonitor",
    }
    assert {d["kind"] for d in helm.template(SCENARIOS["dashboard"])} - default == {"ConfigMap"}
    assert {d["kind"] for d in helm.template(SCENARIOS["leader-election"])} - default == {
        "ClusterKopfPeering"
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"maxGpuMemoryUtilization": 1.0}, "maxGpuMemoryUtilization"),
        ({"maxGpuMemoryUtilization": "0.3"}, "must lie in [0.5, 0.95]"),
        ({"logLevel": "trace"}, "logLevel"),
        ({"watchNamespace": ["team-a"]}, "watchNamespace"),  # a typo is an error, not ignored
        ({"metrics.serviceMonitor.enabled": True}, "needs metrics.enabled"),
    ],
)
def test_bad_values_are_refused_with_a_message(helm: Helm, values, message):
    with pytest.raises(HelmError, match=re.escape(message)):
        helm.template(values)


def test_set_passes_the_utilization_as_a_string_and_it_still_works(helm: Helm):
    docs = helm.template(None, CHART, "--set", "maxGpuMemoryUtilization=0.85")
    assert "--max-gpu-memory-utilization=0.85" in operator_container(docs)["args"]


# ------------------------------------------------------------------ RBAC


def test_no_wildcard_rbac(rendered):
    name, docs = rendered
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert all("*" not in item for item in rule[field]), (name, rule)
            assert "nonResourceURLs" not in rule, (name, rule)


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(helm: Helm):
    docs = helm.template()
    (role,) = by_kind(docs, "ClusterRole")
    expected = {
        **OPERATOR_RULES,
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    }
    assert rules_of(role) == expected
    assert not by_kind(docs, "Role")


def test_peering_rights_only_with_leader_election(helm: Helm):
    (role,) = by_kind(helm.template(SCENARIOS["leader-election"]), "ClusterRole")
    assert rules_of(role)[("kopf.dev", "clusterkopfpeerings")] == PEERING_VERBS
    for scenario in ("default", "namespaced", "service-monitor", "dashboard"):
        for r in by_kind(helm.template(SCENARIOS[scenario]), "ClusterRole") + by_kind(
            helm.template(SCENARIOS[scenario]), "Role"
        ):
            assert all(group != "kopf.dev" for group, _ in rules_of(r)), scenario


def test_namespaced_install_grants_nothing_namespaced_cluster_wide(helm: Helm):
    docs = helm.template(SCENARIOS["namespaced-leader-election"])
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    (observer,) = by_kind(docs, "ClusterRole")
    assert rules_of(observer) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
    }
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rules_of(role) == {**OPERATOR_RULES, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
    patch_in = Access("patch", "apps", "deployments", "team-a")
    assert allows(docs, sa, NAMESPACE, patch_in)
    assert not allows(docs, sa, NAMESPACE, Access("patch", "apps", "deployments", "default"))
    assert not allows(docs, sa, NAMESPACE, Access("patch", "apps", "deployments", None))


def test_bindings_name_the_deployments_service_account(rendered):
    name, docs = rendered
    sa = one(docs, "ServiceAccount")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    bindings = by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")
    assert bindings
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
        ], name


def test_rbac_off_renders_no_roles(helm: Helm):
    kinds = {d["kind"] for d in helm.template({"rbac.create": False})}
    assert kinds.isdisjoint({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})


# ------------------------------------------------------------------ the operator Deployment


def test_operator_runs_non_root_with_a_read_only_root_filesystem(rendered):
    name, docs = rendered
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # The only writable path is the /tmp emptyDir, which is where HOME points.
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    assert {"name": "HOME", "value": "/tmp"} in container["env"]
    assert deployment["spec"]["replicas"] == 1


def test_probes_call_kopfs_liveness_endpoint(rendered):
    name, docs = rendered
    container = operator_container(docs)
    liveness = [a for a in container["args"] if a.startswith("--liveness=")]
    assert len(liveness) == 1, container["args"]
    url = urlsplit(liveness[0].split("=", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == url.path == "/healthz", probe
        assert ports[get["port"]] == url.port, probe
    assert url.hostname == "0.0.0.0"  # the kubelet probes the pod IP, not loopback


def test_scope_and_peering_flags_follow_the_values(helm: Helm):
    def args(scenario: str) -> list[str]:
        return operator_container(helm.template(SCENARIOS[scenario]))["args"]

    assert "--all-namespaces" in args("default")
    assert not any(a.startswith("--peering") for a in args("default"))
    assert ["--namespace=team-a", "--namespace=team-b"] == [
        a for a in args("namespaced") if a.startswith("--namespace")
    ]
    assert "--all-namespaces" not in args("namespaced")
    docs = helm.template(SCENARIOS["leader-election"])
    peering = one(docs, "ClusterKopfPeering")["metadata"]["name"]
    assert f"--peering={peering}" in operator_container(docs)["args"]
    namespaced = helm.template(SCENARIOS["namespaced-leader-election"])
    assert sorted(p["metadata"]["namespace"] for p in by_kind(namespaced, "KopfPeering")) == [
        "team-a",
        "team-b",
    ]


def test_rollout_strategy_never_runs_two_active_operators(helm: Helm):
    plain = one(helm.template(), "Deployment")["spec"]["strategy"]
    assert plain == {"type": "Recreate"}
    peered = one(helm.template(SCENARIOS["leader-election"]), "Deployment")["spec"]["strategy"]
    assert peered["type"] == "RollingUpdate"


def test_operator_pod_identity_for_peering_is_the_pod_name(rendered):
    _, docs = rendered
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_arguments_are_accepted_by_the_operator_cli(helm: Helm, scenario: str):
    from llmservice.operator.cli import parse_args

    container = operator_container(helm.template(SCENARIOS[scenario]))
    assert container["command"] == ["llmservice", "operator"]
    parse_args(container["args"])


def test_server_image_value_reaches_the_operators_options(helm: Helm):
    from llmservice.operator.cli import parse_args

    container = operator_container(helm.template(SCENARIOS["everything"]))
    assert parse_args(container["args"]).server_image == "registry.example/llmservice:0.1.0-cu128"
    default = operator_container(helm.template())
    assert not any(a.startswith("--server-image") for a in default["args"])
    with pytest.raises(SystemExit):
        parse_args(["--server-image="])  # an empty value would render pods without an image


def test_hf_endpoint_value_reaches_the_operators_options(helm: Helm, monkeypatch):
    from llmservice.operator.cli import parse_args

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    container = operator_container(helm.template(SCENARIOS["everything"]))
    assert parse_args(container["args"]).options.hf_endpoint == "https://hf-mirror.example"
    default = operator_container(helm.template())
    assert not any(a.startswith("--hf-endpoint") for a in default["args"])
    assert parse_args(default["args"]).options.hf_endpoint == "https://huggingface.co"
    with pytest.raises(HelmError):
        helm.template({"hfEndpoint": "huggingface.co"})  # not a URL: the schema refuses it


# ------------------------------------------------------------------ one source of truth


def test_chart_crd_is_the_repository_crd():
    chart_crd = (CHART / "crds" / "llmservice.yaml").read_bytes()
    assert chart_crd == (ROOT / "crds" / "llmservice.yaml").read_bytes(), (
        "charts/llmservice-operator/crds/llmservice.yaml differs from crds/llmservice.yaml: "
        "cp crds/llmservice.yaml charts/llmservice-operator/crds/"
    )


def test_chart_dashboard_is_the_repository_dashboard():
    assert (CHART / "dashboards" / "llmservice.json").read_bytes() == (
        ROOT / "dashboards" / "llmservice.json"
    ).read_bytes(), "cp dashboards/llmservice.json charts/llmservice-operator/dashboards/"


def test_dashboard_configmap_carries_the_dashboard(helm: Helm):
    docs = helm.template(SCENARIOS["everything"])
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["data"]["llmservice.json"].strip() == (
        (ROOT / "dashboards" / "llmservice.json").read_text().strip()
    )


def test_peering_crds_are_the_resources_kopf_uses():
    from kopf._cogs.structs import references

    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    served = {
        (d["spec"]["group"], d["spec"]["versions"][0]["name"], d["spec"]["names"]["plural"]): d[
            "spec"
        ]["scope"]
        for d in docs
    }
    for selector, scope in (
        (references.CLUSTER_PEERINGS_K, "Cluster"),
        (references.NAMESPACED_PEERINGS_K, "Namespaced"),
    ):
        assert served[(selector.group, selector.version, selector.any_name)] == scope


def test_app_version_is_the_project_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    from llmservice.operator.cli import parse_args

    import llmservice

    assert chart["appVersion"] == project == llmservice.__version__
    # The default images are tagged with it: the operator's and its --server-image default.
    assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"] == ""
    assert parse_args([]).server_image == f"ghcr.io/llmservice/llmservice:{project}"


# ------------------------------------------------------------------ values.yaml


def _value_paths(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict) and tree:
        paths = []
        for key, value in tree.items():
            paths += _value_paths(value, f"{prefix}.{key}" if prefix else key)
        return paths
    return [prefix]


def test_every_values_key_has_a_comment():
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_][\w]*):", line)
        if not m:
            continue
        above = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if "#" not in line.split(":", 1)[1] and not above.strip().startswith("#"):
            missing.append(m.group(2))
    assert missing == []


def test_every_values_key_is_used_by_a_template():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "\n".join(p.read_text() for p in (CHART / "templates").iterdir())
    unused = []
    for path in _value_paths(values):
        parts = path.split(".")
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        if not any(re.search(rf"\.Values\.{re.escape(p)}(?![\w.])", templates) for p in prefixes):
            unused.append(path)
    assert unused == []


def test_every_values_key_is_in_the_values_schema():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in values.items():
        assert key in schema["properties"], key
        node = schema["properties"][key]
        if isinstance(value, dict) and node.get("additionalProperties") is False:
            for sub in value:
                assert sub in node["properties"], f"{key}.{sub}"


# ------------------------------------------------------------------ NOTES.txt


def render_notes(helm: Helm, tmp_path: Path, values: dict[str, Any]) -> str:
    """helm renders NOTES.txt only on install; render the same text through `tpl`."""
    import shutil

    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "notes").mkdir()
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes" / "NOTES.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes/NOTES.txt") . | toJson }}\n'
    )
    docs = helm.template(values, chart, "--show-only", "templates/zz-notes.yaml")
    return docs[0]["data"]["notes"]


def test_notes_tell_the_next_command(helm: Helm, tmp_path: Path):
    notes = render_notes(helm, tmp_path, {})
    assert "kubectl -n default apply -f examples/smollm2-cpu.yaml" in notes
    assert (ROOT / "examples" / "smollm2-cpu.yaml").is_file()
    assert "kubectl -n default get llms -w" in notes
    # The inline manifest is the example itself (same spec once the CRD's defaults apply).
    inline = notes.split("cat <<'YAML'", 1)[1].split("\n", 1)[1].split("\n  YAML", 1)[0]
    crd = yaml.safe_load((ROOT / "crds" / "llmservice.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ours, errors = admit(schema, yaml.safe_load(inline), None)
    assert errors == []
    example, _ = admit(
        schema, yaml.safe_load((ROOT / "examples" / "smollm2-cpu.yaml").read_text()), None
    )
    assert ours["spec"] == example["spec"]


def test_notes_use_the_first_watched_namespace(helm: Helm, tmp_path: Path):
    notes = render_notes(helm, tmp_path, {"watchNamespaces": ["team-a"], "dashboard.enabled": True})
    assert "kubectl -n team-a apply -f examples/smollm2-cpu.yaml" in notes
    assert "serving namespaces: team-a" in notes
    assert "grafana_dashboard" in notes
