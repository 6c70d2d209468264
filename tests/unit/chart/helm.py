"""Run the real `helm` on our chart: find the binary, render, lint.

helm is built from its Go module by `hack/build-control-plane.sh` (see
docs/control-plane.md); a machine that has not built it cannot run these tests. They skip
with the reason, unless LLMSERVICE_REQUIRE_HELM=1 (CI, `make test` once it builds helm),
where a missing helm is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "llmservice-operator"
K8S_VERSION = "1.37.0"  # the control plane's release (hack/control-plane: v1.37.2)
RELEASE, NAMESPACE = "llms", "llm-system"


def find_helm() -> tuple[Path | None, str]:
    """The helm binary, or None and where it was looked for."""
    candidates: list[Path] = []
    if os.environ.get("LLMSERVICE_HELM"):
        candidates.append(Path(os.environ["LLMSERVICE_HELM"]))
    candidates.append(ROOT / ".cache" / "bin" / "helm")
    try:
        out = subprocess.run(
            [str(ROOT / "hack" / "build-control-plane.sh"), "--print"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        if out:
            candidates.append(Path(out) / "helm")
    except (OSError, subprocess.SubprocessError):
        pass
    on_path = shutil.which("helm")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
    return None, "helm not found in " + ", ".join(str(c) for c in candidates)


def require_helm() -> Path:
    helm, where = find_helm()
    if helm is not None:
        return helm
    reason = f"{where}: build it with `make control-plane` (hack/build-control-plane.sh)"
    if os.environ.get("LLMSERVICE_REQUIRE_HELM") == "1":
        pytest.fail(f"LLMSERVICE_REQUIRE_HELM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


class HelmError(Exception):
    pass


class Helm:
    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        # Keep helm's caches and config out of the user's home (and off a shared machine's).
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if done.returncode != 0:
            raise HelmError(done.stderr.strip() or done.stdout.strip())
        return done.stdout

    @staticmethod
    def value_args(values: Mapping[str, Any]) -> list[str]:
        """Values as `--set-json` (keeps numbers numbers, lists lists)."""
        args: list[str] = []
        for key, value in values.items():
            args += ["--set-json", f"{key}={json.dumps(value)}"]
        return args

    def template(
        self, values: Mapping[str, Any] | None = None, chart: Path = CHART, *extra: str
    ) -> list[dict[str, Any]]:
        out = self.run(
            "template", RELEASE, str(chart), "--namespace", NAMESPACE,
            "--kube-version", K8S_VERSION, *self.value_args(values or {}), *extra,
        )  # fmt: skip
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def lint(self, values: Mapping[str, Any] | None = None) -> str:
        return self.run(
            "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
            "--kube-version", K8S_VERSION, *self.value_args(values or {}),
        )  # fmt: skip


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container
