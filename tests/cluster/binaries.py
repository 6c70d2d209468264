"""Where the control-plane binaries are, and why the cluster tier cannot run if not.

`hack/build-control-plane.sh` (run by `make control-plane`, and by `make test` before
the cluster tests) compiles kube-apiserver, kube-controller-manager, kube-scheduler and
kubectl into one binary plus helm, caches them outside the repo and links the repo's
`.cache/bin` to them. etcd is Debian's `etcd-server` on PATH (3.4 is accepted by the
pinned apiserver, see docs/control-plane.md) unless an `etcd` sits in the bin folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"


@dataclass(frozen=True)
class Binaries:
    """Executables of one built control plane."""

    control_plane: Path  # multiplexer: `control-plane kube-apiserver ...`
    helm: Path
    etcd: Path

    def kubectl(self) -> list[str]:
        return [str(self.control_plane), "kubectl"]


def _bin_dir() -> Path:
    """The env override, else the folder the build script would fill for these pins."""
    override = os.environ.get("LLMSERVICE_CONTROL_PLANE_BIN")
    if override:
        return Path(override)
    try:
        out = subprocess.run(
            [str(BUILD_SCRIPT), "--print"], check=True, capture_output=True, text=True
        ).stdout
        return Path(out.strip())
    except (OSError, subprocess.CalledProcessError):
        return REPO / ".cache" / "bin"


def find_binaries() -> tuple[Binaries | None, str]:
    """Return the binaries, or None and the reason the cluster tests must skip."""
    bin_dir = _bin_dir()
    cp = bin_dir / "control-plane"
    helm = bin_dir / "helm"
    if not (bin_dir / ".complete").is_file() or not cp.is_file() or not helm.is_file():
        return None, (
            f"control-plane binaries not built in {bin_dir}: "
            "run `make control-plane` (hack/build-control-plane.sh)"
        )
    etcd = bin_dir / "etcd"
    if not etcd.is_file():
        found = shutil.which("etcd")
        if found is None:
            return None, "etcd not found: `apt-get install etcd-server`"
        etcd = Path(found)
    return Binaries(control_plane=cp, helm=helm, etcd=etcd), ""
