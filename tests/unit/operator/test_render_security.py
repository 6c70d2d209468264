"""The pod details that harden a rollout: the API key from a Secret (never on the command line),
the preStop hook inside the grace period, the rollout that keeps every replica, the
optional NetworkPolicy, and the restricted Pod Security profile's fields."""

from __future__ import annotations

from llmservice.operator.render import PRE_STOP_SLEEP_S, Owner, render
from llmservice.operator.spec import LLMServiceSpec

OWNER = Owner("m", "team", "uid-1")


def _spec(**extra) -> LLMServiceSpec:
    return LLMServiceSpec.from_dict({"model": {"source": "builtin:smollm2-135m"}, **extra})


def _container(manifests):
    return manifests.deployment["spec"]["template"]["spec"]["containers"][0]


def test_api_key_comes_from_the_secret_as_env():
    spec = _spec(engine={"apiKeySecretRef": {"name": "keys", "key": "k"}, "requestTimeoutSeconds": 30})
    c = _container(render(OWNER, spec))
    (env,) = [e for e in c["env"] if e["name"] == "LLMSERVICE_API_KEY"]
    assert env["valueFrom"] == {"secretKeyRef": {"name": "keys", "key": "k"}}
    assert "--api-key" not in c["args"] and c["args"][c["args"].index("--request-timeout-s") + 1] == "30"
    assert all(e["name"] != "LLMSERVICE_API_KEY" for e in _container(render(OWNER, _spec()))["env"])


def test_pre_stop_then_drain_fit_the_grace_period_and_rollout_keeps_replicas():
    spec = _spec(engine={"shutdownGraceSeconds": 20})
    d = render(OWNER, spec).deployment
    pod = d["spec"]["template"]["spec"]
    assert pod["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": PRE_STOP_SLEEP_S}}
    assert pod["terminationGracePeriodSeconds"] > PRE_STOP_SLEEP_S + 20
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_restricted_profile_fields():
    pod = render(OWNER, _spec()).deployment["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}


def test_network_policy_only_when_enabled():
    assert render(OWNER, _spec()).network_policy is None
    selector = {"matchLabels": {"team": "apps"}}
    m = render(OWNER, _spec(networkPolicy={"enabled": True, "allowedNamespaces": selector}))
    policy = m.network_policy
    assert policy in m.all() and policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["spec"]["podSelector"] == m.deployment["spec"]["selector"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert {"podSelector": {}} in rule["from"] and {"namespaceSelector": selector} in rule["from"]
    assert any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "operator"
               for f in rule["from"])
    only_own = render(OWNER, _spec(networkPolicy={"enabled": True})).network_policy
    assert len(only_own["spec"]["ingress"][0]["from"]) == 2
