"""The LeaderWorkerSet CRD of the pinned sigs.k8s.io/lws module (hack/fetch-lws-crd.sh),
parsed once per test process.

The file is 1.2 MB of YAML: libyaml's CSafeLoader reads it in ~0.7 s where PyYAML's
pure-Python loader took 8-18 s on this machine, once in each test that needed it.
"""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def lws_crd_path() -> Path:
    out = subprocess.run(
        [str(ROOT / "hack/fetch-lws-crd.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


@cache
def _parsed() -> dict[str, Any]:
    return yaml.load(lws_crd_path().read_text(), Loader=Loader)  # noqa: S506 - a safe loader


def lws_crd() -> dict[str, Any]:
    """The CRD object (a copy: an API client may change what it is given)."""
    return copy.deepcopy(_parsed())


def lws_schema(version: str = "v1") -> dict[str, Any]:
    """The openAPIV3Schema of one served version (shared: do not change it)."""
    (found,) = [v for v in _parsed()["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]
