"""The Gateway API Inference Extension CRDs of the pinned module (hack/fetch-gateway-crds.sh),
parsed once per test process, and the module's model-server protocol document."""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
FILES = {
    "InferencePool": "inference.networking.k8s.io_inferencepools.yaml",
    "InferenceObjective": "inference.networking.x-k8s.io_inferenceobjectives.yaml",
}


@cache
def crd_dir() -> Path:
    out = subprocess.run(
        [str(ROOT / "hack/fetch-gateway-crds.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


@cache
def _parsed(kind: str) -> dict[str, Any]:
    return yaml.load((crd_dir() / FILES[kind]).read_text(), Loader=Loader)  # noqa: S506 - a safe loader


def gateway_crd(kind: str) -> dict[str, Any]:
    """The CRD object of one kind (a copy: an API client may change what it is given)."""
    return copy.deepcopy(_parsed(kind))


def gateway_schema(kind: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of one served version of one kind (shared: do not change it)."""
    (found,) = [v for v in _parsed(kind)["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]


def protocol_doc() -> str:
    """docs/proposals/003-model-server-protocol/README.md of the pinned module: the metrics
    the endpoint picker scrapes from each model server (model_server_protocol.py parses it)."""
    return (crd_dir() / "model-server-protocol.md").read_text()
