"""spec.engine.apiKeySecretRef's key, read as the pods get it, for the operator's own
calls to the pods (adapter loads, sleep)."""

from __future__ import annotations

import base64

from llmservice.operator.kube import Kube, path_for
from llmservice.operator.spec import SecretKeyRef


def read_api_key(kube: Kube, namespace: str, ref: SecretKeyRef) -> str:
    """The key's value; ValueError says what is wrong."""
    where = f"Secret {namespace}/{ref.name}"
    secret = kube.get(path_for("v1", "secrets", namespace, ref.name))
    if secret is None:
        raise ValueError(f"{where} (spec.engine.apiKeySecretRef) does not exist")
    value = (secret.get("data") or {}).get(ref.key)
    if not value:
        raise ValueError(f"{where} has no key {ref.key!r} (spec.engine.apiKeySecretRef.key)")
    return base64.b64decode(value).decode().strip()
