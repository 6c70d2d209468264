"""Pure translation of a pod's container into a local process (argv, env, probe URL).

The fake kubelet runs containers as host processes, so what a container runtime and a
pod network namespace would provide is emulated here:
- `$(VAR)` references in command/args expand from the container's env, as Kubernetes does;
- env `valueFrom.fieldRef` for the downward-API fields pods commonly use;
- a pod gets its own loopback IP (127.0.0.x) instead of a network namespace, so a server
  told to bind all interfaces ("0.0.0.0" / "::") is bound to the pod IP instead — two
  replicas listening on the same port then coexist, as in separate namespaces;
- the projected service-account token volume becomes a kubeconfig holding a token the
  kubelet requested for the pod's ServiceAccount (bound to the pod), named by
  $KUBECONFIG: in-cluster config cannot load outside a pod, and clients such as the
  `kubernetes` package fall back to $KUBECONFIG. The process then has exactly the
  ServiceAccount's RBAC, as in a real pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_ALL_INTERFACES = ("0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class ProcessPlan:
    argv: list[str]
    env: dict[str, str]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: unknown references stay verbatim, `$$` -> `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(sub, text)


def field_ref(path: str, pod: dict[str, Any], pod_ip: str, host_ip: str) -> str:
    """The downward-API value of `fieldRef.fieldPath` for the fields we support."""
    meta = pod.get("metadata", {})
    values = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
    }
    if path not in values:
        raise ValueError(f"fake kubelet does not support fieldRef {path!r}")
    return values[path]


def container_env(
    container: dict[str, Any], pod: dict[str, Any], pod_ip: str, host_ip: str
) -> dict[str, str]:
    """The container's env in order, each value expanded against the earlier ones."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
        elif (item.get("valueFrom") or {}).get("fieldRef"):
            env[name] = field_ref(item["valueFrom"]["fieldRef"]["fieldPath"], pod, pod_ip, host_ip)
        else:
            raise ValueError(f"fake kubelet cannot resolve env {name!r}: {item}")
    return env


def bind_to_pod_ip(args: list[str], pod_ip: str) -> list[str]:
    """Replace an all-interfaces bind address, alone or in `--flag=value`, by the pod IP."""
    out = []
    for a in args:
        if a in _ALL_INTERFACES:
            out.append(pod_ip)
            continue
        flag, eq, value = a.partition("=")
        if eq and flag.startswith("-") and value in _ALL_INTERFACES:
            out.append(f"{flag}={pod_ip}")
        else:
            out.append(a)
    return out


def process_plan(
    container: dict[str, Any], pod: dict[str, Any], pod_ip: str, host_ip: str
) -> ProcessPlan:
    """argv + env for running `container` of `pod` locally; needs an explicit command."""
    command = list(container.get("command") or [])
    if not command:
        raise ValueError(
            f"container {container.get('name')!r} has no command: the fake kubelet cannot "
            "know an image's entrypoint"
        )
    env = container_env(container, pod, pod_ip, host_ip)
    env.setdefault("POD_IP", pod_ip)
    argv = [expand(x, env) for x in command + list(container.get("args") or [])]
    return ProcessPlan(argv=bind_to_pod_ip(argv, pod_ip), env=env)


def probe_url(container: dict[str, Any], pod_ip: str) -> str | None:
    """The readiness probe as an http URL (httpGet only), or None if there is none.

    A named port is resolved from the container's ports; host defaults to the pod IP.
    """
    probe = container.get("readinessProbe") or {}
    http = probe.get("httpGet")
    if not http:
        if probe:
            raise ValueError(f"fake kubelet supports httpGet readiness probes only: {probe}")
        return None
    port = http["port"]
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        if port not in named:
            raise ValueError(f"readiness probe port {port!r} is not a container port")
        port = named[port]
    host = http.get("host") or pod_ip
    scheme = str(http.get("scheme") or "HTTP").lower()
    path = http.get("path") or "/"
    return f"{scheme}://{host}:{port}{path}"


def service_account_kubeconfig(server: str, ca_file: str, token: str, namespace: str) -> dict:
    """The kubeconfig a pod's process gets in place of its token volume."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": server,
                                                    "certificate-authority": ca_file}}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod",
                                                 "namespace": namespace}}],
        "current-context": "pod",
    }  # fmt: skip


def automounts_token(pod: dict[str, Any]) -> bool:
    """Kubernetes' default: mount the token unless the pod opts out."""
    return pod.get("spec", {}).get("automountServiceAccountToken", True) is not False
